// The stack-flow records of one pod cannot be flushed by another (issue 28
// defect 4; TestReviewReproStackFlowEviction was its reproducer, IPv4 only).

package integration

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// rawUDPFlood sends a UDP datagram from every source port in [30000, 70000)
// (mod 65536) to each of ports at dst, from netns with a raw socket: what an
// unprivileged pod does with many short flows, faster.
func rawUDPFlood(netns ns.NetNS, dst net.IP, ports []uint16) error {
	return netns.Do(func(ns.NetNS) error {
		fam, sa := syscall.AF_INET, syscall.Sockaddr(nil)
		if dst.To4() != nil {
			s := &syscall.SockaddrInet4{}
			copy(s.Addr[:], dst.To4())
			sa = s
		} else {
			fam = syscall.AF_INET6
			s := &syscall.SockaddrInet6{}
			copy(s.Addr[:], dst.To16())
			sa = s
		}
		fd, err := syscall.Socket(fam, syscall.SOCK_RAW, syscall.IPPROTO_UDP)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		if fam == syscall.AF_INET6 {
			// The kernel computes the UDP checksum (at offset 6).
			if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_CHECKSUM, 6); err != nil {
				return err
			}
		}
		u := make([]byte, 12)
		binary.BigEndian.PutUint16(u[4:], 12)
		for _, dport := range ports {
			for sport := 30000; sport < 70000; sport++ {
				binary.BigEndian.PutUint16(u[0:], uint16(sport%65536))
				binary.BigEndian.PutUint16(u[2:], dport)
				binary.BigEndian.PutUint16(u[6:], 0)
				if err := syscall.Sendto(fd, u, 0, sa); err != nil && err != syscall.ENOBUFS {
					return err
				}
			}
		}
		return nil
	})
}

// TestStackFlowFloodIsolated: pod x, with no privilege but a raw socket,
// sends UDP to a ClusterIP (kube-proxy nftables rules) from 40000 source
// ports to 2 ports: each is a flow the stack delivered to the Service's
// backend b. Pod a's idle TCP connection through another ClusterIP to b
// keeps its record, so b's next segment (the server speaks first) still
// goes back through conntrack's un-DNAT and reaches a. Before issue 28 the
// flood evicted a's record from the node-wide LRU (28160 entries at the
// default maxPods) and a got b's segment from b's own address, which its
// TCP dropped. IPv4 and IPv6.
func TestStackFlowFloodIsolated(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a, b, x := e.NewPod(), e.NewPod(), e.NewPod()
	for id, p := range map[string]ns.NetNS{"a": a, "b": b, "x": x} {
		e.CleanupDel(p, id)
	}
	e.Add(a, "a")
	b4, b6 := testenv.PodIPs(t, e.Add(b, "b"))
	e.Add(x, "x")
	for fam, bip := range map[int]net.IP{4: b4, 6: b6} {
		subnet, node := testenv.PodSubnet4, testenv.NodeIP4
		if fam == 6 {
			subnet, node = testenv.PodSubnet6, testenv.NodeIP6
		}
		restore(t, e.Node, "nft", nftRules(fam, subnet, []net.IP{node}, []svcPort{
			{name: "web", proto: "tcp", clusterIP: svcWeb[fam], port: 80, backend: bip, target: 8080},
			{name: "dns", proto: "udp", clusterIP: svcDNS[fam], port: 53, backend: bip, target: 5353},
			{name: "dns2", proto: "udp", clusterIP: svcDNS[fam], port: 54, backend: bip, target: 5354},
		}), "-f", "-")
	}
	// b answers every query (its answers look the records up, as a DNS
	// server's would).
	for _, port := range []string{":5353", ":5354"} {
		for _, fam := range []string{"udp4", "udp6"} {
			var pc net.PacketConn
			if err := b.Do(func(ns.NetNS) (err error) { pc, err = net.ListenPacket(fam, port); return }); err != nil {
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
	}

	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("v%d", fam), func(t *testing.T) {
			var ln net.Listener
			if err := b.Do(func(ns.NetNS) (err error) { ln, err = net.Listen(fmt.Sprintf("tcp%d", fam), ":8080"); return }); err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				if c, err := ln.Accept(); err == nil {
					accepted <- c
				}
			}()
			var cli net.Conn
			if err := a.Do(func(ns.NetNS) (err error) {
				cli, err = net.DialTimeout("tcp", hp(svcWeb[fam], 80), 5*time.Second)
				return
			}); err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			var srv net.Conn
			select {
			case srv = <-accepted:
			case <-time.After(5 * time.Second):
				t.Fatal("b accepted nothing")
			}
			defer srv.Close()

			if err := rawUDPFlood(x, svcDNS[fam], []uint16{53, 54}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
			flows, _ := e.Maps().StackFlows().List()
			t.Logf("stack-flow records after the flood: %d", len(flows))

			if _, err := srv.Write([]byte("pong\n")); err != nil {
				t.Fatal(err)
			}
			cli.SetReadDeadline(time.Now().Add(3 * time.Second))
			if got, err := bufio.NewReader(cli).ReadString('\n'); err != nil || got != "pong\n" {
				t.Errorf("a's idle connection through the ClusterIP after x's flood: read %q, %v", got, err)
			}
		})
	}
}

// TestStackFlowPartLifecycle: ADD gives the pod's host veth its own table
// of stack-flow records, DEL drops it, and the agent's reconcile drops a
// table whose veth is gone without a DEL (a killed ADD, a lost pod).
func TestStackFlowPartLifecycle(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := e.NewPod()
	e.CleanupDel(p, "p")
	e.Add(p, "p")
	_, idx := e.HostVeth("p")
	m := e.Maps()
	has := func(i int) bool {
		parts, err := m.StackFlows().Parts()
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range parts {
			if x == i {
				return true
			}
		}
		return false
	}
	if !has(idx) {
		t.Fatalf("no stack-flow table for the pod's host veth %d after ADD", idx)
	}
	if err := e.Del(p, "p", "eth0"); err != nil {
		t.Fatal(err)
	}
	if has(idx) {
		t.Errorf("the table of host veth %d outlived DEL", idx)
	}
	const gone = 999999 // no such link
	if err := m.StackFlows().AddPart(gone); err != nil {
		t.Fatal(err)
	}
	confDir := e.WriteConfDir()
	if out, err := e.AgentCmd(append([]string{"reconcile"}, e.AgentArgs(confDir)...)...); err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	if has(gone) {
		t.Errorf("reconcile left the table of ifindex %d, which has no link", gone)
	}
}

// TestReviewForgedICMPErrorKeepsStackFlows: pod x, which has nothing to do
// with a's connection through a ClusterIP to b, sends ICMP errors quoting a
// segment a -> b of that connection. The record that sends b's replies
// through the stack (so conntrack un-DNATs them) must survive: x may not
// delete another pod's records. Without it b's next segment bypasses
// conntrack, reaches a from b's own address, and a answers with a reset.
// IPv4 and IPv6.
func TestReviewForgedICMPErrorKeepsStackFlows(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a, b, x := e.NewPod(), e.NewPod(), e.NewPod()
	for id, p := range map[string]ns.NetNS{"a": a, "b": b, "x": x} {
		e.CleanupDel(p, id)
	}
	e.Add(a, "a")
	b4, b6 := testenv.PodIPs(t, e.Add(b, "b"))
	e.Add(x, "x")
	bIP := map[int]net.IP{4: b4, 6: b6}
	for _, fam := range []int{4, 6} {
		restore(t, e.Node, "nft", nftRules(fam, cluster[fam], []net.IP{nodeIP[fam]},
			[]svcPort{{name: "web", proto: "tcp", clusterIP: svcWeb[fam], port: 80, backend: bIP[fam], target: 8080}}), "-f", "-")
	}
	_, bIdx := e.HostVeth("b")
	for _, fam := range []int{4, 6} {
		network := fmt.Sprintf("tcp%d", fam)
		var ln net.Listener
		if err := b.Do(func(ns.NetNS) (err error) { ln, err = net.Listen(network, ":8080"); return }); err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			if c, err := ln.Accept(); err == nil {
				accepted <- c
			}
		}()
		var cli net.Conn
		if err := a.Do(func(ns.NetNS) (err error) {
			cli, err = net.DialTimeout(network, hp(svcWeb[fam], 80), 5*time.Second)
			return
		}); err != nil {
			t.Fatalf("a -> ClusterIP %s: %v", svcWeb[fam], err)
		}
		defer cli.Close()
		var srv net.Conn
		select {
		case srv = <-accepted:
		case <-time.After(5 * time.Second):
			t.Fatalf("IPv%d: b accepted nothing", fam)
		}
		defer srv.Close()
		if _, err := cli.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		srv.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := bufio.NewReader(srv).ReadString('\n'); err != nil {
			t.Fatalf("IPv%d: b read: %v", fam, err)
		}
		la := cli.LocalAddr().(*net.TCPAddr)
		record := func() bool {
			flows, err := e.Maps().StackFlows().List()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range flows {
				if f.Ifindex == bIdx && f.Peer.Addr().Unmap().String() == la.IP.String() && int(f.Peer.Port()) == la.Port {
					return true
				}
			}
			return false
		}
		if !record() {
			t.Fatalf("IPv%d: no stack flow recorded for b's replies to %s", fam, la)
		}

		// x knows (or guesses) the tuple and sprays errors about it at b.
		sendICMP(t, x, bIP[fam], forgedUnreach(la.IP, la.Port, bIP[fam], 8080), 20)
		time.Sleep(100 * time.Millisecond)
		if !record() {
			t.Errorf("IPv%d: pod x's forged ICMP errors deleted b's stack flow record", fam)
		}
		// b speaks first now: a must get it from the ClusterIP.
		if _, err := srv.Write([]byte("pong\n")); err != nil {
			t.Fatal(err)
		}
		cli.SetReadDeadline(time.Now().Add(3 * time.Second))
		if got, err := bufio.NewReader(cli).ReadString('\n'); err != nil || got != "pong\n" {
			t.Errorf("IPv%d: a's connection through the ClusterIP after x's forged errors: read %q, %v", fam, got, err)
		}
	}
}
