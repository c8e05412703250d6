// Attack: the tunnel trust rule keys on the outer source address only, and
// an address is not an identity. A host that is no node, on a node's L2
// segment, sends the VXLAN datagram with a node's address as the outer
// source (here: the stranger of subnet A claims node 3, 10.77.2.1, whose
// return route on node 1 is via the router on the same uplink, so
// rp_filter does not object) and an inner source of that node's pod.

package integration

import (
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelSpoofedOuterSource: the stranger (no node) claims node 3's
// address as the outer source and node 3's pod as the inner one; docs/
// tunnel.md says "no host that is not a node ... can inject a packet
// claiming a pod of another node". Pod 1 must receive nothing.
func TestTunnelSpoofedOuterSource(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("s1")
	_, r3 := n3.RunPod("s3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)

	got := listenUDP4(t, p1, 9997)
	// Control: the plain stranger is refused.
	sendVXLAN(t, lab.strang, tunNode[0], vxlanFrame(a3, a1, 9997, []byte("stranger")))
	// The stranger with node 3's address as its outer source.
	sendVXLANAs(t, lab.strang, tunNode[2], tunNode[0], vxlanFrame(a3, a1, 9997, []byte("spoofed-outer")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q: a host that is no node injected a packet as node 3's pod %s", arrived, a3)
	}
}

// TestTunnelPodVXLANViaDNAT: a pod's own VXLAN datagram is refused at its
// host veth only when its destination, before the stack translates it, is
// a node address (tun_from_pod, from_container's ep lookup). A Service
// (here kube-proxy's DNAT, as an iptables rule on node 3) whose endpoint
// is another node's address and port 4789 (any user who can write an
// EndpointSlice can make one) carries it past: masqueraded as node 3, it
// passes node 1's trust rule with the inner source of pod 3's neighbour.
func TestTunnelPodVXLANViaDNAT(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("d1")
	p3, r3 := n3.RunPod("d3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	svc := net.ParseIP("10.96.77.77").To4()
	if err := n3.InNode(func() error {
		out, err := exec.Command("iptables", "-t", "nat", "-A", "PREROUTING", "-d", svc.String(), "-p", "udp", "--dport", "53",
			"-j", "DNAT", "--to-destination", tunNode[0].String()+":4789").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	other3 := append(net.IP{}, a3.To4()...)
	other3[3]++
	claim := other3
	got := listenUDP4(t, p1, 9996)
	frame := vxlanFrame(claim, a1, 9996, []byte("pod-via-service"))
	if err := p3.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: svc, Port: 53})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(frame)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	arrived := got(2 * time.Second)
	n3.InNode(func() error {
		b, _ := exec.Command("iptables", "-t", "nat", "-nvL", "PREROUTING").CombinedOutput()
		c, _ := exec.Command("conntrack", "-L").CombinedOutput()
		t.Logf("node 3:\n%s\n%s", b, c)
		return nil
	})
	idx, _, _ := tunDevice(t, n1)
	m := n1.Maps()
	t.Logf("node 1 tunnel drops: not-node %d source %d", counter(t, m, idx, maps.DirIngress, maps.ReasonDropTunNode).Packets, counter(t, m, idx, maps.DirIngress, maps.ReasonDropTunSrc).Packets)
	if len(arrived) != 0 {
		t.Errorf("pod 1 received %q: pod 3 (%s) tunnelled a packet claiming its neighbour %s through a Service", arrived, a3, other3)
	}
}
