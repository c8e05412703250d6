//go:build review_repro

// Reproducers of defects the hostile review found and did not fix (see
// /work/notes/reports/review.md): they fail on this tree. Run with
// go test -tags review_repro -run TestReviewRepro ./test/integration/

package integration

import (
	"bufio"
	"encoding/binary"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestReviewReproStackFlowEviction: pod x, with no privilege, sends UDP to a
// ClusterIP from 40000 source ports to 2 ports. Each is a flow the stack delivered to
// the Service's backend b, so each takes an entry of the node-wide LRU
// cni_stack_flows (maxPods x 256: 28160 by default): a's idle connection through another ClusterIP to
// b loses its record, and b's next segment bypasses conntrack's un-DNAT.
func TestReviewReproStackFlowEviction(t *testing.T) {
	e := testenv.New(t)
	a, b, x := e.NewPod(), e.NewPod(), e.NewPod()
	for id, p := range map[string]ns.NetNS{"a": a, "b": b, "x": x} {
		e.CleanupDel(p, id)
	}
	e.Add(a, "a")
	b4, _ := testenv.PodIPs(t, e.Add(b, "b"))
	e.Add(x, "x")
	restore(t, e.Node, "nft", nftRules(4, testenv.PodSubnet4, []net.IP{testenv.NodeIP4}, []svcPort{
		{name: "web", proto: "tcp", clusterIP: svcWeb[4], port: 80, backend: b4, target: 8080},
		{name: "dns", proto: "udp", clusterIP: svcDNS[4], port: 53, backend: b4, target: 5353},
		{name: "dns2", proto: "udp", clusterIP: svcDNS[4], port: 54, backend: b4, target: 5354},
	}), "-f", "-")

	var ln net.Listener
	if err := b.Do(func(ns.NetNS) (err error) { ln, err = net.Listen("tcp4", ":8080"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	// b answers every query (its answers look the records up, as a DNS
	// server's would).
	for _, port := range []string{":5353", ":5354"} {
		var pc net.PacketConn
		if err := b.Do(func(ns.NetNS) (err error) { pc, err = net.ListenPacket("udp4", port); return }); err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		go func() {
			buf := make([]byte, 64)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(buf[:n], from)
			}
		}()
	}
	var cli net.Conn
	if err := a.Do(func(ns.NetNS) (err error) {
		cli, err = net.DialTimeout("tcp4", hp(svcWeb[4], 80), 5*time.Second)
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	srv := <-accepted
	defer srv.Close()

	// x: UDP from 80000 (source port, destination port) pairs to the DNS ClusterIP.
	err := x.Do(func(ns.NetNS) error {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_UDP)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		sa := &syscall.SockaddrInet4{}
		copy(sa.Addr[:], svcDNS[4].To4())
		u := make([]byte, 12)
		binary.BigEndian.PutUint16(u[4:], 12)
		for _, dport := range []uint16{53, 54} {
			for sport := 30000; sport < 70000; sport++ {
				binary.BigEndian.PutUint16(u[0:], uint16(sport%65536))
				binary.BigEndian.PutUint16(u[2:], dport)
				if err := syscall.Sendto(fd, u, 0, sa); err != nil && err != syscall.ENOBUFS {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	flows, _ := e.Maps().ListStackFlows()
	la := cli.LocalAddr().(*net.TCPAddr)
	kept := false
	for _, f := range flows {
		if f.Peer.Addr().String() == la.IP.String() && int(f.Peer.Port()) == la.Port {
			kept = true
		}
	}
	t.Logf("cni_stack_flows holds %d entries after the flood; a's record kept: %v", len(flows), kept)

	if _, err := srv.Write([]byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	cli.SetReadDeadline(time.Now().Add(3 * time.Second))
	if got, err := bufio.NewReader(cli).ReadString('\n'); err != nil || got != "pong\n" {
		t.Errorf("a's idle connection through the ClusterIP after x's flood: read %q, %v", got, err)
	}
}

// TestReviewReproForwardRulesBypassed: the node's firewall says pod a may not
// reach pod b (a FORWARD drop, as an iptables NetworkPolicy engine such as
// kube-router writes them; with ptp it holds). Same-node pod-to-pod traffic
// is redirected into b before netfilter sees it.
func TestReviewReproForwardRulesBypassed(t *testing.T) {
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	for id, p := range map[string]ns.NetNS{"a": a, "b": b} {
		e.CleanupDel(p, id)
	}
	a4, _ := testenv.PodIPs(t, e.Add(a, "a"))
	b4, _ := testenv.PodIPs(t, e.Add(b, "b"))
	restore(t, e.Node, "iptables-nft-restore", "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -s "+a4.String()+"/32 -d "+b4.String()+"/32 -j DROP\nCOMMIT\n")
	if err := testenv.Ping(a, b4, 2); err == nil {
		t.Errorf("pod a reached pod b despite the node's FORWARD rule dropping a -> b")
	}
}
