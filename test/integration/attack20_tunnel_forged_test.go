// attack20: hostile review of to_container's ingress-interface check
// (docs/networkpolicy.md, the forged-source paragraph) from the tunnel
// device: "a node source is the node's only from no interface (the node's
// own) or a pod's host veth", and every node's traffic passes into pods.

package integration

import (
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestAttack20TunnelForgedNodeSource: pod 1 (node 1, networkPolicy) is
// isolated, admitting nothing. Node 3, a genuine peer, sends it VXLAN
// datagrams whose inner source is node 1's own address (the node's
// traffic passes into any pod), node 3's own address (a node, but not
// this one: judged as any peer) and node 2's address. None may arrive.
// Control: before the policy node 3's pod's datagram arrives (on another
// port); after it, node 3's pod's own is denied too.
func TestAttack20TunnelForgedNodeSource(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	n1.Extra["networkPolicy"] = true
	startTunAgents(t, lab)
	pods, a4, _ := lab.podPerNode(t, "tf")
	p1 := pods[0]
	_, idx := n1.HostVeth("tf1")
	pw := n1.Maps().Policy().Writer()
	must(t, pw.Apply(uint32(idx), policy.Endpoint{}))
	got, ctl := listenUDP4(t, p1, 9720), listenUDP4(t, p1, 9721)
	for i := 0; i < 3; i++ {
		// Another port: a flow outlives a policy change (documented).
		sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(a4[2], a4[0], 9721, []byte("genuine")))
	}
	if arrived := ctl(2 * time.Second); len(arrived) == 0 {
		t.Fatalf("control: node 3's pod's datagram did not reach pod 1 before the policy")
	}
	must(t, pw.Apply(uint32(idx), policy.Endpoint{Ingress: isolated()}))
	for i := 0; i < 3; i++ {
		sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(a4[2], a4[0], 9720, []byte("pod3-isolated")))
		sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(tunNode[0], a4[0], 9720, []byte("as-node1")))
		sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(tunNode[2], a4[0], 9720, []byte("as-node3")))
		sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(tunNode[1], a4[0], 9720, []byte("as-node2")))
	}
	if arrived := got(3 * time.Second); len(arrived) != 0 {
		t.Errorf("isolated pod 1 (ingress admits nothing) received through the tunnel: %q", arrived)
	}
}
