//go:build review_repro

// Reproducers of defects the hostile review found and did not fix (see
// /work/notes/reports/review.md): they fail on this tree. Run with
// go test -tags review_repro -run TestReviewRepro ./test/integration/

package integration

import (
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestReviewReproForwardRulesBypassed: the node's firewall says pod a may not
// reach pod b (a FORWARD drop, as an iptables NetworkPolicy engine such as
// kube-router writes them; with ptp it holds). Same-node pod-to-pod traffic
// is redirected into b before netfilter sees it.
func TestReviewReproForwardRulesBypassed(t *testing.T) {
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	for id, p := range map[string]ns.NetNS{"a": a, "b": b} {
		e.CleanupDel(p, id)
	}
	a4, _ := testenv.PodIPs(t, e.Add(a, "a"))
	b4, _ := testenv.PodIPs(t, e.Add(b, "b"))
	restore(t, e.Node, "iptables-nft-restore", "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -s "+a4.String()+"/32 -d "+b4.String()+"/32 -j DROP\nCOMMIT\n")
	if err := testenv.Ping(a, b4, 2); err == nil {
		t.Errorf("pod a reached pod b despite the node's FORWARD rule dropping a -> b")
	}
}
