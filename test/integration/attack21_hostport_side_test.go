// attack21: hostile review of "hostPorts on node addresses: judged on their
// backend" (docs/networkpolicy.md): a pod whose egress denies the node
// address must reach nothing on it but a hostPort's backend. Here the node
// has its own sockets on the hostPort's very number, reachable only if the
// deferral lets through a packet that no mapping takes: the other protocol,
// another node address, another family, a mapping whose hostIP is no node
// address, a mapping whose pod was deleted.

package integration

import (
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

const (
	a21HPNode  = 8093 // t's TCP hostPort on the node's IPv4 address only
	a21HPOther = 8094 // t's TCP hostPort on 192.0.2.77, no node address
)

// TestAttack21HostPortNodeSocketSideDoors: pod t maps 8093/tcp on the
// node's IPv4 address only and 8094/tcp on 192.0.2.77; the node serves TCP
// and UDP on both numbers, every address. a's egress allows t only. a
// reaches t by 8093/tcp on the node address (control); every other
// combination must stay denied, counted as a's egress drop: 8093/udp,
// 8093 on the uplink address and on IPv6, 8094 on the node addresses.
// t itself (egress isolated) reaches its own hostPort but none of the
// node's sockets beside it. Then t is deleted (CNI DEL) and 8093 on the node address must be denied
// too (the node's socket answers otherwise).
func TestAttack21HostPortNodeSocketSideDoors(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	pod := p.NewPod()
	v4, v6 := resultIPs(p.MustAddHP(pod, "t",
		testenv.PM{HostPort: a21HPNode, ContainerPort: 80, Protocol: "tcp", HostIP: nodeIP[4].String()},
		testenv.PM{HostPort: a21HPOther, ContainerPort: 80, Protocol: "tcp", HostIP: "192.0.2.77"}))
	_, idx := p.HostVeth("t")
	p.idx["t"] = uint32(idx)
	serve(t, pod, 80, "t")
	for _, id := range []string{"b", "h", "t"} {
		p.apply(t, id, policy.Endpoint{})
	}
	serve(t, p.Node, a21HPNode, "node")
	serve(t, p.Node, a21HPOther, "node")
	p.apply(t, "a", policy.Endpoint{Egress: isolated(allowAll(host(v4)), allowAll(host(v6)))})

	reach(t, p.a, "tcp", nodeIP[4], a21HPNode, "t")
	for _, c := range []struct {
		proto string
		dst   net.IP
		port  int
	}{
		{"udp", nodeIP[4], a21HPNode},
		{"tcp", uplinkIP[4], a21HPNode},
		{"udp", uplinkIP[4], a21HPNode},
		{"tcp", nodeIP[6], a21HPNode},
		{"udp", nodeIP[6], a21HPNode},
		{"tcp", nodeIP[4], a21HPOther},
		{"udp", nodeIP[4], a21HPOther},
		{"tcp", uplinkIP[4], a21HPOther},
		{"tcp", nodeIP[6], a21HPOther},
	} {
		p.blockedCounted(t, "a", "a", maps.DirEgress, c.proto, c.dst, c.port)
	}

	// t itself, egress isolated: its own hostPort is its backend (let in
	// whatever its egress), the node's sockets beside it are not.
	p.apply(t, "t", policy.Endpoint{Egress: isolated()})
	reach(t, pod, "tcp", nodeIP[4], a21HPNode, "t")
	for _, c := range []struct {
		proto string
		dst   net.IP
		port  int
	}{
		{"udp", nodeIP[4], a21HPNode},
		{"tcp", uplinkIP[4], a21HPNode},
		{"tcp", nodeIP[6], a21HPNode},
		{"tcp", nodeIP[4], a21HPOther},
	} {
		before := p.drops(t, "t", maps.DirEgress)
		blocked(t, pod, c.proto, c.dst, c.port)
		if after := p.drops(t, "t", maps.DirEgress); after <= before {
			t.Errorf("%s %s from t (its own hostPort's number): t's egress drop_policy counter stayed at %d", c.proto, hp(c.dst, c.port), after)
		}
	}

	if err := p.Del(pod, "t", "eth0"); err != nil {
		t.Fatalf("DEL t: %v", err)
	}
	for _, proto := range []string{"tcp", "udp"} {
		p.blockedCounted(t, "a", "a", maps.DirEgress, proto, nodeIP[4], a21HPNode)
		p.blockedCounted(t, "a", "a", maps.DirEgress, proto, uplinkIP[4], a21HPNode)
	}
}
