// attack19: a pod whose egress rules except another pod's address (an
// ipBlock 0.0.0.0/0 with that pod's /32 in except) reaches that pod anyway
// through a translation: the pod's hostPort on a node address, its NodePort,
// its ClusterIP. Calico judges egress in FORWARD after portmap's and
// kube-proxy's DNAT, Cilium after its own load-balancing: all three are
// denied there.

package integration

import (
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestAttack19EgressExceptByTranslation: a's egress allows everything
// but pod h (an except hole), TCP and UDP, IPv4 and IPv6; h's ingress is
// open. a must not reach h directly, by h's ClusterIP (svcHP), by h's
// NodePort (npHP, kube-proxy's DNAT) or by h's hostPort (8081 on a node
// address, the programs' own DNAT).
func TestAttack19EgressExceptByTranslation(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	for _, pod := range []string{"b", "h"} {
		p.apply(t, pod, policy.Endpoint{})
	}
	p.apply(t, "a", policy.Endpoint{Egress: isolated(
		allowAll(prefix("0.0.0.0/0")), policy.Allow{Prefix: host(ip("h", 4))},
		allowAll(prefix("::/0")), policy.Allow{Prefix: host(ip("h", 6))}),
		Policies: []string{"ns/a-all-but-h"}})
	for _, fam := range []int{4, 6} {
		// Control: the rest of the world is allowed.
		reach(t, p.a, "tcp", ip("b", fam), 8080, "b")
		reach(t, p.a, "tcp", remoteIP[fam], 7000, "remote")
		for _, proto := range []string{"tcp", "udp"} {
			for _, c := range []struct {
				how  string
				dst  net.IP
				port int
			}{
				{"direct", ip("h", fam), 80},
				{"clusterIP", svcHP[fam], 80},
				{"nodePort", nodeIP[fam], npHP},
				{"hostPort/node", nodeIP[fam], hostPortH},
				{"hostPort/uplink", uplinkIP[fam], hostPortH},
			} {
				before := p.drops(t, "a", maps.DirEgress)
				blocked(t, p.a, proto, c.dst, c.port)
				if after := p.drops(t, "a", maps.DirEgress); after <= before {
					t.Errorf("v%d %s %s %s: a's egress drop_policy counter stayed at %d", fam, proto, c.how, hp(c.dst, c.port), after)
				}
			}
		}
	}
}

// TestAttack19EgressToHostPortByDestination is the other side of
// TestAttack19EgressExceptByTranslation: a's egress allows pod h only
// (every port); h's hostPort on a node address is h. Judged after the
// translation, as the ClusterIP to h is, a reaches h by both; the node
// address itself (no hostPort: port 9091) stays shut. h's NodePort on a
// node address stays shut too, counted as a's egress drop: kube-proxy's
// DNAT happens in the node's stack, after from_container, and a denied
// packet to a node address is never deferred (what the stack delivers to
// the node meets no second judgement: docs/networkpolicy.md, "Not done
// here"). An over-denial, kept and pinned here so that any change to it is
// a decision.
func TestAttack19EgressToHostPortByDestination(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	for _, pod := range []string{"b", "h"} {
		p.apply(t, pod, policy.Endpoint{})
	}
	p.apply(t, "a", policy.Endpoint{Egress: isolated(allowAll(host(ip("h", 4))), allowAll(host(ip("h", 6))))})
	serve(t, p.Node, 9091, "node")
	for _, fam := range []int{4, 6} {
		blocked(t, p.a, "tcp", nodeIP[fam], 9091)
		blocked(t, p.a, "tcp", ip("b", fam), 8080)
		for _, proto := range []string{"tcp", "udp"} {
			reach(t, p.a, proto, ip("h", fam), 80, "h")
			reach(t, p.a, proto, svcHP[fam], 80, "h")
			reach(t, p.a, proto, nodeIP[fam], hostPortH, "h")
			before := p.drops(t, "a", maps.DirEgress)
			blocked(t, p.a, proto, nodeIP[fam], npHP)
			if after := p.drops(t, "a", maps.DirEgress); after <= before {
				t.Errorf("v%d %s NodePort %s: a's egress drop_policy counter stayed at %d", fam, proto, hp(nodeIP[fam], npHP), after)
			}
		}
	}
}
