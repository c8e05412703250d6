// Hostile review, round 5 (attack5): each test is one defect found in main,
// red until it is fixed.

package integration

import (
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// svcToNode is a ClusterIP no other test uses whose endpoint is the node
// itself (a hostNetwork backend: the API server, a node-local cache).
var svcToNode = map[int]net.IP{4: net.ParseIP("10.96.0.77").To4(), 6: net.ParseIP("fd00:96::77")}

// TestAttack5EgressDeniedReachesNodeThroughService: a pod whose egress
// allows nothing must not reach the node (docs/networkpolicy.md: "the node
// is no exception when a pod dials it"; TestPolicyAttack's pending-egress).
// Dialling a ClusterIP whose endpoint is a node address (any hostNetwork
// backend on this node) gets through: from_container defers the denial
// (the ClusterIP routes out of the uplink, so pol_unjudged_after says a
// judgement after the stack will come), kube-proxy DNATs it to the node's
// address and the stack delivers it locally, where neither to_container
// nor to_uplink runs. The node's answer then enters the pod as the node's
// traffic.
func TestAttack5EgressDeniedReachesNodeThroughService(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	for _, fam := range []int{4, 6} {
		routeVia(t, h.Node, "", remoteIP[fam])
	}
	a := h.NewPod()
	h.CleanupDel(a, "a")
	h.Add(a, "a")
	_, idx := h.HostVeth("a")
	serve(t, h.Node, 9095, "node")
	for _, fam := range []int{4, 6} {
		var svcs []svcPort
		for _, p := range []string{"tcp", "udp"} {
			svcs = append(svcs, svcPort{name: "tonode-" + p, proto: p, clusterIP: svcToNode[fam], port: 80,
				backend: nodeIP[fam], target: 9095})
		}
		proxyModes[0].install(t, h.Node, fam, cluster[fam], []net.IP{uplinkIP[fam], nodeIP[fam]}, svcs)
	}
	check := func(t *testing.T) {
		for _, fam := range []int{4, 6} {
			blocked(t, a, "tcp", nodeIP[fam], 9095) // the node's address: judged at once, denied
			blocked(t, a, "tcp", svcToNode[fam], 80)
			blocked(t, a, "udp", svcToNode[fam], 80)
		}
	}
	t.Run("pending", check)
	if err := h.Maps().Policy().Writer().Apply(uint32(idx), policy.Endpoint{Egress: isolated()}); err != nil {
		t.Fatal(err)
	}
	t.Run("isolated", check)
}
