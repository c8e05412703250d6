// Masquerade (ipMasq) between two nodes and an outside host, and CHECK of a
// masquerading pod.

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// The masquerade lab: two nodes whose uplinks sit on one L2 segment (a
// bridge in the "outside" netns, which is also the nodes' default gateway)
// and a server behind it on outsideIP (outsideIP6). The outside has no route
// to any pod: a reply reaches a pod only if its request was masqueraded.
// Both families; the pods are dual-stack.
var (
	labGW      = net.ParseIP("203.0.113.254").To4()
	labNodeA   = net.ParseIP("203.0.113.1").To4()
	labNodeB   = net.ParseIP("203.0.113.2").To4()
	outsideIP  = net.ParseIP("198.18.0.1").To4()
	labGW6     = net.ParseIP("fd00:203::fe")
	labNodeA6  = net.ParseIP("fd00:203::1")
	labNodeB6  = net.ParseIP("fd00:203::2")
	outsideIP6 = net.ParseIP("fd00:198::1")
)

const (
	labCluster  = "10.250.0.0/16"
	labPodsA    = "10.250.0.0/24" // = podSubnet4, the default IPAM range
	labPodsB    = "10.250.1.0/24"
	labCluster6 = "fd00:250::/32" // holds both nodes' /64s (a /48 held only A's: fd00:250:1:: is outside fd00:250::/48)
	labPodsA6   = "fd00:250::/64" // = podSubnet6
	labPodsB6   = "fd00:250:1::/64"
	masqSrcPort = 62000 // in the SNAT range: the first pod keeps it, the second collides
)

type masqLab struct {
	a, b *testenv.Env
	out  ns.NetNS
}

func labAddr(l netlink.Link, cidr string) error {
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	a.Flags = unix.IFA_F_NODAD
	return netlink.AddrAdd(l, a)
}

// newShareLab is newMasqLab with node ports from portRange ("first-last")
// and ipMasqPodPortLimit 8: the lab of the tests of a pod's share of ports
// towards one destination.
func newShareLab(t *testing.T, portRange string) *masqLab {
	lab := newMasqLab(t)
	lab.a.Extra["ipMasqPortRange"] = portRange
	lab.a.Extra["ipMasqPodPortLimit"] = 8
	return lab
}

func newMasqLab(t *testing.T) *masqLab {
	t.Helper()
	out := testenv.NewNS(t)
	err := out.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		if err := labAddr(lo, outsideIP.String()+"/32"); err != nil {
			return err
		}
		if err := labAddr(lo, outsideIP6.String()+"/128"); err != nil {
			return err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge: %w", err)
		}
		if err := labAddr(br, labGW.String()+"/24"); err != nil {
			return err
		}
		if err := labAddr(br, labGW6.String()+"/64"); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(br); err != nil {
			return err
		}
		// The servers' unconnected UDP replies must come from outsideIP, the
		// address the pods dialled, not from the bridge's.
		_, seg, _ := net.ParseCIDR(labGW.String() + "/24")
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: br.Attrs().Index, Dst: seg, Src: outsideIP, Scope: netlink.SCOPE_LINK, Protocol: unix.RTPROT_KERNEL}); err != nil {
			return err
		}
		_, seg6, _ := net.ParseCIDR(labGW6.String() + "/64")
		return netlink.RouteReplace(&netlink.Route{LinkIndex: br.Attrs().Index, Dst: seg6, Src: outsideIP6, Protocol: unix.RTPROT_KERNEL, Priority: 256})
	})
	if err != nil {
		t.Fatalf("outside netns: %v", err)
	}
	lab := &masqLab{out: out}
	mk := func(peerName string, up, up6 net.IP, ipam map[string]any) *testenv.Env {
		e := testenv.New(t)
		e.Extra = map[string]any{
			"ipMasq":       true,
			"clusterCIDRs": []string{labCluster, labCluster6},
			"capabilities": map[string]bool{"portMappings": true},
		}
		e.IPAM = ipam
		err := e.InNode(func() error {
			veth := &netlink.Veth{
				LinkAttrs: netlink.LinkAttrs{Name: "uplink0"},
				PeerName:  peerName, PeerNamespace: netlink.NsFd(int(out.Fd())),
			}
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("add uplink veth: %w", err)
			}
			l, err := netlink.LinkByName("uplink0")
			if err != nil {
				return err
			}
			if err := labAddr(l, up.String()+"/24"); err != nil {
				return err
			}
			if err := labAddr(l, up6.String()+"/64"); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: labGW6}); err != nil {
				return err
			}
			return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: labGW})
		})
		if err != nil {
			t.Fatalf("node uplink: %v", err)
		}
		err = out.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(peerName)
			if err != nil {
				return err
			}
			br, err := netlink.LinkByName("br0")
			if err != nil {
				return err
			}
			if err := netlink.LinkSetMaster(l, br); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		})
		if err != nil {
			t.Fatalf("outside port %s: %v", peerName, err)
		}
		return e
	}
	lab.a = mk("a0", labNodeA, labNodeA6, nil)
	lab.b = mk("b0", labNodeB, labNodeB6, nil)
	lab.b.IPAM = map[string]any{
		"type": "host-local", "dataDir": lab.b.DataDir,
		"ranges": [][]map[string]string{{{"subnet": labPodsB}}, {{"subnet": labPodsB6}}},
	}
	// The outside host and the nodes stand for machines long up: their
	// link-local addresses are usable before any traffic. Without this, on
	// a fast run the outside host's first IPv6 datagrams to a node waited
	// in its neighbour queue until br0's link-local left DAD (a
	// solicitation needs it) and then arrived in one burst, whose last
	// datagrams overflowed the echo server's receive buffer: the 2-4 IPv6
	// datagrams "lost during the upgrade" (numbers 257 on: 256 fit the
	// buffer), counted as Udp6RcvbufErrors in the pod, before any upgrade
	// step.
	for _, n := range []ns.NetNS{lab.out, lab.a.Node, lab.b.Node} {
		testenv.WaitIPv6Ready(t, n)
	}
	return lab
}

func v4Of(t *testing.T, r *current.Result) net.IP {
	t.Helper()
	for _, ipc := range r.IPs {
		if ipc.Address.IP.To4() != nil {
			return ipc.Address.IP.To4()
		}
	}
	t.Fatalf("result has no IPv4 address: %+v", r.IPs)
	return nil
}

// askFrom is askTCP / askUDP from a fixed local port (0: any).
func askFrom(netns ns.NetNS, proto, addr string, lport int) (answer, error) {
	var a answer
	fam := "4"
	if h, _, _ := net.SplitHostPort(addr); net.ParseIP(h).To4() == nil {
		fam = "6"
	}
	err := netns.Do(func(ns.NetNS) error {
		if proto == "tcp" {
			d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{Port: lport}}
			c, err := d.Dial("tcp"+fam, addr)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return fmt.Errorf("read answer: %w", err)
			}
			a, err = parseAnswer(line)
			return err
		}
		raddr, err := net.ResolveUDPAddr("udp"+fam, addr)
		if err != nil {
			return err
		}
		c, err := net.ListenUDP("udp"+fam, &net.UDPAddr{Port: lport})
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 2048)
		for try := 0; try < 3; try++ {
			if _, err := c.WriteToUDP([]byte("ping"), raddr); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			n, from, err := c.ReadFromUDP(buf)
			if err != nil {
				continue
			}
			if a, err = parseAnswer(string(buf[:n])); err != nil {
				return err
			}
			a.from = from.String()
			return nil
		}
		return fmt.Errorf("no answer")
	})
	if err != nil {
		return a, fmt.Errorf("%s to %s from port %d: %w", proto, addr, lport, err)
	}
	return a, nil
}

// mustAsk asks and checks who answered and which address the server saw;
// it returns the port the server saw.
func mustAsk(t *testing.T, from ns.NetNS, proto, addr string, lport int, server string, wantPeer net.IP) int {
	t.Helper()
	a, err := askFrom(from, proto, addr, lport)
	if err != nil {
		t.Fatal(err)
	}
	if a.server != server {
		t.Fatalf("%s %s answered by %q, want %q", proto, addr, a.server, server)
	}
	if a.from != "" && a.from != addr {
		t.Fatalf("%s reply came from %s, want %s", proto, a.from, addr)
	}
	host, port, err := net.SplitHostPort(a.peer)
	if err != nil {
		t.Fatalf("server saw %q: %v", a.peer, err)
	}
	if !net.ParseIP(host).Equal(wantPeer) {
		t.Fatalf("%s %s: server saw the client as %s, want %s", proto, addr, a.peer, wantPeer)
	}
	var p int
	fmt.Sscan(port, &p)
	return p
}

// TestMasq: pods on node A reach the outside with A's address (TCP, UDP,
// ping), two pods using one source port both work, pod A <-> pod B goes
// over host-gw routes unmasqueraded, a hostPort on A answers a pod on B,
// dump nat shows the flows, no iptables rule appears, and DEL removes the
// pod's entries.
func TestMasq(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a, b := lab.a, lab.b
	rulesA, rulesB := rulesets(t, a.Node), rulesets(t, b.Node)

	// The lab's pod CIDRs are inside its cluster CIDRs.
	for _, c := range [][2]string{{labCluster, labPodsA}, {labCluster, labPodsB}, {labCluster6, labPodsA6}, {labCluster6, labPodsB6}} {
		cl, p := netip.MustParsePrefix(c[0]), netip.MustParsePrefix(c[1])
		if !cl.Contains(p.Addr()) || cl.Bits() > p.Bits() {
			t.Errorf("the lab's cluster CIDR %s does not hold its pod CIDR %s", cl, p)
		}
	}
	// host-gw: each node gets the list of both; a node skips itself.
	peers := filepath.Join(t.TempDir(), "peers.json")
	pj, _ := json.Marshal([]agent.Peer{
		{NodeIP: labNodeA.String(), NodeIPs: []string{labNodeA6.String()}, PodCIDRs: []string{labPodsA, labPodsA6}},
		{NodeIP: labNodeB.String(), NodeIPs: []string{labNodeB6.String()}, PodCIDRs: []string{labPodsB, labPodsB6}},
	})
	if err := os.WriteFile(peers, pj, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*testenv.Env{a, b} {
		out, err := e.MasqAgent("peers", "--peers", peers)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(strings.TrimSpace(string(out)), "\n") + 1; n != 2 {
			t.Fatalf("peers installed %d routes, want 2 (the other node's, each family):\n%s", n, out)
		}
	}

	pa1, pa2, pb1 := a.NewPod(), a.NewPod(), b.NewPod()
	a.CleanupDel(pa1, "a1")
	ra1 := a.Add(pa1, "a1")
	ra2 := a.MustAddHP(pa2, "a2", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "udp"})
	b.CleanupDel(pb1, "b1")
	rb1 := b.Add(pb1, "b1")
	a1, a2, b1 := v4Of(t, ra1), v4Of(t, ra2), v4Of(t, rb1)
	_, a16 := testenv.PodIPs(t, ra1)
	_, b16 := testenv.PodIPs(t, rb1)

	serve(t, lab.out, 7000, "outside")
	serve(t, pb1, 7001, "b1")
	serve(t, pa2, 80, "a2")
	out := hp(outsideIP, 7000)

	t.Run("outside", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			mustAsk(t, pa1, proto, out, 0, "outside", labNodeA)
			mustAsk(t, pb1, proto, out, 0, "outside", labNodeB)
		}
		if err := testenv.Ping(pa1, outsideIP, 3); err != nil {
			t.Fatal(err)
		}
		if err := testenv.Ping(pb1, outsideIP, 2); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("collision", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			p1 := mustAsk(t, pa1, proto, out, masqSrcPort, "outside", labNodeA)
			p2 := mustAsk(t, pa2, proto, out, masqSrcPort, "outside", labNodeA)
			if p1 != masqSrcPort {
				t.Errorf("%s: first pod's port %d became %d, want it kept", proto, masqSrcPort, p1)
			}
			if p2 == p1 {
				t.Errorf("%s: both pods left from port %d", proto, p1)
			}
			// Both flows stay usable (the entries are per flow, not per port).
			mustAsk(t, pa1, proto, out, masqSrcPort+1, "outside", labNodeA)
		}
	})
	t.Run("pod-to-pod-across-nodes", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			mustAsk(t, pa1, proto, hp(b1, 7001), 0, "b1", a1)
		}
		if err := testenv.Ping(pa1, b1, 2); err != nil {
			t.Fatal(err)
		}
		if err := testenv.Ping(pb1, a1, 2); err != nil {
			t.Fatal(err)
		}
		if err := testenv.TCPTransfer(pa1, pb1, b1, 1<<20); err != nil {
			t.Fatal(err)
		}
		// IPv6 too: the pods' /64s are inside the lab's IPv6 cluster CIDR.
		for _, n := range []ns.NetNS{pa1, pb1} {
			testenv.WaitIPv6Ready(t, n)
		}
		for _, proto := range []string{"tcp", "udp"} {
			mustAsk(t, pa1, proto, hp(b16, 7001), 0, "b1", a16)
		}
		if err := testenv.Ping(pa1, b16, 2); err != nil {
			t.Fatal(err)
		}
		if err := testenv.Ping(pb1, a16, 2); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("hostport-from-other-node-pod", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			// b1 leaves B masqueraded (A's uplink address is outside the cluster CIDRs).
			mustAsk(t, pb1, proto, hp(labNodeA, 8080), 0, "a2", labNodeB)
			mustAsk(t, lab.out, proto, hp(labNodeA, 8080), 0, "a2", outsideIP)
		}
	})
	t.Run("dump", func(t *testing.T) {
		tab, err := a.MasqAgent("dump", "nat")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{a1.String(), labNodeA.String(), "tcp", "udp", "icmp", labCluster} {
			if !strings.Contains(string(tab), want) {
				t.Errorf("dump nat lacks %q:\n%s", want, tab)
			}
		}
		js, err := a.MasqAgent("dump", "nat", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var d inspect.NATDump
		if err := json.Unmarshal(js, &d); err != nil {
			t.Fatalf("dump nat -o json: %v\n%s", err, js)
		}
		protos := map[string]bool{}
		for _, f := range d.Flows {
			if strings.HasPrefix(f.Pod, a1.String()+":") && strings.HasPrefix(f.Node, labNodeA.String()+":") {
				protos[f.Protocol] = true
				if f.Interface == "" || f.Peer == "" {
					t.Errorf("incomplete row %+v", f)
				}
			}
		}
		for _, p := range []string{"tcp", "udp", "icmp"} {
			if !protos[p] {
				t.Errorf("dump nat -o json has no %s flow of %s:\n%s", p, a1, js)
			}
		}
		if d.Counters["snat"] == 0 || d.Counters["reverse"] == 0 || d.Counters["new"] == 0 {
			t.Errorf("counters %v", d.Counters)
		}
		// Both pods' ADDs hold the cluster CIDR; the node's uplink keeps
		// its address as the source for kernels without BPF_FIB_LOOKUP_SRC.
		if d.ClusterCIDRUsers[labCluster] < 2 {
			t.Errorf("dump nat -o json: %s has users %v, want the two pods' attachments", labCluster, d.ClusterCIDRUsers)
		}
		src := false
		for _, u := range d.UplinkSources {
			src = src || slices.Contains(u.Sources, labNodeA.String())
		}
		if !src {
			t.Errorf("dump nat -o json: no uplink keeps %s as its masquerade source: %+v", labNodeA, d.UplinkSources)
		}
		t.Logf("dump nat:\n%s", tab)
	})
	t.Run("no-rules", func(t *testing.T) {
		if got := rulesets(t, a.Node); got != rulesA {
			t.Errorf("node A rules changed:\nbefore:\n%s\nafter:\n%s", rulesA, got)
		}
		if got := rulesets(t, b.Node); got != rulesB {
			t.Errorf("node B rules changed:\nbefore:\n%s\nafter:\n%s", rulesB, got)
		}
	})
	t.Run("del", func(t *testing.T) {
		m := a.Maps()
		n, err := snatFlowsOf(m, a1)
		if err != nil || n == 0 {
			t.Fatalf("before DEL: %d flows of %s (%v), want some", n, a1, err)
		}
		if err := a.Del(pa1, "a1", "eth0"); err != nil {
			t.Fatal(err)
		}
		if n, err := snatFlowsOf(m, a1); err != nil || n != 0 {
			t.Fatalf("after DEL: %d flows of %s left (%v)", n, a1, err)
		}
		if n, _ := snatFlowsOf(m, a2); n == 0 {
			t.Fatalf("DEL of a1 removed a2's entries too")
		}
		// a2 still leaves masqueraded.
		mustAsk(t, pa2, "tcp", out, 0, "outside", labNodeA)
	})
}

// TestMasqCheck: CHECK of a masquerading pod finds the pieces ipMasq needs
// missing: the flag on its endpoint entries (without it the uplink leaves
// its traffic untranslated) and its cluster CIDRs (without them traffic to
// other pods would be masqueraded). CHECK used to look at neither.
func TestMasqCheck(t *testing.T) {
	e := testenv.New(t)
	e.Extra = map[string]any{"ipMasq": true}
	p := e.NewPod()
	e.CleanupDel(p, "m")
	r := e.Add(p, "m")
	if err := e.Check(p, "m", "eth0"); err != nil {
		t.Fatalf("CHECK of a fresh masquerading pod: %v", err)
	}
	m := e.Maps()
	ip := v4Of(t, r)
	ep, err := m.Endpoints().Lookup(ip)
	if err != nil {
		t.Fatal(err)
	}
	cleared := ep
	cleared.Flags &^= maps.EndpointFlagMasq
	if err := testenv.PutEndpoint(m, ip, cleared); err != nil {
		t.Fatal(err)
	}
	if err := e.Check(p, "m", "eth0"); err == nil || !strings.Contains(err.Error(), "ipMasq flag") {
		t.Errorf("CHECK with the ipMasq flag cleared: %v, want an error naming the flag", err)
	}
	if err := testenv.PutEndpoint(m, ip, ep); err != nil {
		t.Fatal(err)
	}
	sub := netip.MustParsePrefix(testenv.PodSubnet4)
	if err := mapstest.DeleteClusterCIDR(m, sub); err != nil {
		t.Fatal(err)
	}
	if err := e.Check(p, "m", "eth0"); err == nil || !strings.Contains(err.Error(), "cni_cluster_cidrs lacks "+testenv.PodSubnet4) {
		t.Errorf("CHECK with the pod's subnet gone from the cluster CIDRs: %v, want an error naming it", err)
	}
	if err := mapstest.PutClusterCIDR(m, sub); err != nil {
		t.Fatal(err)
	}
	if err := e.Check(p, "m", "eth0"); err != nil {
		t.Errorf("CHECK once repaired: %v", err)
	}
	e.MustDel(p, "m")
	e.AssertClean()
}

// snatFlowsOf counts the masqueraded flows of a pod address as `dump nat`
// reads them: a flow is listed once per forward entry and once per reverse
// entry without one, so it is zero exactly when no entry of either
// direction holds the address.
func snatFlowsOf(m *maps.Maps, ip net.IP) (int, error) {
	flows, err := m.Masq().ListSNAT()
	want, _ := netip.AddrFromSlice(ip)
	n := 0
	for _, f := range flows {
		if f.Pod.Addr().Unmap() == want.Unmap() {
			n++
		}
	}
	return n, err
}
