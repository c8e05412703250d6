// Interfaces of one pod: several interfaces per pod (added one after the
// other or at once), routes that conflict, another plugin's interface
// beside ours or under our name.

package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
	"github.com/vishvananda/netlink"
)

// podDefaults names the interface of the pod's default route per family.
func podDefaults(t *testing.T, pod ns.NetNS) (v4, v6 string) {
	t.Helper()
	pod.Do(func(ns.NetNS) error {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, _ := netlink.RouteList(nil, fam)
			for _, r := range rs {
				if r.Dst != nil {
					if ones, _ := r.Dst.Mask.Size(); ones != 0 {
						continue
					}
				}
				name := fmt.Sprintf("ifindex %d", r.LinkIndex)
				if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
					name = l.Attrs().Name
				}
				if fam == netlink.FAMILY_V4 {
					v4 += name + " "
				} else {
					v6 += name + " "
				}
			}
		}
		return nil
	})
	return strings.TrimSpace(v4), strings.TrimSpace(v6)
}

// podRules lists the pod's policy routing rules other than the kernel's own.
func podRules(t *testing.T, pod ns.NetNS) []string {
	t.Helper()
	var out []string
	pod.Do(func(ns.NetNS) error {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, _ := netlink.RuleList(fam)
			for _, r := range rs {
				if r.Table == 253 || r.Table == 254 || r.Table == 255 {
					continue // default, main, local
				}
				out = append(out, r.String())
			}
		}
		return nil
	})
	return out
}

// staticIPAM is the static IPAM plugin's config: no gateway, so ebpf-cni uses
// its fallback next hops (169.254.1.1, fe80::1) for every interface.
func staticIPAM(addrs ...string) map[string]any {
	var as []map[string]string
	for _, a := range addrs {
		as = append(as, map[string]string{"address": a})
	}
	return map[string]any{"type": "static", "addresses": as}
}

// TestIntegrityTwoInterfaces: eth0 and net1 of one pod from two ebpf-cni
// networks with the same next hop (169.254.1.1, fe80::1). Adding net1 keeps
// eth0's default routes; replies from each interface's address leave through
// it (else the other host veth would drop them as spoofed); DEL of net1
// leaves eth0 with all it had. Before, net1's ADD replaced eth0's default and
// gateway routes: the node could no longer reach eth0's address.
func TestIntegrityTwoInterfaces(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.IPAM = staticIPAM("10.250.0.10/24", "fd00:250::10/64")
	pod := e.NewPod()
	e.CleanupDel(pod, "multi")
	eth0 := e.AddAttachment(pod, "multi")
	stateB := t.TempDir()
	netB := e.NetList(testenv.RandName("netb"), map[string]any{
		"type": "ebpf-cni", "pinDir": e.PinDir, "stateDir": stateB,
		"ipam": staticIPAM("10.251.0.10/24", "fd00:251::10/64"),
	})
	rtB := &libcni.RuntimeConf{ContainerID: "multi", NetNS: pod.Path(), IfName: "net1"}
	t.Cleanup(func() { e.DelList(netB, rtB) })
	rB, err := e.AddList(netB, rtB)
	if err != nil {
		t.Fatalf("ADD net1: %v", err)
	}
	net1IPs := []net.IP{net.ParseIP("10.251.0.10"), net.ParseIP("fd00:251::10")}
	for _, r := range rB.Routes {
		if ones, _ := r.Dst.Mask.Size(); ones == 0 {
			t.Errorf("net1's result claims the pod's default route %s via %s, which stays eth0's", r.Dst.String(), r.GW)
		}
	}
	if v4, v6 := podDefaults(t, pod); v4 != "eth0" || v6 != "eth0" {
		t.Fatalf("pod default routes after net1's ADD: v4 %q, v6 %q; want eth0 only", v4, v6)
	}
	net1Idx := e.HostIfindex(state.HostIfName("multi", "net1"))
	m := e.Maps()
	both := func(when string) {
		t.Helper()
		// The node reaches both addresses: each reply leaves through its own
		// interface (counted on that host veth) and passes its checks.
		for _, ip := range eth0.IPs {
			if err := testenv.Ping(e.Node, ip, 2); err != nil {
				t.Errorf("%s: node to eth0's %s: %v", when, ip, err)
			}
		}
		before := counter(t, m, net1Idx, maps.DirEgress, maps.ReasonForward).Packets
		for _, ip := range net1IPs {
			if err := testenv.Ping(e.Node, ip, 2); err != nil {
				t.Errorf("%s: node to net1's %s: %v\n  net1: %s", when, ip, err, dumpCounters(m, net1Idx))
			}
		}
		if got := counter(t, m, net1Idx, maps.DirEgress, maps.ReasonForward).Packets - before; got < 4 {
			t.Errorf("%s: net1's host veth forwarded %d packets from the pod for 4 echo replies", when, got)
		}
		// Traffic the pod starts leaves by eth0, or by net1 from net1's address.
		if err := testenv.Ping(pod, testenv.NodeIP4, 2); err != nil {
			t.Errorf("%s: pod to node: %v", when, err)
		}
		if err := testenv.PingFrom(pod, net1IPs[0], testenv.NodeIP4, 2); err != nil {
			t.Errorf("%s: %v", when, err)
		}
		if err := testenv.PingFrom(pod, net1IPs[1], testenv.NodeIP6, 2); err != nil {
			t.Errorf("%s: %v", when, err)
		}
		if err := e.Check(pod, "multi", "eth0"); err != nil {
			t.Errorf("%s: CHECK eth0: %v", when, err)
		}
	}
	both("with eth0 and net1")
	if err := e.CheckList(netB, rtB); err != nil {
		t.Errorf("CHECK net1: %v", err)
	}
	rulesBoth := podRules(t, pod)

	if err := e.DelList(netB, rtB); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	if v4, v6 := podDefaults(t, pod); v4 != "eth0" || v6 != "eth0" {
		t.Errorf("pod default routes after net1's DEL: v4 %q, v6 %q; want eth0", v4, v6)
	}
	rules := podRules(t, pod)
	if len(rules) != 2 || len(rulesBoth) != 4 {
		t.Errorf("pod rules: %d with both interfaces (%v), %d after net1's DEL (%v); want 4 then eth0's 2", len(rulesBoth), rulesBoth, len(rules), rules)
	}
	for _, r := range rules {
		for _, ip := range net1IPs {
			if strings.Contains(r, ip.String()) {
				t.Errorf("net1's rule survived its DEL: %s", r)
			}
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(stateB, netB.Name)); len(ents) != 0 {
		t.Errorf("net1's DEL left records: %v", ents)
	}
	// Registered where the ADD recorded the pod's cookie: not without pacing
	// and SO_NETNS_COOKIE (both forced off in make test-fallback).
	if rec, err := e.Store().Read("multi", "eth0"); err != nil {
		t.Error(err)
	} else if _, err := testenv.LookupNetns(m, e.NetnsCookieOf(pod)); (err != nil) != (rec.NetnsCookie == 0) {
		t.Errorf("after net1's DEL: the pod's netns entry: %v, eth0's record holds cookie %d", err, rec.NetnsCookie)
	}
	for _, ip := range eth0.IPs {
		if err := testenv.Ping(e.Node, ip, 2); err != nil {
			t.Errorf("after net1's DEL: %v", err)
		}
	}
	if err := testenv.Ping(pod, testenv.NodeIP6, 2); err != nil {
		t.Errorf("after net1's DEL: %v", err)
	}
	if err := e.Check(pod, "multi", "eth0"); err != nil {
		t.Errorf("CHECK eth0 after net1's DEL: %v", err)
	}
	e.MustDel(pod, "multi")
	if r := podRules(t, pod); len(r) != 0 {
		t.Errorf("pod rules after both DELs: %v", r)
	}
	e.AssertClean()
}

// TestIntegrityInterfaceRouteConflict: two interfaces of one pod whose IPAM
// routes name the same destination. The second ADD is refused with code 7
// naming the route and the interface holding it, and the first keeps it.
func TestIntegrityInterfaceRouteConflict(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	route := []map[string]string{{"dst": "10.96.0.0/12"}}
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "routes": route,
		"ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}}
	pod := e.NewPod()
	e.CleanupDel(pod, "rc")
	eth0 := e.AddAttachment(pod, "rc")
	netB := e.NetList(testenv.RandName("netb"), map[string]any{
		"type": "ebpf-cni", "pinDir": e.PinDir, "stateDir": t.TempDir(),
		"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(), "routes": route,
			"ranges": [][]map[string]string{{{"subnet": "10.251.0.0/24"}}}},
	})
	rtB := &libcni.RuntimeConf{ContainerID: "rc", NetNS: pod.Path(), IfName: "net1"}
	t.Cleanup(func() { e.DelList(netB, rtB) })
	_, err := e.AddList(netB, rtB)
	libcniErr(t, "net1 with eth0's route", err, codeInvalidConfig, "10.96.0.0/12", "eth0")
	if err := e.DelList(netB, rtB); err != nil {
		t.Fatalf("DEL of the refused net1: %v", err)
	}
	var via string
	pod.Do(func(ns.NetNS) error {
		_, dst, _ := net.ParseCIDR("10.96.0.0/12")
		rs, _ := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
		for _, r := range rs {
			via += linkNameIn(r.LinkIndex) + " "
		}
		return nil
	})
	if strings.TrimSpace(via) != "eth0" {
		t.Errorf("10.96.0.0/12 in the pod goes via %q, want eth0", via)
	}
	if err := e.Check(pod, "rc", "eth0"); err != nil {
		t.Errorf("CHECK eth0: %v", err)
	}
	if err := testenv.Ping(e.Node, eth0.IPs[0], 2); err != nil {
		t.Error(err)
	}
	e.MustDel(pod, "rc")
	e.AssertClean()
}

// TestIntegrityOtherPluginInterface: the pod's other interface is another
// plugin's, as with Multus: ptp's eth0 (with its default route) and then
// ebpf-cni's net1, or ebpf-cni's eth0 and then a veth made by hand. ebpf-cni
// takes no default route and replaces no route of the other interface, and
// its own interface answers from its own address.
func TestIntegrityOtherPluginInterface(t *testing.T) {
	t.Parallel()
	t.Run("ptp eth0, ebpf-cni net1", func(t *testing.T) {
		t.Parallel()
		e := testenv.New(t)
		pod := e.NewPod()
		ptp := e.NetList(testenv.RandName("ptp"), map[string]any{
			"type": "ptp",
			"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(),
				"ranges": [][]map[string]string{{{"subnet": "10.253.0.0/24"}}},
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}}},
		})
		rtP := &libcni.RuntimeConf{ContainerID: "mixed", NetNS: pod.Path(), IfName: "eth0"}
		t.Cleanup(func() { e.DelList(ptp, rtP) })
		rP, err := e.AddList(ptp, rtP)
		if err != nil {
			t.Fatalf("ptp ADD: %v", err)
		}
		ptpIP := rP.IPs[0].Address.IP
		e.CleanupDel(pod, "mixed")
		rtE := e.RuntimeConf(pod, "mixed", "net1")
		var res types.Result
		err = e.InNode(func() error {
			var err error
			res, err = e.CNI.AddNetworkList(context.Background(), e.ConfList("1.1.0"), rtE)
			return err
		})
		if err != nil {
			t.Fatalf("ebpf-cni ADD of net1: %v", err)
		}
		r, _ := current.NewResultFromResult(res)
		v4, v6 := testenv.PodIPs(t, r)
		if d4, d6 := podDefaults(t, pod); d4 != "eth0" || d6 != "net1" {
			t.Fatalf("pod default routes: v4 %q, v6 %q; want ptp's eth0 for v4, net1 for v6 (eth0 has none)", d4, d6)
		}
		// ptp's eth0 still works (its default route is intact) ...
		if err := testenv.Ping(e.Node, ptpIP, 2); err != nil {
			t.Errorf("node to ptp's eth0 %s: %v", ptpIP, err)
		}
		// ... and so does net1, both ways, replies by net1.
		for _, ip := range []net.IP{v4, v6} {
			if err := testenv.Ping(e.Node, ip, 2); err != nil {
				t.Errorf("node to net1's %s: %v", ip, err)
			}
		}
		if err := testenv.PingFrom(pod, v4, testenv.NodeIP4, 2); err != nil {
			t.Error(err)
		}
		if err := e.Check(pod, "mixed", "net1"); err != nil {
			t.Errorf("CHECK net1: %v", err)
		}
		if err := e.Del(pod, "mixed", "net1"); err != nil {
			t.Fatal(err)
		}
		if d4, _ := podDefaults(t, pod); d4 != "eth0" {
			t.Errorf("ptp's default route after net1's DEL: %q", d4)
		}
		if err := testenv.Ping(e.Node, ptpIP, 2); err != nil {
			t.Errorf("ptp's eth0 after net1's DEL: %v", err)
		}
		if err := e.DelList(ptp, rtP); err != nil {
			t.Fatal(err)
		}
		e.AssertClean()
	})

	t.Run("ebpf-cni eth0, ptp net1", func(t *testing.T) {
		t.Parallel()
		e := testenv.New(t)
		pod := e.NewPod()
		e.CleanupDel(pod, "mixed2")
		a := e.AddAttachment(pod, "mixed2")
		ptp := e.NetList(testenv.RandName("ptp"), map[string]any{
			"type": "ptp",
			"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(),
				"ranges": [][]map[string]string{{{"subnet": "10.253.0.0/24"}}}},
		})
		rtP := &libcni.RuntimeConf{ContainerID: "mixed2", NetNS: pod.Path(), IfName: "net1"}
		t.Cleanup(func() { e.DelList(ptp, rtP) })
		rP, err := e.AddList(ptp, rtP)
		if err != nil {
			t.Fatalf("ptp ADD of net1: %v", err)
		}
		if d4, d6 := podDefaults(t, pod); d4 != "eth0" || d6 != "eth0" {
			t.Errorf("pod default routes with ptp's net1: %q %q, want eth0's", d4, d6)
		}
		e.PodReachable(t, pod, a.IPs)
		if err := testenv.Ping(e.Node, rP.IPs[0].Address.IP, 2); err != nil {
			t.Errorf("node to ptp's net1: %v", err)
		}
		if err := e.Check(pod, "mixed2", "eth0"); err != nil {
			t.Errorf("CHECK eth0 beside ptp's net1: %v", err)
		}
		if err := e.DelList(ptp, rtP); err != nil {
			t.Fatal(err)
		}
		e.PodReachable(t, pod, a.IPs)
		if err := e.Check(pod, "mixed2", "eth0"); err != nil {
			t.Errorf("CHECK eth0 after ptp's DEL of net1: %v", err)
		}
		e.MustDel(pod, "mixed2")
		e.AssertClean()
	})

	t.Run("ebpf-cni eth0, hand-made net1", func(t *testing.T) {
		t.Parallel()
		e := testenv.New(t)
		pod := e.NewPod()
		e.CleanupDel(pod, "byhand")
		a := e.AddAttachment(pod, "byhand")
		// net1: a veth pair with the peer in the node, an address and a
		// route of its own, as another plugin would leave it.
		peer := testenv.RandName("hand")
		err := e.InNode(func() error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer}, PeerName: "net1",
				PeerNamespace: netlink.NsFd(int(pod.Fd()))})
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.InNode(func() error { return deleteHostLink(peer) }) })
		err = pod.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("net1")
			if err != nil {
				return err
			}
			addr, _ := netlink.ParseAddr("10.254.0.2/24")
			if err := netlink.AddrAdd(l, addr); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		})
		if err != nil {
			t.Fatal(err)
		}
		if d4, d6 := podDefaults(t, pod); d4 != "eth0" || d6 != "eth0" {
			t.Errorf("pod default routes: %q %q, want eth0's", d4, d6)
		}
		e.PodReachable(t, pod, a.IPs)
		if err := e.Check(pod, "byhand", "eth0"); err != nil {
			t.Errorf("CHECK eth0 beside a hand-made net1: %v", err)
		}
		// DEL of eth0 keeps the hand-made interface.
		e.MustDel(pod, "byhand")
		pod.Do(func(ns.NetNS) error {
			if _, err := netlink.LinkByName("net1"); err != nil {
				t.Errorf("eth0's DEL removed the hand-made net1: %v", err)
			}
			return nil
		})
		e.AssertClean()
	})
}

// TestReviewConcurrentInterfaces: eth0 and net1 of one pod from two ebpf-cni
// networks, added at the same time (containerd's go-cni sets up the networks
// of a pod in parallel). Both ADDs succeed, as they do one after the other,
// and the pod has one default route per family, through one interface.
func TestReviewConcurrentInterfaces(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	netB := e.NetList(testenv.RandName("netb"), map[string]any{
		"type": "ebpf-cni", "pinDir": e.PinDir, "stateDir": t.TempDir(),
		"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(),
			"ranges": [][]map[string]string{{{"subnet": "10.251.0.0/24"}}, {{"subnet": "fd00:251::/64"}}}},
	})
	for i := 0; i < 6; i++ {
		pod := e.NewPod()
		id := testenv.RandName("multi")
		rtB := &libcni.RuntimeConf{ContainerID: id, NetNS: pod.Path(), IfName: "net1"}
		e.CleanupDel(pod, id)
		t.Cleanup(func() { e.DelList(netB, rtB) })
		errA, errB := make(chan error, 1), make(chan error, 1)
		go func() { _, err := e.AddV("1.1.0", pod, id, "eth0"); errA <- err }()
		go func() { _, err := e.AddList(netB, rtB); errB <- err }()
		if err := <-errA; err != nil {
			t.Errorf("round %d: ADD eth0 beside net1: %v", i, err)
		}
		if err := <-errB; err != nil {
			t.Errorf("round %d: ADD net1 beside eth0: %v", i, err)
		}
		v4, v6 := podDefaults(t, pod)
		if strings.Contains(v4, " ") || v4 == "" || strings.Contains(v6, " ") || v6 == "" || strings.HasPrefix(v6, "ifindex") {
			t.Errorf("round %d: pod default routes v4 %q, v6 %q; want one interface each", i, v4, v6)
		}
		if err := e.DelList(netB, rtB); err != nil {
			t.Errorf("round %d: DEL net1: %v", i, err)
		}
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Errorf("round %d: DEL eth0: %v", i, err)
		}
	}
	e.AssertClean()
}

// TestReviewIfnameTaken: the pod already has an eth0 of another plugin's
// making (a second network with the same ifname, a misconfigured runtime).
// ADD fails naming it and leaves nothing; the runtime's DEL of the failed
// ADD keeps the other eth0, its address and its routes.
func TestReviewIfnameTaken(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "taken")
	peer := testenv.RandName("hand")
	if err := e.InNode(func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer}, PeerName: "eth0",
			PeerNamespace: netlink.NsFd(int(pod.Fd()))})
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.InNode(func() error { return deleteHostLink(peer) }) })
	addr, _ := netlink.ParseAddr("10.254.0.2/24")
	if err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP("10.254.0.1")})
	}); err != nil {
		t.Fatal(err)
	}
	_, err := e.AddV("1.1.0", pod, "taken", "eth0")
	if err == nil {
		t.Fatal("ADD over the pod's existing eth0 succeeded")
	}
	t.Logf("ADD: %v", err)
	if !strings.Contains(err.Error(), "eth0") {
		t.Errorf("ADD's error does not name eth0: %v", err)
	}
	e.AssertNothingOf("taken")
	if err := e.Del(pod, "taken", "eth0"); err != nil {
		t.Errorf("DEL of the failed ADD: %v", err)
	}
	pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatalf("the other plugin's eth0 is gone: %v", err)
		}
		if as, _ := netlink.AddrList(l, netlink.FAMILY_V4); len(as) != 1 || !as[0].IP.Equal(addr.IP) {
			t.Errorf("the other eth0's addresses: %v", as)
		}
		if v4, _ := podDefaults(t, pod); v4 != "eth0" {
			t.Errorf("the pod's IPv4 default route: %q, want the other eth0's", v4)
		}
		return nil
	})
	e.AssertClean()
}
