// A pod's own tunnel datagram to a node address
// the cluster does not know. docs/tunnel.md promises a pod's VXLAN datagram
// never leaves its node ("masqueraded, it would leave with the node's
// address and pass the receiving node's trust rule as that node's"), but
// the checks name only the addresses in cni_tun_nodes. A node commonly
// has more addresses than the one it is known by (a second IP on its
// uplink, an ExternalIP), and the collect_md VXLAN socket is bound to
// every local address.

package integration

import (
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelPodVXLANToUnlistedNodeAddress: node 3 holds a second address
// on its uplink, 10.77.2.50, that no peer list names. Pod p1 of node 1
// sends a VXLAN datagram there whose inner packet claims a neighbour's
// address of node 1's pod range and goes to pod p3 of node 3. Masqueraded
// by node 1, it reaches node 3 from node 1's address through the router's
// MAC (check 1 passes), node 3's tunnel socket decapsulates it, and the
// trust rule (outer source node 1, inner source in node 1's pods) admits
// it. p3 must receive nothing.
func TestTunnelPodVXLANToUnlistedNodeAddress(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	second := net.ParseIP("10.77.2.50").To4()
	must(t, n3.InNode(func() error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		return labAddr(l, second.String()+"/24")
	}))
	startTunAgents(t, lab)
	p1, p3 := n1.NewPod(), n3.NewPod()
	n1.CleanupDel(p1, "a4p1")
	r1 := n1.Add(p1, "a4p1")
	n3.CleanupDel(p3, "a4p3")
	r3 := n3.Add(p3, "a4p3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)

	got := listenUDP4(t, p3, 9994)
	// Control: the tunnel works, p1's own datagram reaches p3.
	sendUDPFrom(t, p1, a3, 9994, []byte("genuine"))
	if arrived := got(3 * time.Second); len(arrived) != 1 {
		t.Fatalf("p3 received %q, want p1's genuine datagram", arrived)
	}
	// The attack: a forged inner source (a neighbour of p1's address, which
	// p1 does not own) through node 3's unlisted address.
	sendUDPFrom(t, p1, second, 4789, vxlanFrame(neighbour(a1), a3, 9994, []byte("via-secondary")))
	sendUDPFrom(t, p1, second, 4789, vxlanFrame(neighbour(a1), a3, 9994, []byte("via-secondary-2")))
	if arrived := got(3 * time.Second); len(arrived) != 0 {
		t.Errorf("p3 received %q: pod %s tunnelled through node 3's address %s as a pod of node 1", arrived, a1, second)
	}
}
