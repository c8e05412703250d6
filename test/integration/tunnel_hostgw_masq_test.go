package integration

import (
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelLabHostGWPodsNotMasqueraded (issue 24: traffic to other nodes'
// pods is never masqueraded): nodes 1 and 2 of the lab (IPv4 and IPv6
// underlay, ipMasq on) on host-gw routes alone (`peers --tunnel off`, the
// tunnel never on): ping, TCP and UDP between their pods both ways, IPv4
// (the control) and IPv6; each server sees the other pod's own address,
// UDP replies come from the address dialled, and neither node's masquerade
// opens a flow. The lab's IPv6 cluster CIDR was fd00:78::/48, which holds
// none of its pods' /64s (fd00:78:N::/64: N is in the third group, inside
// the /48's bits): node 1 masqueraded its pod's IPv6 traffic to node 2's
// pods to fd77:1::1 (TCP: "server saw the client as [fd77:1::1]:..."; UDP:
// pod 1's reply to pod 2 left as fd77:1::1 and pod 2's socket, connected
// to pod 1, got no answer), as the product must for a destination outside
// the configured clusterCIDRs.
func TestTunnelLabHostGWPodsNotMasqueraded(t *testing.T) {
	// The lab's own ranges first: each node's pod CIDRs inside the cluster
	// CIDRs the lab configures.
	for i := range tunNode {
		p4, p6 := tunPods(i)
		for _, c := range [][2]string{{tunCluster, p4}, {tunCluster6, p6}} {
			cl, p := netip.MustParsePrefix(c[0]), netip.MustParsePrefix(c[1])
			if !cl.Contains(p.Addr()) || cl.Bits() > p.Bits() {
				t.Errorf("the lab's cluster CIDR %s does not hold node %d's pod CIDR %s", cl, i+1, p)
			}
		}
	}
	lab := newTunLab6(t)
	nodes := lab.nodes[:2] // host-gw cannot reach node 3 (another subnet)
	var peers []agent.Peer
	for i := range nodes {
		p4, p6 := tunPods(i)
		peers = append(peers, agent.Peer{NodeIP: tunNode[i].String(), NodeIPs: []string{tunNode6[i].String()}, PodCIDRs: []string{p4, p6}})
	}
	pf := filepath.Join(t.TempDir(), "peers.json")
	pj, _ := json.Marshal(peers)
	must(t, os.WriteFile(pf, pj, 0o600))
	for _, e := range nodes {
		if out, err := e.MasqAgent("peers", "--peers", pf, "--cni-conf-dir", t.TempDir(), "--tunnel", "off"); err != nil {
			t.Fatalf("peers --tunnel off: %v\n%s", err, out)
		}
	}
	p1, p2 := nodes[0].NewPod(), nodes[1].NewPod()
	nodes[0].CleanupDel(p1, "h1")
	nodes[1].CleanupDel(p2, "h2")
	a1, a16 := testenv.PodIPs(t, nodes[0].Add(p1, "h1"))
	a2, a26 := testenv.PodIPs(t, nodes[1].Add(p2, "h2"))
	for _, n := range []ns.NetNS{p1, p2, nodes[0].Node, nodes[1].Node} {
		testenv.WaitIPv6Ready(t, n)
	}
	serve(t, p1, 7001, "h1")
	serve(t, p2, 7001, "h2")

	for _, c := range []struct {
		from     ns.NetNS
		to, src  net.IP
		name     string
		family   string
		fromNode int
	}{{p1, a2, a1, "h2", "IPv4", 1}, {p2, a1, a2, "h1", "IPv4", 2}, {p1, a26, a16, "h2", "IPv6", 1}, {p2, a16, a26, "h1", "IPv6", 2}} {
		if err := testenv.Ping(c.from, c.to, 2); err != nil {
			t.Errorf("%s ping node %d's pod -> %s: %v", c.family, c.fromNode, c.to, err)
		}
		for _, proto := range []string{"tcp", "udp"} {
			addr := hp(c.to, 7001)
			a, err := askFrom(c.from, proto, addr, 0)
			if err != nil {
				t.Errorf("%s %s node %d's pod -> %s: %v", c.family, proto, c.fromNode, addr, err)
				continue
			}
			host, _, _ := net.SplitHostPort(a.peer)
			if a.server != c.name || !net.ParseIP(host).Equal(c.src) || (a.from != "" && a.from != addr) {
				t.Errorf("%s %s node %d's pod -> %s: answered by %q, which saw the client as %s (want %s), reply from %q",
					c.family, proto, c.fromNode, addr, a.server, a.peer, c.src, a.from)
			}
		}
	}
	for i, e := range nodes {
		st, err := e.Maps().Masq().Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st["new"] != 0 || st["snat"] != 0 {
			t.Errorf("node %d masqueraded pod-to-pod traffic: new=%d snat=%d", i+1, st["new"], st["snat"])
		}
	}
	if t.Failed() {
		for i, e := range nodes {
			out, _ := e.MasqAgent("dump", "nat")
			t.Logf("node %d: ebpf-agent dump nat:\n%s", i+1, out)
		}
	}
}
