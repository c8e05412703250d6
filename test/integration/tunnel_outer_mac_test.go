// The tunnel's outer source (docs/tunnel.md): a tunnel datagram claiming a
// node's address is accepted off an uplink only from the MAC of the next
// hop toward that node (the router's for a node of another subnet, the
// node's own on a shared one), IPv4 and IPv6 outer headers.

package integration

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// sendVXLANAs sends one frame from netns to node:4789 with src (IPv4 or
// IPv6, added to the sender's loopback first) as the outer source.
func sendVXLANAs(t *testing.T, from ns.NetNS, src, node net.IP, frame []byte) {
	t.Helper()
	must(t, from.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		netlink.LinkSetUp(lo)
		bits := 32
		if src.To4() == nil {
			bits = 128
		}
		if err := labAddr(lo, src.String()+"/"+strconv.Itoa(bits)); err != nil && !strings.Contains(err.Error(), "exists") {
			return err
		}
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: src}, &net.UDPAddr{IP: node, Port: datapath.VXLANPort})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(frame)
		return err
	}))
}

// uplinkIndex is the ifindex of a node's uplink0.
func uplinkIndex(t *testing.T, e *testenv.Env) int {
	t.Helper()
	var idx int
	must(t, e.InNode(func() error {
		l, err := netlink.LinkByName("uplink0")
		if err == nil {
			idx = l.Attrs().Index
		}
		return err
	}))
	return idx
}

// TestTunnelOuterMAC: node 1 takes VXLAN from node 3 (through the router)
// and node 2 (same subnet), pod traffic and a datagram node 3 sends from
// its IPv6 address; the stranger on subnet A claiming node 3's address
// (IPv4, IPv6) or node 2's is dropped at node 1's uplink as
// drop_tunnel_mac, each with an event, and pod 1 receives none of it; so
// are its raw frames behind IPv6 extension headers and in IPv4 fragments.
func TestTunnelOuterMAC(t *testing.T) {
	lab := newTunLab6(t)
	n1, n2, n3 := lab.nodes[0], lab.nodes[1], lab.nodes[2]
	// The stranger answers ARP for no address it borrows (on its loopback):
	// ARP spoofing is beyond what this check can stop (docs/tunnel.md).
	must(t, lab.strang.Do(func(ns.NetNS) error { return tunSysctl("net.ipv4.conf.all.arp_ignore", "1") }))
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("m1")
	p2, r2 := n2.RunPod("m2")
	p3, r3 := n3.RunPod("m3")
	a1, _ := testenv.PodIPs(t, r1)
	a2, _ := testenv.PodIPs(t, r2)
	a3, _ := testenv.PodIPs(t, r3)
	up1 := uplinkIndex(t, n1)
	m1 := n1.Maps()

	got := listenUDP4(t, p1, 9990)
	// Genuine: pods of node 3 (routed) and node 2 (same subnet, tunnelled:
	// no hybrid), and node 3's own datagram over IPv6.
	sendUDPFrom(t, p3, a1, 9990, []byte("from-pod3"))
	sendUDPFrom(t, p2, a1, 9990, []byte("from-pod2"))
	sendVXLANAs(t, n3.Node, tunNode6[2], tunNode6[0], vxlanFrame(a3, a1, 9990, []byte("node3-over-ipv6")))
	arrived := got(3 * time.Second)
	for _, want := range []string{"from-pod3 from " + a3.String(), "from-pod2 from " + a2.String(), "node3-over-ipv6 from " + a3.String()} {
		found := false
		for _, a := range arrived {
			found = found || strings.HasPrefix(a, want)
		}
		if !found {
			t.Errorf("pod 1 did not receive %q (got %q)", want, arrived)
		}
	}
	if n := counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunMAC).Packets; n != 0 {
		t.Errorf("%d drop_tunnel_mac of genuine tunnel traffic", n)
	}

	// Forged: the stranger's own MAC with node 3's and node 2's addresses.
	seq := lastSeq(t, n1)
	sendVXLANAs(t, lab.strang, tunNode[2], tunNode[0], vxlanFrame(a3, a1, 9990, []byte("spoof-node3")))
	sendVXLANAs(t, lab.strang, tunNode6[2], tunNode6[0], vxlanFrame(a3, a1, 9990, []byte("spoof-node3-ipv6")))
	sendVXLANAs(t, lab.strang, tunNode[1], tunNode[0], vxlanFrame(a2, a1, 9990, []byte("spoof-node2")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q: the stranger injected as a node's pod", arrived)
	}
	evs := tunDropEvents(t, n1, up1, maps.DirIngress, maps.ReasonDropTunMAC, 0, 3, seq)
	srcs := map[string]bool{}
	for _, ev := range evs {
		srcs[ev.Src] = ev.Protocol == "udp" && ev.DstPort == 4789
	}
	for _, s := range []net.IP{tunNode[2], tunNode6[2], tunNode[1]} {
		if !srcs[s.String()] {
			t.Errorf("no drop_tunnel_mac event of udp from %s to port 4789: %+v", s, evs)
		}
	}
	// Raw frames from the stranger's own MAC: IPv6 datagrams behind
	// extension headers, and an IPv4 one in two fragments (the first, with
	// the UDP header, is dropped; the second alone never reassembles).
	strMAC, n1MAC := linkMAC(t, lab.strang, "uplink0"), linkMAC(t, n1.Node, "uplink0")
	seq = lastSeq(t, n1)
	before := counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunMAC).Packets
	frames := [][]byte{
		udp6ExtFrame(strMAC, n1MAC, tunNode6[2], tunNode6[0], 4789, []byte{60}, vxlanFrame(a3, a1, 9990, []byte("spoof-dstopts"))),
		udp6ExtFrame(strMAC, n1MAC, tunNode6[2], tunNode6[0], 4789, []byte{0, 44}, vxlanFrame(a3, a1, 9990, []byte("spoof-hbh-frag"))),
	}
	frames = append(frames, udp4Fragments(strMAC, n1MAC, tunNode[2], tunNode[0], 4789, vxlanFrame(a3, a1, 9990, []byte("spoof-fragmented")))...)
	sendFrames(t, lab.strang, "uplink0", frames)
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q: the stranger's raw frames got through", arrived)
	}
	tunDropEvents(t, n1, up1, maps.DirIngress, maps.ReasonDropTunMAC, before, 3, seq)

	// Node 3's genuine traffic still passes after the forgeries.
	sendUDPFrom(t, p3, a1, 9990, []byte("from-pod3-again"))
	if arrived := got(2 * time.Second); len(arrived) != 1 {
		t.Errorf("pod 1 received %q after the forgeries, want pod 3's datagram", arrived)
	}
}

// udp4Fragments is an IPv4 UDP datagram sip:5555 -> dip:dport (checksum
// 0: none) in two fragments: the UDP header and 24 bytes, then the rest.
func udp4Fragments(src, dst net.HardwareAddr, sip, dip net.IP, dport int, payload []byte) [][]byte {
	udp := []byte{0x15, 0xb3, byte(dport >> 8), byte(dport), byte((8 + len(payload)) >> 8), byte(8 + len(payload)), 0, 0}
	udp = append(udp, payload...)
	frag := func(part []byte, off int, more bool) []byte {
		h := make([]byte, 20)
		h[0], h[8], h[9] = 0x45, 64, 17
		total := 20 + len(part)
		h[2], h[3] = byte(total>>8), byte(total)
		h[4], h[5] = 0x7e, 0x57 // identification
		fo := off / 8
		if more {
			fo |= 0x2000
		}
		h[6], h[7] = byte(fo>>8), byte(fo)
		copy(h[12:], sip.To4())
		copy(h[16:], dip.To4())
		c := csumFold(csumAdd(0, h))
		h[10], h[11] = byte(c>>8), byte(c)
		return append(append(ethHeader(src, dst, 0x0800), h...), part...)
	}
	return [][]byte{frag(udp[:32], 0, true), frag(udp[32:], 32, false)}
}
