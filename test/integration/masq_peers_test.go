// The agent's cluster CIDRs from a peers file (no Kubernetes): every
// listed node's pod CIDRs and addresses, as the Node objects give them.

package integration

import (
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

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestMasqPeersAgentHoldsClusterCIDRs: the masquerade lab's two nodes,
// ipMasq on and no clusterCIDRs in the conflist (the default: the pod's
// own subnet), `ebpf-agent run --peers` on each, host-gw (tunnel off) and
// VXLAN. Pod to pod both ways, ping, TCP and UDP, IPv4 and IPv6: each
// server sees the other pod's own address, UDP replies come from the
// address dialled; a node's UDP to the other node's pod gets its reply
// from the pod (node addresses are cluster CIDRs: the pod's reply to a
// node address is not masqueraded); neither node's masquerade opens a
// flow. Node A's agent killed (-9): what it held stays, traffic keeps its
// addresses, a new agent holds the same. Then the peers file changes (node
// B's pod CIDRs renumbered) and node A's agent follows it: the old range
// released, the new one held.
// Red before: the agent held only --cluster-cidrs, so on host-gw routes
// node A masqueraded its pod's traffic to node B's pods (the server saw
// 203.0.113.1), and in either mode a pod's UDP reply to the other node's
// address left masqueraded.
func TestMasqPeersAgentHoldsClusterCIDRs(t *testing.T) {
	for _, mode := range []string{"off", "vxlan"} {
		t.Run("tunnel-"+mode, func(t *testing.T) { testMasqPeers(t, mode) })
	}
}

func testMasqPeers(t *testing.T, mode string) {
	lab := newMasqLab(t)
	a, b := lab.a, lab.b
	for _, e := range []*testenv.Env{a, b} {
		delete(e.Extra, "clusterCIDRs")
	}
	pf := filepath.Join(t.TempDir(), "peers.json")
	writePeers := func(podsB, podsB6 string) {
		pj, _ := json.Marshal([]agent.Peer{
			{NodeIP: labNodeA.String(), NodeIPs: []string{labNodeA6.String()}, PodCIDRs: []string{labPodsA, labPodsA6}},
			{NodeIP: labNodeB.String(), NodeIPs: []string{labNodeB6.String()}, PodCIDRs: []string{podsB, podsB6}},
		})
		// Through a rename, as an editor or a config manager writes it: the
		// agent never reads half a file.
		tmp := pf + ".tmp"
		must(t, os.WriteFile(tmp, pj, 0o600))
		must(t, os.Rename(tmp, pf))
	}
	writePeers(labPodsB, labPodsB6)
	agents := map[*testenv.Env]*testenv.AgentProc{}
	for _, e := range []*testenv.Env{a, b} {
		agents[e] = e.StartAgent(e.WriteConfDir(), "--peers", pf, "--tunnel", mode, "--metrics-addr", "", "--reconcile-interval", "1s")
	}
	for _, e := range []*testenv.Env{a, b} {
		waitPeerRoutes(t, e, 2)
	}

	pa, pb := a.NewPod(), b.NewPod()
	a.CleanupDel(pa, "pa")
	b.CleanupDel(pb, "pb")
	a4, a6 := testenv.PodIPs(t, a.Add(pa, "pa"))
	b4, b6 := testenv.PodIPs(t, b.Add(pb, "pb"))
	for _, n := range []ns.NetNS{pa, pb} {
		testenv.WaitIPv6Ready(t, n)
	}
	serve(t, pa, 7001, "pa")
	serve(t, pb, 7001, "pb")

	for _, c := range []struct {
		from          ns.NetNS
		fromName      string
		to, src       net.IP
		server, fam   string
		protos        []string
		ping          bool
		fromNodeOfPod bool
	}{
		{pa, "pod A", b4, a4, "pb", "IPv4", []string{"tcp", "udp"}, true, false},
		{pb, "pod B", a4, b4, "pa", "IPv4", []string{"tcp", "udp"}, true, false},
		{pa, "pod A", b6, a6, "pb", "IPv6", []string{"tcp", "udp"}, true, false},
		{pb, "pod B", a6, b6, "pa", "IPv6", []string{"tcp", "udp"}, true, false},
		// The node to the other node's pod: the pod's UDP reply to a node
		// address must keep the pod's address.
		{b.Node, "node B", a4, labNodeB, "pa", "IPv4", []string{"udp"}, false, true},
		{b.Node, "node B", a6, labNodeB6, "pa", "IPv6", []string{"udp"}, false, true},
		{a.Node, "node A", b4, labNodeA, "pb", "IPv4", []string{"udp"}, false, true},
		{a.Node, "node A", b6, labNodeA6, "pb", "IPv6", []string{"udp"}, false, true},
	} {
		if c.ping {
			if err := testenv.Ping(c.from, c.to, 2); err != nil {
				t.Errorf("%s ping %s -> %s: %v", c.fam, c.fromName, c.to, err)
			}
		}
		for _, proto := range c.protos {
			addr := hp(c.to, 7001)
			got, err := askFrom(c.from, proto, addr, 0)
			if err != nil {
				t.Errorf("%s %s %s -> %s: %v", c.fam, proto, c.fromName, addr, err)
				continue
			}
			host, _, _ := net.SplitHostPort(got.peer)
			if got.server != c.server || !net.ParseIP(host).Equal(c.src) || (got.from != "" && got.from != addr) {
				t.Errorf("%s %s %s -> %s: answered by %q, which saw the client as %s (want %s), reply from %q",
					c.fam, proto, c.fromName, addr, got.server, got.peer, c.src, got.from)
			}
		}
	}
	for name, e := range map[string]*testenv.Env{"A": a, "B": b} {
		st, err := e.Maps().Masq().Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st["new"] != 0 || st["snat"] != 0 {
			t.Errorf("node %s masqueraded traffic between the nodes: new=%d snat=%d", name, st["new"], st["snat"])
		}
	}
	// What the agent holds: every listed node's pod CIDRs and addresses.
	want := []string{labPodsA, labPodsA6, labPodsB, labPodsB6, labNodeA.String() + "/32", labNodeA6.String() + "/128",
		labNodeB.String() + "/32", labNodeB6.String() + "/128"}
	if got := agentCIDRs(t, a); !slices.Equal(got, sortedPrefixes(want)) {
		t.Errorf("node A's agent holds %v, want %v", got, sortedPrefixes(want))
	}

	// kill -9: what the agent held stays pinned, and a new agent holds the
	// same; meanwhile the pods still reach each other as themselves.
	agents[a].Cmd.Process.Kill()
	agents[a].Exited(5 * time.Second)
	if got := agentCIDRs(t, a); !slices.Equal(got, sortedPrefixes(want)) {
		t.Errorf("after node A's agent was killed: %v held, want %v", got, sortedPrefixes(want))
	}
	for _, proto := range []string{"tcp", "udp"} {
		mustAsk(t, pa, proto, hp(b4, 7001), 0, "pb", a4)
	}
	agents[a] = a.StartAgent(a.WriteConfDir(), "--peers", pf, "--tunnel", mode, "--metrics-addr", "", "--reconcile-interval", "1s")
	if got := agentCIDRs(t, a); !slices.Equal(got, sortedPrefixes(want)) {
		t.Errorf("after node A's agent restarted: %v held, want %v", got, sortedPrefixes(want))
	}

	// The file changes: node B's pods renumbered. Node A's agent releases
	// the old range and holds the new one at its next sync.
	const newB, newB6 = "10.250.9.0/24", "fd00:250:9::/64"
	writePeers(newB, newB6)
	want = append(slices.DeleteFunc(want, func(s string) bool { return s == labPodsB || s == labPodsB6 }), newB, newB6)
	var got []string
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if got = agentCIDRs(t, a); slices.Equal(got, sortedPrefixes(want)) {
			break
		}
	}
	if !slices.Equal(got, sortedPrefixes(want)) {
		t.Errorf("after the peers file changed, node A's agent holds %v, want %v", got, sortedPrefixes(want))
	}
	// The pods' own subnets stay while their attachments use them.
	if have := clusterCIDRs(t, a); !slices.Contains(have, labPodsA) || slices.Contains(have, labPodsB) {
		t.Errorf("node A's cluster CIDRs after the change: %v, want %s (its pod's) and not %s", have, labPodsA, labPodsB)
	}
	if t.Failed() {
		for name, e := range map[string]*testenv.Env{"A": a, "B": b} {
			out, _ := e.MasqAgent("dump", "nat")
			t.Logf("node %s: ebpf-agent dump nat:\n%s\nagent log:\n%s", name, out, agents[e].Logs())
		}
	}
}

// waitPeerRoutes waits up to 30 s for n routes of the agent's protocol
// (`ip route show proto 199`, both families) on e's node.
func waitPeerRoutes(t *testing.T, e *testenv.Env, n int) {
	t.Helper()
	var have []string
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		have = have[:0]
		e.InNode(func() error {
			rs, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: datapath.PeerRouteProtocol}, netlink.RT_FILTER_PROTOCOL)
			for _, r := range rs {
				if r.Dst != nil {
					have = append(have, r.Dst.String())
				}
			}
			return err
		})
		if len(have) == n {
			return
		}
	}
	t.Fatalf("%d routes of protocol %d, want %d: %v", len(have), datapath.PeerRouteProtocol, n, have)
}

// agentCIDRs are the cluster CIDRs the agent holds on e's node, sorted.
func agentCIDRs(t *testing.T, e *testenv.Env) []string {
	t.Helper()
	mine, err := e.Maps().Masq().ClusterCIDRsOf(datapath.AgentCIDROwner)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for p := range mine {
		out = append(out, p.String())
	}
	return sortedPrefixes(out)
}

// clusterCIDRs are e's node's cluster CIDRs (cni_cluster_cidrs).
func clusterCIDRs(t *testing.T, e *testenv.Env) []string {
	t.Helper()
	have, err := e.Maps().Masq().ClusterCIDRs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range have {
		out = append(out, p.String())
	}
	return out
}

func sortedPrefixes(ss []string) []string {
	out := slices.Clone(ss)
	for i, s := range out {
		out[i] = netip.MustParsePrefix(s).Masked().String()
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestMasqPeersDefaultRouteCIDR: a peers file that gives a node the pod
// CIDR 0.0.0.0/0 (or ::/0) is refused as a whole, and the agent keeps what
// the last good file installed: pods still reach the outside masqueraded
// (as node A), the agent holds the same cluster CIDRs, node B's routes
// stay, and the agent's log names the field.
// Red before: the agent held 0.0.0.0/0 and ::/0 as cluster CIDRs, so pod
// A's traffic to the outside left unmasqueraded and got no answer.
func TestMasqPeersDefaultRouteCIDR(t *testing.T) {
	a, pa, ag, writePeers := peersAgentLab(t)
	out, out6 := hp(outsideIP, 7000), hp(outsideIP6, 7000)
	for _, proto := range []string{"tcp", "udp"} {
		mustAsk(t, pa, proto, out, 0, "outside", labNodeA)
		mustAsk(t, pa, proto, out6, 0, "outside", labNodeA6)
	}
	held := agentCIDRs(t, a)

	for _, bad := range [][]string{{"0.0.0.0/0", labPodsB6}, {labPodsB, "::/0"}} {
		writePeers(bad...)
		time.Sleep(3 * time.Second) // three syncs of the agent
		for _, proto := range []string{"tcp", "udp"} {
			mustAsk(t, pa, proto, out, 0, "outside", labNodeA)
			mustAsk(t, pa, proto, out6, 0, "outside", labNodeA6)
		}
		if got := agentCIDRs(t, a); !slices.Equal(got, held) {
			t.Errorf("peers file with %v: the agent holds %v, want %v as before", bad, got, held)
		}
		said := fmt.Sprintf("%q is a default route", slices.DeleteFunc(slices.Clone(bad), func(c string) bool { return c == labPodsB || c == labPodsB6 })[0])
		for end := time.Now().Add(15 * time.Second); !strings.Contains(ag.Logs(), said); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("peers file with %v: the agent never said it refused it; log:\n%s", bad, ag.Logs())
			}
		}
		waitPeerRoutes(t, a, 2)
	}
}

// peersAgentLab is the masquerade lab's node A with no clusterCIDRs in its
// conflist, `ebpf-agent run --peers` on a file listing both nodes (1 s
// syncs), a pod on A and the outside server on port 7000; writePeers
// rewrites the file (through a rename, as a config manager does) with
// node B's pod CIDRs podsB.
func peersAgentLab(t *testing.T) (a *testenv.Env, pa ns.NetNS, ag *testenv.AgentProc, writePeers func(podsB ...string)) {
	lab := newMasqLab(t)
	a = lab.a
	delete(a.Extra, "clusterCIDRs")
	pf := filepath.Join(t.TempDir(), "peers.json")
	writePeers = func(podsB ...string) {
		pj, _ := json.Marshal([]agent.Peer{
			{NodeIP: labNodeA.String(), NodeIPs: []string{labNodeA6.String()}, PodCIDRs: []string{labPodsA, labPodsA6}},
			{NodeIP: labNodeB.String(), NodeIPs: []string{labNodeB6.String()}, PodCIDRs: podsB},
		})
		tmp := pf + ".tmp"
		must(t, os.WriteFile(tmp, pj, 0o600))
		must(t, os.Rename(tmp, pf))
	}
	writePeers(labPodsB, labPodsB6)
	ag = a.StartAgent(a.WriteConfDir(), "--peers", pf, "--metrics-addr", "", "--reconcile-interval", "1s")
	waitPeerRoutes(t, a, 2)
	pa = a.NewPod()
	a.CleanupDel(pa, "pa")
	a.Add(pa, "pa")
	serve(t, lab.out, 7000, "outside")
	return a, pa, ag, writePeers
}
