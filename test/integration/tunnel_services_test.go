// Services through kube-proxy's rules whose endpoint is a pod of a node on
// the other subnet: the DNAT, the masquerade and the replies' un-NAT all
// happen on the client's node, the packets cross the tunnel between them.

package integration

import (
	"net"
	"os/exec"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
	"github.com/vishvananda/netlink"
)

// TestTunnelServicesAcross: on the tunnel lab (vxlan, not hybrid), node 1
// holds kube-proxy's iptables rules (iptables-nft) for
//   - a ClusterIP (IPv4 and IPv6) whose one endpoint is pod 3, on node 3
//     behind the router: pod 1 reaches it, TCP and UDP, and pod 3 sees
//     pod 1's own address (pod to pod is never masqueraded);
//   - a NodePort, externalTrafficPolicy Cluster, whose endpoint is pod 3:
//     the host of subnet A that is no node reaches it at node 1's address,
//     and pod 3 sees node 1's address (kube-proxy's masquerade), which node
//     3's trust rule accepts as node 1's inner source;
//   - a NodePort, externalTrafficPolicy Local, whose endpoint is pod 1: the
//     same host reaches it and pod 1 sees the host's own address;
//   - a ClusterIP whose endpoint is pod 3 asked by node 1 itself (a node
//     process: masqueraded to node 1's address, which leaves from ebpf-tun).
func TestTunnelServicesAcross(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	// The nodes' addresses are cluster CIDRs too, as the agent following
	// Nodes makes them (nodeClusterCIDRs): pod 3's UDP reply to node 1's
	// address (kube-proxy's masquerade of the NodePort client) is then not
	// masqueraded again by node 3.
	lab.nodesInCluster(false)
	startTunAgents(t, lab)
	p1, a1, a16 := servedPod(t, n1, "s1", 8080)
	_, a3, a36 := servedPod(t, n3, "s3", 8080)

	cip := net.ParseIP("10.96.24.10").To4()
	cipNode := net.ParseIP("10.96.24.11").To4()
	cip6 := net.ParseIP("fd00:96::24:10")
	svcs := []svcPort{
		{name: "cross-tcp", proto: "tcp", clusterIP: cip, port: 80, backend: a3, target: 8080},
		{name: "cross-udp", proto: "udp", clusterIP: cip, port: 80, backend: a3, target: 8080},
		{name: "node-tcp", proto: "tcp", clusterIP: cipNode, port: 80, backend: a3, target: 8080},
		{name: "np-cluster", proto: "tcp", clusterIP: net.ParseIP("10.96.24.12").To4(), port: 80, nodePort: 30080, backend: a3, target: 8080},
		{name: "np-clusterudp", proto: "udp", clusterIP: net.ParseIP("10.96.24.12").To4(), port: 80, nodePort: 30080, backend: a3, target: 8080},
		{name: "np-local", proto: "tcp", clusterIP: net.ParseIP("10.96.24.13").To4(), port: 80, nodePort: 30081, local: true, backend: a1, target: 8080},
	}
	svcs6 := []svcPort{
		{name: "cross6-tcp", proto: "tcp", clusterIP: cip6, port: 80, backend: a36, target: 8080},
		{name: "cross6-udp", proto: "udp", clusterIP: cip6, port: 80, backend: a36, target: 8080},
	}
	// On failure: every counter of nodes 1 and 3, and node 1's NAT rules.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for i, e := range []*testenv.Env{n1, n3} {
			m := e.Maps()
			e.InNode(func() error {
				ls, _ := netlink.LinkList()
				for _, l := range ls {
					t.Logf("node %d %s: %s", 2*i+1, l.Attrs().Name, dumpCounters(m, l.Attrs().Index))
				}
				return nil
			})
		}
		n1.InNode(func() error {
			b, _ := exec.Command("sh", "-c", "iptables-save -c -t nat | grep -v '^\\[0:0\\]'; conntrack -L; ip addr show dev ebpf-tun").CombinedOutput()
			b6, _ := exec.Command("sh", "-c", "ip6tables-save -c -t nat | grep -v '^\\[0:0\\]'").CombinedOutput()
			t.Logf("node 1 NAT:\n%s\n%s", b, b6)
			return nil
		})
	})
	mode := proxyModes[0]
	mode.install(t, n1.Node, 4, tunCluster, []net.IP{tunNode[0]}, svcs)
	mode.install(t, n1.Node, 6, tunCluster6, nil, svcs6)
	// The host that is no node reaches NodePorts at node 1's address; its
	// replies come back the same way (it has a route only to its subnet).

	t.Run("clusterip", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			mustAsk(t, p1, proto, hp(cip, 80), 0, "s3", a1)
			mustAsk(t, p1, proto, hp(cip6, 80), 0, "s3", a16)
		}
	})
	// Masqueraded into the tunnel, node 1's clients take the device's
	// address, its pod CIDR's network address (docs/tunnel.md), so that the
	// replies come back through the tunnel.
	n1tun := net.ParseIP("10.78.1.0")
	t.Run("clusterip-from-node", func(t *testing.T) {
		mustAsk(t, n1.Node, "tcp", hp(cipNode, 80), 0, "s3", n1tun)
	})
	t.Run("nodeport", func(t *testing.T) {
		for _, proto := range []string{"udp", "tcp"} {
			mustAsk(t, lab.strang, proto, hp(tunNode[0], 30080), 0, "s3", n1tun)
		}
	})
	t.Run("nodeport-local", func(t *testing.T) {
		mustAsk(t, lab.strang, "tcp", hp(tunNode[0], 30081), 0, "s1", tunStrang)
	})
	// A pod to another node's address (its hostNetwork server), as
	// upstream's "KubeProxy should set TCP CLOSE_WAIT timeout" does: node
	// addresses are cluster CIDRs (above), so the pod keeps its address.
	t.Run("pod-to-node-across", func(t *testing.T) {
		serve(t, n3.Node, 8081, "node3")
		for _, proto := range []string{"tcp", "udp"} {
			mustAsk(t, p1, proto, hp(tunNode[2], 8081), 0, "node3", a1)
		}
	})
	// The answers above crossed the tunnel: node 1 routes pod 3's ranges
	// into ebpf-tun only (the lab's router has no route to them); its
	// transmit counter proves the device carried them.
	_, _, tx := tunDevice(t, n1)
	if tx == 0 {
		t.Errorf("node 1's %s transmitted nothing", "ebpf-tun")
	}
}
