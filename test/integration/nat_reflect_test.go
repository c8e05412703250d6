// Masquerade table pressure from outside (issue 28 defect 1, hostile
// review): since every datagram a masquerading pod sends opens a flow, a
// host outside that makes a pod answer many datagrams makes it allocate.

package integration

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// TestMasqOutsideFloodKeepsOthers: a host on node A's link sends one UDP
// datagram from each of 64000 source ports of each of 3 addresses straight to a UDP echo service
// of masquerading pod e (routed to the pod's address, as any host of the
// node's segment can). Each answer opens a masqueraded flow, two cni_snat
// entries (LRU, 2 x 256 x maxPods). Masquerading pod v's idle TCP
// connection to an outside server must survive it: the server's next
// segment reaches v. Nothing the outsider sends should evict another pod's
// translation (conntrack, which does not translate these answers at all,
// keeps v's flow). Fails on nat-hardening 82548ff: v's entries are
// evicted and the server's segment is lost. IPv4 and IPv6.
func TestMasqOutsideFloodKeepsOthers(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	v, e := a.NewPod(), a.NewPod()
	a.CleanupDel(v, "v")
	a.CleanupDel(e, "e")
	a.Add(v, "v")
	e4, e6 := resultIPs(a.Add(e, "e"))
	brMAC, upMAC := linkMAC(t, lab.out, "br0"), linkMAC(t, a.Node, "uplink0")
	for _, fam := range []string{"udp4", "udp6"} {
		var pc net.PacketConn
		if err := e.Do(func(ns.NetNS) (err error) { pc, err = net.ListenPacket(fam, ":9999"); return }); err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		pc.(*net.UDPConn).SetReadBuffer(8 << 20)
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

	for _, c := range []struct {
		name         string
		srv, node, e net.IP
		port         int
		srcs         []net.IP
	}{
		{"v4", outsideIP, labNodeA, e4, 7304, []net.IP{outsideIP, net.ParseIP("192.0.2.1").To4(), net.ParseIP("192.0.2.2").To4()}},
		{"v6", outsideIP6, labNodeA6, e6, 7306, []net.IP{outsideIP6, net.ParseIP("2001:db8::1"), net.ParseIP("2001:db8::2")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cli, sc, _ := masqIdleConn(t, lab, v, c.srv, c.node, c.port)
			n := 0
			for _, src := range c.srcs {
				for lo := 1500; lo < 65500; lo += 4000 {
					var flood [][]byte
					for p := lo; p < lo+4000 && p < 65500; p++ {
						flood = append(flood, udpFrame(brMAC, upMAC, src, p, c.e, 9999, []byte("x")))
					}
					sendFrames(t, lab.out, "br0", flood)
					n += len(flood)
					time.Sleep(20 * time.Millisecond) // e keeps up: its answers are the flood
				}
			}
			time.Sleep(2 * time.Second)
			if flows, err := a.Maps().ListSNAT(); err == nil {
				t.Logf("masqueraded flows after the flood: %d", len(flows))
			}
			if _, err := sc.Write([]byte("pong\n")); err != nil {
				t.Fatal(err)
			}
			cli.SetReadDeadline(time.Now().Add(3 * time.Second))
			if got, err := bufio.NewReader(cli).ReadString('\n'); err != nil || got != "pong\n" {
				t.Errorf("pod v's idle connection after %d datagrams from outside to pod e: read %q, %v", n, got, err)
			}
		})
	}
}
