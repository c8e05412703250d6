// Nodes with strict reverse-path filtering (rp_filter=1, as some
// distributions and hardening guides set it) receiving what the tunnel
// carries with a node's address as source.

package integration

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// rpFilterDrops is the node's IPReversePathFilter count (/proc/net/netstat).
func rpFilterDrops(t *testing.T, e *testenv.Env) string {
	t.Helper()
	var out string
	must(t, e.InNode(func() error {
		b, err := os.ReadFile("/proc/net/netstat")
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			for j := range names {
				if names[j] == "IPReversePathFilter" && j < len(vals) {
					out = vals[j]
				}
			}
		}
		return nil
	}))
	return out
}

// TestTunnelNodePortClientStrictRPFilter: node 3 itself (a node as a
// NodePort client: a health checker, a hostNetwork pod, an ingress
// controller) dials a NodePort of node 1 with externalTrafficPolicy Local
// (the client's address kept) whose endpoint is pod 1. The request crosses
// the underlay in the clear; pod 1's reply, addressed to node 3's address,
// takes table 199 (pod sources to tunnelled nodes' addresses) into the
// tunnel, and kube-proxy's conntrack gives it back node 1's address:port.
// It leaves ebpf-tun on node 3 with node 1's address as source, whose
// route is the uplink: strict rp_filter dropped it (IPReversePathFilter did
// not count it: locally delivered; the fix alone turns it green),
// and the connection timed out, TCP and UDP. The same holds for node 1's
// own packets to node 3's pods (their routes' src is node 1's address).
// The agent now makes the device's reverse-path check loose: the trust
// rule on the device (checks 2 and 4, docs/tunnel.md) is the stronger one.
func TestTunnelNodePortClientStrictRPFilter(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	for _, e := range lab.nodes {
		e.Extra["clusterCIDRs"] = []string{tunCluster, tunCluster6, tunNode[0].String() + "/32", tunNode[1].String() + "/32", tunNode[2].String() + "/32"}
	}
	must(t, n3.InNode(func() error {
		for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter"} {
			if err := tunSysctl(k, "1"); err != nil {
				return err
			}
		}
		return nil
	}))
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("rpf1")
	a1, _ := testenv.PodIPs(t, r1)
	p3, r3 := n3.RunPod("rpf3")
	a3, _ := testenv.PodIPs(t, r3)
	serve(t, p1, 8080, "rpf1")
	serve(t, p3, 8080, "rpf3")
	restore(t, n1.Node, "iptables-nft-restore", iptablesRules(4, tunCluster, []svcPort{
		{name: "rpft", proto: "tcp", clusterIP: net.ParseIP("10.96.0.91"), port: 80, nodePort: 30091, local: true, backend: a1, target: 8080},
		{name: "rpfu", proto: "udp", clusterIP: net.ParseIP("10.96.0.91"), port: 80, nodePort: 30091, local: true, backend: a1, target: 8080},
	}))
	before := rpFilterDrops(t, n3)
	for _, proto := range []string{"tcp", "udp"} {
		a, err := askFrom(n3.Node, proto, hp(tunNode[0], 30091), 0)
		if err != nil || a.server != "rpf1" {
			t.Errorf("%s from node 3 to node 1's NodePort (eTP Local): %+v %v; node 3's IPReversePathFilter %s -> %s",
				proto, a, err, before, rpFilterDrops(t, n3))
			continue
		}
		if h, _, _ := net.SplitHostPort(a.peer); !net.ParseIP(h).Equal(tunNode[2]) {
			t.Errorf("%s: pod 1 saw the client as %s, want node 3's %s", proto, a.peer, tunNode[2])
		}
	}
	// Node 1's own packets to pod 3 leave with node 1's address too.
	for _, proto := range []string{"tcp", "udp"} {
		a, err := askFrom(n1.Node, proto, hp(a3, 8080), 0)
		if err != nil || a.server != "rpf3" {
			t.Errorf("%s from node 1 to pod 3: %+v %v; node 3's IPReversePathFilter %s -> %s", proto, a, err, before, rpFilterDrops(t, n3))
		}
	}
}
