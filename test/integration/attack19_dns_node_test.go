// attack19: egress default deny with DNS allowed, an ipBlock except
// covering the node's own address, a policy of one family only, and the
// node's traffic to and from isolated pods (Kubernetes: the node's always
// passes into its pods; a pod's egress to the node is the rules').

package integration

import (
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestAttack19EgressDNSAndNode, IPv4 and IPv6 unless said:
//   - dns: a may send only DNS (UDP and TCP 53) to b, the DNS pod behind
//     svcDNS: the Service answers; b's other port, another Service of b's
//     and port 53 of a host outside stay shut;
//   - except-node: a may send anywhere but the node address 192.0.2.1 /
//     fd00:1::1 (an except hole): that address is shut, the node's uplink
//     address (another address of it, no hole) and the rest are open;
//   - one-family: a's egress allows 0.0.0.0/0 only: IPv6 is shut;
//   - node-to-pod: a admits nothing, or everything but the node's address:
//     the node still reaches it (its traffic always passes, documented).
func TestAttack19EgressDNSAndNode(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	for _, pod := range []string{"b", "h"} {
		p.apply(t, pod, policy.Endpoint{})
	}
	serve(t, p.Node, 9091, "node")
	serve(t, p.remote, 53, "rdns")
	dnsOnly := func(fam int) policy.Allow {
		return policy.Allow{Prefix: host(ip("b", fam)), Ports: []policy.PortRange{
			{Proto: policy.ProtoTCP, First: 53, Last: 53}, {Proto: policy.ProtoUDP, First: 53, Last: 53}}}
	}
	t.Run("dns", func(t *testing.T) {
		p.apply(t, "a", policy.Endpoint{Egress: isolated(dnsOnly(4), dnsOnly(6))})
		for _, fam := range []int{4, 6} {
			reach(t, p.a, "udp", svcDNS[fam], 53, "dns")
			reach(t, p.a, "tcp", svcDNS[fam], 53, "dns")
			blocked(t, p.a, "tcp", ip("b", fam), 8080)
			blocked(t, p.a, "udp", svcWeb[fam], 80)
			blocked(t, p.a, "tcp", svcWeb[fam], 80)
			blocked(t, p.a, "udp", remoteIP[fam], 53)
			blocked(t, p.a, "tcp", remoteIP[fam], 53)
		}
	})
	t.Run("except-node", func(t *testing.T) {
		p.apply(t, "a", policy.Endpoint{Egress: isolated(allowAll(prefix("0.0.0.0/0")), policy.Allow{Prefix: host(nodeIP[4])},
			allowAll(prefix("::/0")), policy.Allow{Prefix: host(nodeIP[6])})})
		for _, fam := range []int{4, 6} {
			blocked(t, p.a, "tcp", nodeIP[fam], 9091)
			blocked(t, p.a, "udp", nodeIP[fam], 9091)
			reach(t, p.a, "tcp", uplinkIP[fam], 9091, "node")
			reach(t, p.a, "tcp", remoteIP[fam], 7000, "remote")
			reach(t, p.a, "tcp", ip("b", fam), 8080, "b")
		}
	})
	t.Run("one-family", func(t *testing.T) {
		p.apply(t, "a", policy.Endpoint{Egress: isolated(allowAll(prefix("0.0.0.0/0")))})
		reach(t, p.a, "tcp", ip("b", 4), 8080, "b")
		reach(t, p.a, "udp", remoteIP[4], 7000, "remote")
		blocked(t, p.a, "tcp", ip("b", 6), 8080)
		blocked(t, p.a, "udp", remoteIP[6], 7000)
		blocked(t, p.a, "udp", svcWeb[6], 80)
	})
	t.Run("node-to-pod", func(t *testing.T) {
		for _, ep := range []policy.Endpoint{{Ingress: isolated()}, {Ingress: isolated(allowAll(prefix("0.0.0.0/0")),
			policy.Allow{Prefix: host(nodeIP[4])}, allowAll(prefix("::/0")), policy.Allow{Prefix: host(nodeIP[6])})}} {
			p.apply(t, "a", ep)
			for _, fam := range []int{4, 6} {
				reach(t, p.Node, "tcp", ip("a", fam), 8080, "a")
				reach(t, p.Node, "udp", ip("a", fam), 8080, "a")
			}
		}
	})
}
