// Attack (round 12 review) on checkPodCIDRs (pkg/agent/peers.go): a peers
// file that makes every destination but the node's own pods a cluster
// address without naming a default route.

package integration

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

// complementOf is the prefixes that cover all of p's family but p: the
// sibling of each of p's ancestors (32 - p.Bits() ... for IPv4: p.Bits()
// prefixes, none a default route, none overlapping p).
func complementOf(p netip.Prefix) []string {
	p = p.Masked()
	var out []string
	for b := 1; b <= p.Bits(); b++ {
		anc := netip.PrefixFrom(p.Addr(), b).Masked()
		a := anc.Addr().AsSlice()
		a[(b-1)/8] ^= 0x80 >> ((b - 1) % 8) // flip the last bit of the ancestor: its sibling
		sib, _ := netip.AddrFromSlice(a)
		out = append(out, netip.PrefixFrom(sib, b).String())
	}
	return out
}

// TestMasqPeersCoverAllButOwnCIDR: node B's entry in a peers file gives it
// the 24 prefixes (128.0.0.0/1, 64.0.0.0/2 ... 10.250.1.0/24) that cover every IPv4
// address but node A's pod CIDR 10.250.0.0/24. None is a default route and
// none overlaps another node's, so checkPodCIDRs takes the file; yet it
// does what the check was added to refuse (its comment: "every destination
// would be a cluster address, so pods' traffic to the outside would stop
// being masqueraded and be routed to that node"): pod A's traffic to the
// outside 198.18.0.1 leaves unmasqueraded, routed to node B, and gets no
// answer. Red at int11 (12270a8): the mustAsk after the file fails (no
// answer from "outside"), after the agent took the file (it holds 128.0.0.0/1). Right: the file refused as the default-route one
// is (the union of a node's or of all nodes' pod CIDRs that covers a
// family, or a pod CIDR holding a node address such as 203.0.113.1 here,
// is no pod CIDR), and the last good file's routes and CIDRs kept. Two
// halves 0.0.0.0/1 + 128.0.0.0/1 pass the same way when no node lists an
// IPv4 pod CIDR inside them.
func TestMasqPeersCoverAllButOwnCIDR(t *testing.T) {
	a, pa, _, writePeers := peersAgentLab(t)
	out := hp(outsideIP, 7000)
	mustAsk(t, pa, "udp", out, 0, "outside", labNodeA)

	cover := complementOf(netip.MustParsePrefix(labPodsA))
	writePeers(append(cover, labPodsB6)...)
	time.Sleep(3 * time.Second) // three syncs of the agent
	got := agentCIDRs(t, a)
	t.Logf("agent CIDRs after the covering file: %v", got)
	if slices.Contains(got, "128.0.0.0/1") {
		t.Errorf("peers file covering all of IPv4 but %s: the agent took it, holds %v", labPodsA, got)
	}
	for _, proto := range []string{"tcp", "udp"} {
		mustAsk(t, pa, proto, out, 0, "outside", labNodeA)
	}
}
