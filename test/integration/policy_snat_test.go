package integration

import (
	"os/exec"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestPolicyMasqueradedService (issue 23): kube-proxy with masqueradeAll (or any
// SNAT rule of the node's POSTROUTING) masquerades a pod's Service traffic
// behind a node address before the tc egress hooks see it. The sender's
// egress denial is deferred by from_container to the judgement after the
// stack (the ClusterIP is no pod's), but after the SNAT to_container and
// to_uplink no longer see the pod's address, so they judge nothing for the
// sender; and the receiver's ingress takes the node's address as the
// node's own traffic (kubelet's), which always passes. A pod denied all
// egress then reaches a pod denied all ingress through its Service.
func TestPolicyMasqueradedService(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	// masqueradeAll: every packet to the web Service is marked for SNAT.
	must(t, p.Node.Do(func(ns.NetNS) error {
		for _, cmd := range []string{"iptables-nft", "ip6tables-nft"} {
			for _, chain := range []string{"KUBE-SVC-WEB-TCP", "KUBE-SVC-WEB-UDP"} {
				if out, err := exec.Command(cmd, "-t", "nat", "-I", chain, "1", "-j", "KUBE-MARK-MASQ").CombinedOutput(); err != nil {
					t.Fatalf("%s: %v: %s", cmd, err, out)
				}
			}
		}
		return nil
	}))
	p.apply(t, "h", policy.Endpoint{})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated()})
	p.apply(t, "a", policy.Endpoint{Egress: isolated()})
	for _, fam := range []int{4, 6} {
		blocked(t, p.a, "tcp", p.ip["b"][fam], 8080) // directly: denied
		blocked(t, p.a, "tcp", svcWeb[fam], 80)      // through the masqueraded Service
		blocked(t, p.a, "udp", svcWeb[fam], 80)
		blocked(t, p.h, "tcp", svcWeb[fam], 80) // h may send, b takes nothing
	}
}
