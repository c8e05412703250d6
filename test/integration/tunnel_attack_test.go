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
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
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

// sendTunnelPortAs sends one frame from a node's own netns to dst:port
// with src, an address the node holds, as the source: what only root on a
// node can do, past every check of a pod's traffic.
func sendTunnelPortAs(t *testing.T, e *testenv.Env, src, dst net.IP, port int, frame []byte) {
	t.Helper()
	must(t, e.InNode(func() error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: src}, &net.UDPAddr{IP: dst, Port: port})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(frame)
		return err
	}))
}

// addUplinkAddr gives a node one more address on its uplink, which no
// peer list names (a second IP, an ExternalIP bound to the node).
func addUplinkAddr(t *testing.T, e *testenv.Env, cidr string) {
	t.Helper()
	must(t, e.InNode(func() error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		return labAddr(l, cidr)
	}))
}

// addSecondAddrs gives a node a second IPv4 address v4 (/24) and IPv6
// address v6 (/64) on its uplink, as addUplinkAddr does, and returns them.
func addSecondAddrs(t *testing.T, e *testenv.Env, v4, v6 string) (net.IP, net.IP) {
	t.Helper()
	addUplinkAddr(t, e, v4+"/24")
	addUplinkAddr(t, e, v6+"/64")
	return net.ParseIP(v4).To4(), net.ParseIP(v6)
}

// TestTunnelPodTunnelPortToUnlistedAddress6: the unlisted address is
// node 3's second IPv6 one, over the IPv6 underlay, and the port VXLAN's
// or Geneve's: each datagram from pod p1 of node 1 leaves masqueraded by
// node 1's to_uplink, so is dropped there (drop_tunnel_source on p1's
// host veth, egress, with an event); p3 receives nothing.
func TestTunnelPodTunnelPortToUnlistedAddress6(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	second := net.ParseIP("fd77:2::50")
	addUplinkAddr(t, n3, second.String()+"/64")
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("u61")
	p3, r3 := n3.RunPod("u63")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	_, idx1 := n1.HostVeth("u61")
	testenv.WaitIPv6Ready(t, n3.Node)

	got := listenUDP4(t, p3, 9986)
	sendUDPFrom(t, p1, a3, 9986, []byte("genuine"))
	if arrived := got(3 * time.Second); len(arrived) != 1 {
		t.Fatalf("p3 received %q, want p1's genuine datagram", arrived)
	}
	seq := lastSeq(t, n1)
	before := counter(t, n1.Maps(), idx1, maps.DirEgress, maps.ReasonDropTunSrc).Packets
	sendUDPFrom(t, p1, second, datapath.VXLANPort, vxlanFrame(neighbour(a1), a3, 9986, []byte("vxlan-via-secondary6")))
	sendUDPFrom(t, p1, second, datapath.GenevePort, vxlanFrame(neighbour(a1), a3, 9986, []byte("geneve-port-via-secondary6")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("p3 received %q through node 3's unlisted address %s", arrived, second)
	}
	evs := tunDropEvents(t, n1, idx1, maps.DirEgress, maps.ReasonDropTunSrc, before, 2, seq)
	for _, ev := range evs {
		if ev.Dst != second.String() {
			t.Errorf("event %+v: want a datagram to %s", ev, second)
		}
	}
}

// TestTunnelPodVXLANViaServiceToUnlistedAddress: a Service (kube-proxy's
// DNAT, as an iptables rule on node 1) whose endpoint is node 3's unlisted
// address and port 4789: p1's datagram to the ClusterIP becomes a tunnel
// datagram only after the stack, is masqueraded, and is dropped at the
// uplink.
func TestTunnelPodVXLANViaServiceToUnlistedAddress(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	addUplinkAddr(t, n3, "10.77.2.50/24")
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("sv1")
	p3, r3 := n3.RunPod("sv3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	_, idx1 := n1.HostVeth("sv1")
	iptablesIn(t, n1, "iptables",
		[]string{"-t", "nat", "-A", "PREROUTING", "-d", "10.96.77.78", "-p", "udp", "--dport", "53", "-j", "DNAT", "--to-destination", "10.77.2.50:4789"})

	got := listenUDP4(t, p3, 9985)
	seq := lastSeq(t, n1)
	before := counter(t, n1.Maps(), idx1, maps.DirEgress, maps.ReasonDropTunSrc).Packets
	sendUDPFrom(t, p1, net.ParseIP("10.96.77.78"), 53, vxlanFrame(neighbour(a1), a3, 9985, []byte("service-to-secondary")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("p3 received %q through a Service to node 3's unlisted address", arrived)
	}
	evs := tunDropEvents(t, n1, idx1, maps.DirEgress, maps.ReasonDropTunSrc, before, 1, seq)
	if len(evs) == 1 && (evs[0].Dst != "10.77.2.50" || evs[0].DstPort != 4789) {
		t.Errorf("event %+v: want udp to 10.77.2.50:4789 (after the DNAT)", evs[0])
	}
}

// TestTunnelPodVXLANHybridUnlistedAddress: in hybrid mode node 2 is direct
// (same subnet), yet its tunnel socket decapsulates too. p1's datagram to
// node 2's unlisted second address is dropped as it leaves; p1's VXLAN to
// pod p2 itself (its own address, inside the cluster: not masqueraded)
// still reaches p2, which is a pod's business.
func TestTunnelPodVXLANHybridUnlistedAddress(t *testing.T) {
	lab := newTunLab(t)
	n1, n2 := lab.nodes[0], lab.nodes[1]
	addUplinkAddr(t, n2, "10.77.1.50/24")
	startTunAgents(t, lab, "--tunnel-hybrid")
	p1, r1 := n1.RunPod("hy1")
	p2, r2 := n2.RunPod("hy2")
	a1, _ := testenv.PodIPs(t, r1)
	a2, _ := testenv.PodIPs(t, r2)
	_, idx1 := n1.HostVeth("hy1")

	got := listenUDP4(t, p2, 9984)
	seq := lastSeq(t, n1)
	before := counter(t, n1.Maps(), idx1, maps.DirEgress, maps.ReasonDropTunSrc).Packets
	sendUDPFrom(t, p1, net.ParseIP("10.77.1.50"), datapath.VXLANPort, vxlanFrame(neighbour(a1), a2, 9984, []byte("hybrid-secondary")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("p2 received %q through node 2's unlisted address", arrived)
	}
	tunDropEvents(t, n1, idx1, maps.DirEgress, maps.ReasonDropTunSrc, before, 1, seq)

	vx := listenUDP4(t, p2, datapath.VXLANPort)
	sendUDPFrom(t, p1, a2, datapath.VXLANPort, []byte("pod-vxlan-to-pod"))
	if arrived := vx(3 * time.Second); len(arrived) != 1 || !strings.Contains(arrived[0], a1.String()) {
		t.Errorf("p2 received %q on UDP 4789, want p1's datagram from its own address %s", arrived, a1)
	}
}

// TestTunnelOuterDestination: the receiving node's own check, for a
// sender that skipped its node's (root on node 1 sends as node 1). A
// datagram from node 1's address, through the router's MAC, with an inner
// source of node 1's pods, to node 3's unlisted address: node 3's tunnel
// device drops it (drop_tunnel_source, ingress, with an event), IPv4 and
// IPv6 outer headers. The same frames to node 3's listed addresses are
// delivered.
func TestTunnelOuterDestination(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	second, second6 := addSecondAddrs(t, n3, "10.77.2.50", "fd77:2::50")
	startTunAgents(t, lab)
	_, r1 := n1.RunPod("od1")
	p3, r3 := n3.RunPod("od3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	testenv.WaitIPv6Ready(t, n3.Node)
	idx3, _, _ := tunDevice(t, n3)

	got := listenUDP4(t, p3, 9983)
	// Control: to the addresses node 3 is known by.
	sendTunnelPortAs(t, n1, tunNode[0], tunNode[2], datapath.VXLANPort, vxlanFrame(neighbour(a1), a3, 9983, []byte("listed")))
	sendTunnelPortAs(t, n1, tunNode6[0], tunNode6[2], datapath.VXLANPort, vxlanFrame(neighbour(a1), a3, 9983, []byte("listed6")))
	if arrived := got(3 * time.Second); len(arrived) != 2 {
		t.Fatalf("p3 received %q, want both frames sent to node 3's listed addresses", arrived)
	}
	seq := lastSeq(t, n3)
	before := counter(t, n3.Maps(), idx3, maps.DirIngress, maps.ReasonDropTunSrc).Packets
	sendTunnelPortAs(t, n1, tunNode[0], second, datapath.VXLANPort, vxlanFrame(neighbour(a1), a3, 9983, []byte("unlisted")))
	sendTunnelPortAs(t, n1, tunNode6[0], second6, datapath.VXLANPort, vxlanFrame(neighbour(a1), a3, 9983, []byte("unlisted6")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("p3 received %q sent to node 3's unlisted addresses", arrived)
	}
	tunDropEvents(t, n3, idx3, maps.DirIngress, maps.ReasonDropTunSrc, before, 2, seq)
}

// TestTunnelPodVXLANToTunnelAddress: node 3's tunnel device holds the
// network address of its pod CIDR (for the masquerade into the tunnel),
// which node 3's tunnel socket decapsulates like any of its addresses.
// Pod p1 of node 1 sends VXLAN there, through the tunnel (inside the
// cluster CIDRs: not masqueraded), claiming its neighbour's address to p3:
// the inner datagram's outer source is p1's own, no node's, and it went to
// an address node 3 is not known by, so node 3 drops it; p3 receives
// nothing.
func TestTunnelPodVXLANToTunnelAddress(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("ta1")
	p3, r3 := n3.RunPod("ta3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	idx3, _, _ := tunDevice(t, n3)
	p4, _ := tunPods(2)
	_, cidr3, _ := net.ParseCIDR(p4)
	m3 := n3.Maps()
	before := counter(t, m3, idx3, maps.DirIngress, maps.ReasonDropTunNode).Packets + counter(t, m3, idx3, maps.DirIngress, maps.ReasonDropTunSrc).Packets

	got := listenUDP4(t, p3, 9981)
	sendUDPFrom(t, p1, cidr3.IP, datapath.VXLANPort, vxlanFrame(neighbour(a1), a3, 9981, []byte("via-tunnel-address")))
	if arrived := got(3 * time.Second); len(arrived) != 0 {
		t.Errorf("p3 received %q through node 3's tunnel device address %s", arrived, cidr3.IP)
	}
	after := counter(t, m3, idx3, maps.DirIngress, maps.ReasonDropTunNode).Packets + counter(t, m3, idx3, maps.DirIngress, maps.ReasonDropTunSrc).Packets
	if after-before != 1 {
		t.Errorf("node 3's tunnel device: %d drops of the inner datagram, want 1", after-before)
	}
	// Control: the address is there, and p1 reaches p3.
	sendUDPFrom(t, p1, a3, 9981, []byte("genuine"))
	if arrived := got(3 * time.Second); len(arrived) != 1 {
		t.Errorf("p3 received %q, want p1's genuine datagram", arrived)
	}
}
