// Masquerade table pressure (issue 28 defect 1, hostile review): every
// datagram a masquerading pod sends opens a flow, so a host outside that
// makes a pod answer many datagrams makes it allocate, as does a pod
// sending to many destinations itself. Neither may evict another pod's flow
// from cni_snat.
// The quota's maps added by an upgrade within map layout 3 (cni_masq_pods,
// cni_masq_quota, cni_masq_keys joined the pin set an older build left).

package integration

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// podFlows is what cni_masq_pods holds for the pod with address ip.
func podFlows(t *testing.T, a *testenv.Env, ip net.IP) maps.MasqPodFlows {
	t.Helper()
	eps, err := a.Maps().Endpoints().List()
	if err != nil {
		t.Fatal(err)
	}
	idx := 0
	for _, e := range eps {
		if e.IP.Equal(ip) {
			idx = int(e.Info.Ifindex)
		}
	}
	pods, err := a.Maps().Masq().ListPods()
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
	q, err := a.Maps().Masq().Quota()
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
				flows, _ := a.Maps().Masq().ListSNAT()
				t.Logf("%d datagrams: %d masqueraded flows on the node; pod e holds %d flows (before: %d), %d refused for its quota",
					n, len(flows), after.Flows, before.Flows, after.Drops-before.Drops)
				if after.Flows > int(q.PodMax) {
					t.Errorf("pod e holds %d flows, its quota is %d", after.Flows, q.PodMax)
				}
				if after.Drops == before.Drops {
					t.Errorf("no flow of e refused for its quota after %d datagrams", n)
				}
				if from == "pod" && c.name == "v6" {
					// What dump nat shows of it: e's flows, at most its quota, and the refusals.
					js, err := a.MasqAgent("dump", "nat", "-o", "json")
					if err != nil {
						t.Fatal(err)
					}
					var d inspect.NATDump
					if err := json.Unmarshal(js, &d); err != nil {
						t.Fatal(err)
					}
					found := false
					for _, r := range d.Quota.Pods {
						if r.Ifindex == after.Ifindex {
							found = r.Flows <= int(d.Quota.PodMax) && r.Refused > 0 && r.Interface != ""
						}
					}
					if !found || d.Quota.PodMax != q.PodMax || d.Quota.Total < after.Flows {
						t.Errorf("dump nat's quota: %+v; want pod e (ifindex %d) with at most %d flows and refusals", d.Quota, after.Ifindex, q.PodMax)
					}
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

// TestMasqFloodTwoPodsReserve attacks the quota itself: a host outside
// floods two masquerading pods' UDP echo services (64000 spoofed source
// ports each), so together they take the whole pool (each holds at most
// its reserve and half the pool). Then the node's total is at the pool and
// pod v, under its reserve, must still open a new connection to the server
// outside, and its idle one must survive. IPv4 and IPv6.
func TestMasqFloodTwoPodsReserve(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	v, e1, e2 := a.NewPod(), a.NewPod(), a.NewPod()
	a.CleanupDel(v, "v")
	a.CleanupDel(e1, "e1")
	a.CleanupDel(e2, "e2")
	a.Add(v, "v")
	e14, e16 := resultIPs(a.Add(e1, "e1"))
	e24, e26 := resultIPs(a.Add(e2, "e2"))
	brMAC, upMAC := linkMAC(t, lab.out, "br0"), linkMAC(t, a.Node, "uplink0")
	for _, pod := range []ns.NetNS{e1, e2} {
		for _, fam := range []string{"udp4", "udp6"} {
			var pc net.PacketConn
			if err := pod.Do(func(ns.NetNS) (err error) { pc, err = net.ListenPacket(fam, ":9999"); return }); err != nil {
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
	}
	q, err := a.Maps().Masq().Quota()
	if err != nil || q.PodMax == 0 {
		t.Fatalf("cni_masq_quota: %+v, %v", q, err)
	}
	for _, c := range []struct {
		name         string
		srv, node    net.IP
		targets, src []net.IP
		port         int
	}{
		{"v4", outsideIP, labNodeA, []net.IP{e14, e24}, []net.IP{net.ParseIP("192.0.2.7").To4()}, 7311},
		{"v6", outsideIP6, labNodeA6, []net.IP{e16, e26}, []net.IP{net.ParseIP("2001:db8::7")}, 7313},
	} {
		t.Run(c.name, func(t *testing.T) {
			cli, sc, _ := masqIdleConn(t, lab, v, c.srv, c.node, c.port)
			for _, dst := range c.targets {
				for lo := 1500; lo < 65500; lo += 4000 {
					var flood [][]byte
					for p := lo; p < lo+4000 && p < 65500; p++ {
						flood = append(flood, udpFrame(brMAC, upMAC, c.src[0], p, dst, 9999, []byte("x")))
					}
					sendFrames(t, lab.out, "br0", flood)
					time.Sleep(20 * time.Millisecond)
				}
			}
			time.Sleep(time.Second)
			pods, err := a.Maps().Masq().ListPods()
			if err != nil {
				t.Fatal(err)
			}
			total := 0
			for _, p := range pods {
				if p.Ifindex == 0 {
					total = p.Flows
				}
			}
			t.Logf("after the flood: %+v (quota %+v)", pods, q)
			if total < int(q.Pool) {
				t.Fatalf("the node holds %d flows, under the pool %d: the attack did not take the pool", total, q.Pool)
			}
			if total > int(q.Pool)+2*maps.SizingOf(a.Maps()).MaxPods*int(q.Reserve) {
				t.Errorf("the node holds %d flows, more than pool %d and every reserve", total, q.Pool)
			}
			// v, under its reserve, opens a new connection.
			cli2, sc2, _ := masqIdleConn(t, lab, v, c.srv, c.node, c.port+1)
			if _, err := sc2.Write([]byte("new\n")); err != nil {
				t.Fatal(err)
			}
			cli2.SetReadDeadline(time.Now().Add(3 * time.Second))
			if got, err := bufio.NewReader(cli2).ReadString('\n'); err != nil || got != "new\n" {
				t.Errorf("pod v's new connection with the pool taken: read %q, %v", got, err)
			}
			if _, err := sc.Write([]byte("pong\n")); err != nil {
				t.Fatal(err)
			}
			cli.SetReadDeadline(time.Now().Add(3 * time.Second))
			if got, err := bufio.NewReader(cli).ReadString('\n'); err != nil || got != "pong\n" {
				t.Errorf("pod v's idle connection after two pods were flooded: read %q, %v", got, err)
			}
		})
	}
}

// TestMasqQuotaAgentKilled: the agent is killed (SIGKILL) in the middle of
// a flood from outside to pod e's UDP service, then started again. The
// quota is the one written when the maps were pinned (a restart does not
// rewrite it), e holds at most its quota, pod v's idle connection survives,
// and e's DEL takes its count off the node's total. IPv4 and IPv6.
func TestMasqQuotaAgentKilled(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	conf := a.WriteConfDir()
	ag := a.StartAgent(conf)
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
	q, err := a.Maps().Masq().Quota()
	if err != nil || q.PodMax == 0 {
		t.Fatalf("cni_masq_quota: %+v, %v", q, err)
	}
	for _, c := range []struct {
		name      string
		srv, node net.IP
		e, src    net.IP
		port      int
	}{
		{"v4", outsideIP, labNodeA, e4, net.ParseIP("192.0.2.9").To4(), 7321},
		{"v6", outsideIP6, labNodeA6, e6, net.ParseIP("2001:db8::9"), 7323},
	} {
		t.Run(c.name, func(t *testing.T) {
			cli, sc, _ := masqIdleConn(t, lab, v, c.srv, c.node, c.port)
			for lo := 1500; lo < 65500; lo += 4000 {
				if lo == 17500 {
					ag.Cmd.Process.Signal(syscall.SIGKILL)
					ag.Exited(5 * time.Second)
				}
				if lo == 33500 {
					ag = a.StartAgent(conf)
				}
				var flood [][]byte
				for p := lo; p < lo+4000 && p < 65500; p++ {
					flood = append(flood, udpFrame(brMAC, upMAC, c.src, p, c.e, 9999, []byte("x")))
				}
				sendFrames(t, lab.out, "br0", flood)
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(time.Second)
			if got, err := a.Maps().Masq().Quota(); err != nil || got != q {
				t.Errorf("cni_masq_quota after the agent's restart: %+v, %v; want %+v", got, err, q)
			}
			if got := podFlows(t, a, c.e); got.Flows > int(q.PodMax) || got.Flows == 0 {
				t.Errorf("pod e holds %d flows, want 1 to %d", got.Flows, q.PodMax)
			}
			if _, err := sc.Write([]byte("pong\n")); err != nil {
				t.Fatal(err)
			}
			cli.SetReadDeadline(time.Now().Add(3 * time.Second))
			if got, err := bufio.NewReader(cli).ReadString('\n'); err != nil || got != "pong\n" {
				t.Errorf("pod v's idle connection: read %q, %v", got, err)
			}
		})
	}
	before := podFlows(t, a, e4)
	if err := a.Del(e, "e", "eth0"); err != nil {
		t.Fatal(err)
	}
	pods, err := a.Maps().Masq().ListPods()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.Ifindex == before.Ifindex {
			t.Errorf("pod e's count stays after its DEL: %+v", p)
		}
		if p.Ifindex == 0 && p.Flows > 16 {
			t.Errorf("the node holds %d flows after e's DEL (e held %d; v a few)", p.Flows, before.Flows)
		}
	}
}

// TestMasqQuotaUpgradeWithinLayout: masquerading pods v and x attached by
// the build before the quota, v with an idle TCP connection to a server
// outside. This build's first verb is x's DEL (on a pin set without the
// quota maps: it must tear x down, not take the node for never set up);
// then its first ADD (pod w) pins the quota maps and writes the quota;
// v's connection, whose flow the older programs opened and nobody
// counted, survives the upgrade, and w's masqueraded flow is counted.
func TestMasqQuotaUpgradeWithinLayout(t *testing.T) {
	oldBin := testenv.BuildAt(t, preQuotaCommit)
	lab := newMasqLab(t)
	a := lab.a
	newCNI := a.CNI
	a.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, a.CacheDir, nil)
	v, x, w := a.NewPod(), a.NewPod(), a.NewPod()
	a.CleanupDel(v, "v")
	a.CleanupDel(x, "x")
	a.CleanupDel(w, "w")
	a.Add(v, "v")
	a.Add(x, "x")
	dir := datapath.MapsDir(a.PinDir)
	if _, err := os.Stat(filepath.Join(dir, "cni_masq_quota")); !os.IsNotExist(err) {
		t.Fatalf("the build before the quota pinned cni_masq_quota: %v", err)
	}
	cli, sc, _ := masqIdleConn(t, lab, v, outsideIP, labNodeA, 7331)

	a.CNI = newCNI
	if err := a.Del(x, "x", "eth0"); err != nil {
		t.Fatalf("this build's DEL of a pod of the build before the quota: %v", err)
	}
	if a.NodeLinkExists(state.HostIfName("x", "eth0")) {
		t.Errorf("x's host veth stays after this build's DEL")
	}
	w4, _ := resultIPs(a.Add(w, "w"))
	q, err := a.Maps().Masq().Quota()
	if err != nil || q.PodMax == 0 {
		t.Fatalf("cni_masq_quota after this build's first ADD: %+v, %v", q, err)
	}
	masqSourcePorts(t, lab, w, 7333, 1024, 65535)
	if got := podFlows(t, a, w4); got.Flows < 2 {
		t.Errorf("pod w's flows (one per family) are not counted: %+v", got)
	}

	time.Sleep(time.Second)
	if _, err := sc.Write([]byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	cli.SetReadDeadline(time.Now().Add(3 * time.Second))
	if got, err := bufio.NewReader(cli).ReadString('\n'); err != nil || got != "pong\n" {
		t.Errorf("pod v's idle connection across the upgrade: read %q, %v", got, err)
	}
}

// preQuotaCommit is main before the masquerade quota (map layout 3 without
// its maps).
const preQuotaCommit = "a7659561026d66c6672e13ef911ddfff8f9ec644"
