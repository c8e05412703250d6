// Attack: the tunnel trust rule keys on the outer source address only, and
// an address is not an identity. A host that is no node, on a node's L2
// segment, sends the VXLAN datagram with a node's address as the outer
// source (here: the stranger of subnet A claims node 3, 10.77.2.1, whose
// return route on node 1 is via the router on the same uplink, so
// rp_filter does not object) and an inner source of that node's pod.

package integration

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// sendVXLANFrom sends one frame from netns to node:4789 with the given
// outer source address (added to the sender's loopback first).
func sendVXLANFrom(t *testing.T, from ns.NetNS, src, node net.IP, frame []byte) {
	t.Helper()
	err := from.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		netlink.LinkSetUp(lo)
		a, _ := netlink.ParseAddr(src.String() + "/32")
		if err := netlink.AddrAdd(lo, a); err != nil && !strings.Contains(err.Error(), "exists") {
			return err
		}
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: src}, &net.UDPAddr{IP: node, Port: datapath.VXLANPort})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(frame)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestTunnelSpoofedOuterSource: the stranger (no node) claims node 3's
// address as the outer source and node 3's pod as the inner one; docs/
// tunnel.md says "no host that is not a node ... can inject a packet
// claiming a pod of another node". Pod 1 must receive nothing.
func TestTunnelSpoofedOuterSource(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, p3 := n1.NewPod(), n3.NewPod()
	n1.CleanupDel(p1, "s1")
	r1 := n1.Add(p1, "s1")
	n3.CleanupDel(p3, "s3")
	r3 := n3.Add(p3, "s3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)

	got := listenUDP4(t, p1, 9997)
	// Control: the plain stranger is refused.
	sendVXLAN(t, lab.strang, tunNode[0], vxlanFrame(a3, a1, 9997, []byte("stranger")))
	// The stranger with node 3's address as its outer source.
	sendVXLANFrom(t, lab.strang, tunNode[2], tunNode[0], vxlanFrame(a3, a1, 9997, []byte("spoofed-outer")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q: a host that is no node injected a packet as node 3's pod %s", arrived, a3)
	}
}
