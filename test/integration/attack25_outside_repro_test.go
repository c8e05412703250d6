//go:build integration && review_repro

package integration

import (
	"net"
	"testing"
)

// TestAttack25OutsideSourceUnassignedInPodSubnet is red: a defect found by
// attack25, kept off the default build (run it with
// `go test -tags integration,review_repro -count=1 -run TestAttack25OutsideSourceUnassignedInPodSubnet -v ./test/integration/`).
//
// The defect: a host beyond the uplink that forges a source address of this
// node's pod subnet that IPAM has not handed out (10.250.0.200,
// fd00:250::200) is not dropped at the uplink (no drop_spoof_ip) and reaches
// a pod whose policy admits the subnet by ipBlock, IPv4 (rp_filter off, as
// in a netns; loose mode with a default route passes it too) and IPv6. The
// uplink's check knows the addresses of this node's pods (a forged assigned
// address, b's, is dropped: TestAttack25OutsideSourceOfThisNodesPod), not
// the node's pod range, though no packet from the wire can carry an address
// of it. What observe.md promises is worded "claiming a pod of this node",
// which an unassigned address is not: the doc and the check agree, and the
// hole is between them. A fix needs the node's pod ranges in the programs
// (the conflist's host-local ranges, or the agent's Node.spec.podCIDRs; IPAM
// that is not per node has none), a design choice left to the owners.
func TestAttack25OutsideSourceUnassignedInPodSubnet(t *testing.T) {
	t.Parallel()
	a25OutsideAsPodSubnet(t, "unassigned", func(fam int, _ map[int]net.IP) net.IP {
		if fam == 4 {
			return net.ParseIP("10.250.0.200").To4()
		}
		return net.ParseIP("fd00:250::200")
	})
}
