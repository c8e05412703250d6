// Masquerade table pressure (issue 28 defect 1, hostile review): every
// datagram a masquerading pod sends opens a flow, so a host outside that
// makes a pod answer many datagrams makes it allocate, as does a pod
// sending to many destinations itself. Neither may evict another pod's flow
// from cni_snat.

package integration

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// podFlows is what cni_masq_pods holds for the pod with address ip.
func podFlows(t *testing.T, a *testenv.Env, ip net.IP) maps.MasqPodFlows {
	t.Helper()
	eps, err := a.Maps().ListEndpoints()
	if err != nil {
		t.Fatal(err)
	}
	idx := 0
	for _, e := range eps {
		if e.IP.Equal(ip) {
			idx = int(e.Info.Ifindex)
		}
	}
	pods, err := a.Maps().ListMasqPods()
	if err != nil {
		t.Fatal(err)
	}
	if idx == 0 {
		t.Fatalf("no endpoint has %s", ip)
	}
	for _, p := range pods {
		if p.Ifindex == idx {
			return p
		}
	}
	return maps.MasqPodFlows{Ifindex: idx} // no flow yet
}

// TestMasqOutsideFloodKeepsOthers: masquerading pod v has an idle TCP
// connection to an outside server; then 192000 masqueraded flows are
// opened through masquerading pod e, two cni_snat entries each (the table
// holds 56320 at the defaults):
//
//   - "outside": a host on node A's link sends one UDP datagram from each
//     of 64000 source ports of each of 3 addresses (spoofed) straight to
//     e's UDP echo service (routed to the pod's address, as any host of
//     the segment can); each answer opens a flow;
//   - "pod": e itself sends a datagram to each of those 192000 addresses
//     and ports.
//
// v's connection must survive it: the server's next segment reaches v
// (conntrack, which does not translate the answers at all, keeps v's
// flow). e holds at most its quota (cni_masq_quota's pod max) and the
// flows past it are counted as drops. Failed on nat-hardening 82548ff
// and on main a765956 ("outside": v's entries were evicted by the LRU and
// the server's segment was lost, 42114 flows left after the flood). IPv4
// and IPv6.
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
	q, err := a.Maps().MasqQuota()
	if err != nil || q.PodMax == 0 {
		t.Fatalf("cni_masq_quota: %+v, %v; want it written when the maps were pinned", q, err)
	}
	t.Logf("quota: %+v", q)

	port := 7304
	for _, c := range []struct {
		name, fam    string
		srv, node, e net.IP
		srcs         []net.IP
	}{
		{"v4", "udp4", outsideIP, labNodeA, e4, []net.IP{outsideIP, net.ParseIP("192.0.2.1").To4(), net.ParseIP("192.0.2.2").To4()}},
		{"v6", "udp6", outsideIP6, labNodeA6, e6, []net.IP{outsideIP6, net.ParseIP("2001:db8::1"), net.ParseIP("2001:db8::2")}},
	} {
		for _, from := range []string{"outside", "pod"} {
			port++
			t.Run(c.name+"/"+from, func(t *testing.T) {
				cli, sc, _ := masqIdleConn(t, lab, v, c.srv, c.node, port)
				before := podFlows(t, a, c.e)
				n := 0
				if from == "outside" {
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
				} else {
					var pc net.PacketConn
					if err := e.Do(func(ns.NetNS) (err error) { pc, err = net.ListenPacket(c.fam, ":0"); return }); err != nil {
						t.Fatal(err)
					}
					defer pc.Close()
					for _, dst := range c.srcs {
						for p := 1500; p < 65500; p++ {
							if _, err := pc.WriteTo([]byte("x"), &net.UDPAddr{IP: dst, Port: p}); err == nil {
								n++
							}
							if p%4000 == 0 {
								time.Sleep(20 * time.Millisecond) // the qdisc keeps up
							}
						}
					}
				}
				time.Sleep(2 * time.Second)
				after := podFlows(t, a, c.e)
				flows, _ := a.Maps().ListSNAT()
				t.Logf("%d datagrams: %d masqueraded flows on the node; pod e holds %d flows (before: %d), %d refused for its quota",
					n, len(flows), after.Flows, before.Flows, after.Drops-before.Drops)
				if after.Flows > int(q.PodMax) {
					t.Errorf("pod e holds %d flows, its quota is %d", after.Flows, q.PodMax)
				}
				if after.Drops == before.Drops {
					t.Errorf("no flow of e refused for its quota after %d datagrams", n)
				}
				if _, err := sc.Write([]byte("pong\n")); err != nil {
					t.Fatal(err)
				}
				cli.SetReadDeadline(time.Now().Add(3 * time.Second))
				if got, err := bufio.NewReader(cli).ReadString('\n'); err != nil || got != "pong\n" {
					t.Errorf("pod v's idle connection after %d datagrams %s: read %q, %v", n, map[string]string{"outside": "from outside to pod e", "pod": "from pod e to outside"}[from], got, err)
				}
			})
		}
	}
}
