package nodes

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestFromObjectRefusesDefaultRoute: a Node whose pod CIDR is 0.0.0.0/0 or
// ::/0 would make every destination a cluster address (pods' traffic to the
// outside no longer masqueraded, and routed to that node); such a CIDR is
// logged and left out, the node's other values kept.
func TestFromObjectRefusesDefaultRoute(t *testing.T) {
	var logs []string
	logf := func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }
	n := fromObject(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n2"},
		Spec:       corev1.NodeSpec{PodCIDRs: []string{"0.0.0.0/0", "10.244.2.0/24", "::/0"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "10.0.0.2"},
		}},
	}, logf)
	if want := []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}; !slices.Equal(n.PodCIDRs, want) {
		t.Errorf("pod CIDRs %v, want %v", n.PodCIDRs, want)
	}
	if len(n.InternalIPs) != 1 {
		t.Errorf("InternalIPs %v, want the one", n.InternalIPs)
	}
	if len(logs) != 2 || !strings.Contains(logs[0], `"0.0.0.0/0" is a default route`) || !strings.Contains(logs[1], `"::/0"`) {
		t.Errorf("logged %q, want both default routes named", logs)
	}
}
