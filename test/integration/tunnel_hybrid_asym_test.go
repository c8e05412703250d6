// Hybrid mode when two nodes disagree on "direct": each agent decides by
// its own routes whether another node is on its subnet (pkg/agent/peers.go,
// onLink), so an asymmetric route makes node 1 send to node 2's pods in the
// clear while node 2 tunnels to node 1's.

package integration

import (
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelHybridAsymmetric: node 2 reaches node 1 through the router (a
// host route via the gateway: a policy route, an ECMP or firewall detour),
// node 1 reaches node 2 on the link.
func TestTunnelHybridAsymmetric(t *testing.T) {
	lab := newTunLab(t)
	n1, n2 := lab.nodes[0], lab.nodes[1]
	must(t, n2.InNode(func() error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: tunNode[0], Mask: net.CIDRMask(32, 32)}, Gw: tunGWA})
	}))
	startTunAgents(t, lab, "--tunnel-hybrid")
	routes := func(e *testenv.Env) string {
		var out string
		e.InNode(func() error {
			b, _ := exec.Command("ip", "-d", "route", "show", "proto", "199").CombinedOutput()
			out = string(b)
			return nil
		})
		return out
	}
	r1, r2 := routes(n1), routes(n2)
	p1, res1 := n1.RunPod("asym1")
	p2, res2 := n2.RunPod("asym2")
	a1, _ := testenv.PodIPs(t, res1)
	a2, _ := testenv.PodIPs(t, res2)
	serve(t, p1, 8080, "asym1")
	serve(t, p2, 8080, "asym2")
	var fails []string
	for _, proto := range []string{"tcp", "udp"} {
		if a, err := askFrom(p1, proto, hp(a2, 8080), 0); err != nil || a.server != "asym2" {
			fails = append(fails, proto+" pod 1 -> pod 2: "+errString(err))
		}
		if a, err := askFrom(p2, proto, hp(a1, 8080), 0); err != nil || a.server != "asym1" {
			fails = append(fails, proto+" pod 2 -> pod 1: "+errString(err))
		}
	}
	up1, up2 := uplinkIndex(t, n1), uplinkIndex(t, n2)
	t.Logf("node 1 routes:\n%snode 2 routes:\n%s", r1, r2)
	t.Logf("node 1 uplink: drop_tunnel_mac %d drop_tunnel_source %d; node 2 uplink: drop_tunnel_mac %d drop_tunnel_source %d",
		counter(t, n1.Maps(), up1, maps.DirIngress, maps.ReasonDropTunMAC).Packets,
		counter(t, n1.Maps(), up1, maps.DirIngress, maps.ReasonDropTunSrc).Packets,
		counter(t, n2.Maps(), up2, maps.DirIngress, maps.ReasonDropTunMAC).Packets,
		counter(t, n2.Maps(), up2, maps.DirIngress, maps.ReasonDropTunSrc).Packets)
	if len(fails) != 0 {
		t.Errorf("%s", strings.Join(fails, "\n"))
	}
}

func errString(err error) string {
	if err == nil {
		return "wrong answer"
	}
	return err.Error()
}
