// attack19: a second network on the node. Two conflists share the node's
// pinDir (as a second Multus network would): pods of the network without
// networkPolicy must not get into the isolated pods of the one with it.

package integration

import (
	"net"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack19SecondNetwork: b (networkPolicy network) admits TCP 8080
// from a only; x is a pod of a second ebpf-cni network on the same pinDir
// without networkPolicy. x must reach b neither directly (the same-node
// redirect) nor through b's ClusterIP, TCP or UDP, IPv4 or IPv6, and b's
// ingress drops must count it. Controls: a reaches b; x reaches h (open).
func TestAttack19SecondNetwork(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	p.apply(t, "a", policy.Endpoint{})
	p.apply(t, "h", policy.Endpoint{})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(allowPorts(host(ip("a", 4)), policy.ProtoTCP, 8080, 8080),
		allowPorts(host(ip("a", 6)), policy.ProtoTCP, 8080, 8080))})
	netB := p.NetList(testenv.RandName("netb"), map[string]any{
		"type": "ebpf-cni", "pinDir": p.PinDir, "stateDir": t.TempDir(),
		"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{
			{{"subnet": "10.251.0.0/24"}}, {{"subnet": "fd00:251::/64"}}}},
	})
	x := p.NewPod()
	rt := &libcni.RuntimeConf{ContainerID: "x", NetNS: x.Path(), IfName: "eth0"}
	t.Cleanup(func() { p.DelList(netB, rt) })
	if _, err := p.AddList(netB, rt); err != nil {
		t.Fatalf("ADD x on the second network: %v", err)
	}
	for _, fam := range []int{4, 6} {
		reach(t, p.a, "tcp", ip("b", fam), 8080, "b")
		reach(t, x, "tcp", ip("h", fam), 80, "h")
		for _, c := range []struct {
			proto string
			dst   net.IP
			port  int
		}{{"tcp", ip("b", fam), 8080}, {"udp", ip("b", fam), 8080}, {"tcp", svcWeb[fam], 80}, {"udp", svcWeb[fam], 80}} {
			before := p.drops(t, "b", maps.DirIngress)
			blocked(t, x, c.proto, c.dst, c.port)
			if after := p.drops(t, "b", maps.DirIngress); after <= before {
				t.Errorf("v%d %s %s from the second network: b's ingress drop counter stayed at %d", fam, c.proto, hp(c.dst, c.port), after)
			}
		}
	}
}
