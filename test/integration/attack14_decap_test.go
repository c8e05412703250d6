// attack14: hostile review of the tunnel's trust rules from outside
// (docs/tunnel.md, "Only nodes may tunnel"), written against a build that
// decapsulated genuine nodes' VXLAN at the uplink in BPF (tunnel12, not
// landed: docs/tunnel.md "Decapsulation at the uplink, tried"): forged VXLAN
// from a node, from a stranger, from pods, malformed outer and inner
// headers, a node that left. The checksum, length, host firewall and IPsec
// tests were red on that build (the socket's checks skipped) and guard any
// later decapsulation outside the tunnel socket.

package integration

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

var (
	a14InnerDst   = net.HardwareAddr{2, 0, 0, 0, 0, 1}
	a14InnerSrc   = net.HardwareAddr{2, 0, 0, 0, 0, 2}
	a14Broadcast  = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	a14ServiceIP  = net.ParseIP("10.96.14.14").To4()
	a14DropReason = []maps.Reason{maps.ReasonDropTunNode, maps.ReasonDropTunSrc, maps.ReasonDropTunMAC}
)

// a14VXLAN is a VXLAN header (I flag, vni) and an inner Ethernet frame.
func a14VXLAN(vni uint32, dst net.HardwareAddr, etype uint16, l3 []byte) []byte {
	b := []byte{0x08, 0, 0, 0, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
	b = append(b, ethHeader(a14InnerSrc, dst, etype)...)
	return append(b, l3...)
}

// a14IP4UDP is an IPv4 UDP packet (checksum 0) with IP options opts (a
// multiple of 4 bytes) and the fragment field frag (flags and offset).
func a14IP4UDP(src, dst net.IP, dport int, payload, opts []byte, frag uint16, udpLen int) []byte {
	hl := 20 + len(opts)
	h := make([]byte, hl)
	h[0], h[8], h[9] = byte(0x40|hl/4), 64, 17
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], 5555)
	binary.BigEndian.PutUint16(udp[2:], uint16(dport))
	if udpLen == 0 {
		udpLen = 8 + len(payload)
	}
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	body := append(udp, payload...)
	binary.BigEndian.PutUint16(h[2:], uint16(hl+len(body)))
	binary.BigEndian.PutUint16(h[4:], 0x1414)
	binary.BigEndian.PutUint16(h[6:], frag)
	copy(h[12:], src.To4())
	copy(h[16:], dst.To4())
	copy(h[20:], opts)
	binary.BigEndian.PutUint16(h[10:], csumFold(csumAdd(0, h)))
	return append(h, body...)
}

// a14IP6UDP is an IPv6 UDP packet with a valid checksum.
func a14IP6UDP(src, dst net.IP, dport int, payload []byte) []byte {
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], 5555)
	binary.BigEndian.PutUint16(udp[2:], uint16(dport))
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	udp = append(udp, payload...)
	pseudo := append(append(append([]byte{}, src.To16()...), dst.To16()...), 0, 0, byte(len(udp)>>8), byte(len(udp)), 0, 0, 0, 17)
	binary.BigEndian.PutUint16(udp[6:], csumFold(csumAdd(csumAdd(0, pseudo), udp)))
	h := make([]byte, 40)
	h[0], h[6], h[7] = 0x60, 17, 64
	binary.BigEndian.PutUint16(h[4:], uint16(len(udp)))
	copy(h[8:], src.To16())
	copy(h[24:], dst.To16())
	return append(h, udp...)
}

// a14Send sends one UDP datagram from netns from to node:4789, with the
// outer IPv4 header's options opts (none: nil) and, with frag, path MTU
// discovery off so that a datagram larger than the link leaves in
// fragments (neither: sendVXLAN).
func a14Send(t *testing.T, from ns.NetNS, node net.IP, payload, opts []byte, frag bool) {
	t.Helper()
	must(t, from.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: node, Port: datapath.VXLANPort})
		if err != nil {
			return err
		}
		defer c.Close()
		err = sockSetup(c, func(fd int) error {
			if opts != nil {
				if err := unix.SetsockoptString(fd, unix.IPPROTO_IP, unix.IP_OPTIONS, string(opts)); err != nil {
					return err
				}
			}
			if frag {
				return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT)
			}
			return nil
		})
		if err != nil {
			return err
		}
		_, err = c.Write(payload)
		return err
	}))
}

// a14Drops sums the tunnel drop reasons counted at ingress of the links
// idxs of node e.
func a14Drops(t *testing.T, e *testenv.Env, idxs ...int) uint64 {
	t.Helper()
	var n uint64
	m := e.Maps()
	for _, i := range idxs {
		for _, r := range a14DropReason {
			n += counter(t, m, i, maps.DirIngress, r).Packets
		}
	}
	return n
}

// a14WaitDrops waits up to 3 s for the drops of node e's links idxs to
// reach want, and returns them.
func a14WaitDrops(t *testing.T, e *testenv.Env, before, want uint64, idxs ...int) uint64 {
	t.Helper()
	var got uint64
	for end := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		got = a14Drops(t, e, idxs...) - before
		if got >= want || time.Now().After(end) {
			return got
		}
	}
}

// TestAttack14DecapForged: node 3 is a genuine node (its outer address and
// MAC path are right) and forges inner packets to node 1 in every shape the
// uplink's decapsulation might parse differently from the socket's; a host
// that is no node, a pod of node 1 and a pod of node 3 send VXLAN too.
// Nothing forged may reach pod 1, node 1, a Service endpoint or node 2's
// pod, and each forged inner packet is one counted drop on node 1 (its
// tunnel device or its uplink). Node 3's genuine datagrams (one of them
// in outer fragments) still arrive afterwards.
func TestAttack14DecapForged(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	pods, a4, a6 := lab.podPerNode(t, "fx")
	p1, p2, p3 := pods[0], pods[1], pods[2]
	a1, a2, a3 := a4[0], a4[1], a4[2]
	a16, a26 := a6[0], a6[1]
	must(t, n1.InNode(func() error {
		out, err := exec.Command("iptables", "-t", "nat", "-A", "PREROUTING", "-d", a14ServiceIP.String(), "-p", "udp", "--dport", "53",
			"-j", "DNAT", "--to-destination", a1.String()+":9701").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}))
	for _, dst := range []net.IP{a1, a16} {
		if err := testenv.Ping(p3, dst, 2); err != nil {
			t.Fatal(err)
		}
	}
	pod1, pod16 := listenUDP4(t, p1, 9701), listenUDP6(t, p1, 9701)
	node1, pod2 := listenUDP4(t, n1.Node, 9702), listenUDP4(t, p2, 9703)
	idxT, _, _ := tunDevice(t, n1)
	idxU := uplinkIndex(t, n1)
	before := a14Drops(t, n1, idxT, idxU)

	ip4 := func(src, dst net.IP, port int, what string) []byte {
		return a14IP4UDP(src, dst, port, []byte(what), nil, 0x4000, 0)
	}
	eth4 := func(l3 []byte) []byte { return a14VXLAN(1, a14InnerDst, 0x0800, l3) }
	forged := []struct {
		name  string
		frame []byte
		opts  []byte
		frag  bool
		drops uint64
	}{
		{"other-node", eth4(ip4(a2, a1, 9701, "other-node")), nil, false, 1},
		{"own-range", eth4(ip4(neighbour(a1), a1, 9701, "own-range")), nil, false, 1},
		{"vni7", a14VXLAN(7, a14InnerDst, 0x0800, ip4(a2, a1, 9701, "vni7")), nil, false, 1},
		{"ipv6-inner", a14VXLAN(1, a14InnerDst, 0x86dd, a14IP6UDP(a26, a16, 9701, []byte("ipv6-inner"))), nil, false, 1},
		{"bcast-mac", a14VXLAN(1, a14Broadcast, 0x0800, ip4(a2, a1, 9701, "bcast-mac")), nil, false, 1},
		{"bcast-ip", a14VXLAN(1, a14Broadcast, 0x0800, ip4(a2, net.IPv4bcast.To4(), 9701, "bcast-ip")), nil, false, 1},
		{"inner-ipopts", eth4(a14IP4UDP(a2, a1, 9701, []byte("inner-ipopts"), []byte{1, 1, 1, 0}, 0, 0)), nil, false, 1},
		{"inner-frag1", eth4(a14IP4UDP(a2, a1, 9701, []byte("inner-frag-part1"), nil, 0x2000, 8+16+16)), nil, false, 1},
		{"inner-frag2", eth4(append(a14IP4UDP(a2, a1, 9701, nil, nil, 0x0003, 0)[:20], []byte("inner-frag-part2")...)), nil, false, 1},
		{"outer-ipopts", eth4(ip4(a2, a1, 9701, "outer-ipopts")), []byte{1, 1, 1, 0}, false, 1},
		{"outer-frag", eth4(ip4(a2, a1, 9701, "outer-frag"+strings.Repeat("x", 1360))), nil, true, 1},
		{"to-node", eth4(ip4(a2, tunNode[0], 9702, "to-node")), nil, false, 1},
		{"to-service", eth4(ip4(a2, a14ServiceIP, 53, "to-service")), nil, false, 1},
		{"to-other-node-pod", eth4(ip4(neighbour(a2), a2, 9703, "to-other-node-pod")), nil, false, 1},
	}
	var want uint64
	for _, f := range forged {
		a14Send(t, n3.Node, tunNode[0], f.frame, f.opts, f.frag)
		want += f.drops
	}
	// Truncated and inconsistent datagrams: nothing may come of them.
	junk := [][]byte{
		{0x08, 0, 0, 0},             // half a VXLAN header
		{0x08, 0, 0, 0, 0, 0, 1, 0}, // the header alone
		a14VXLAN(1, a14InnerDst, 0x0800, nil),
		a14VXLAN(1, a14InnerDst, 0x0800, ip4(a3, a1, 9701, "short")[:10]),
		a14VXLAN(1, a14InnerDst, 0x0806, append([]byte{0, 1, 8, 0, 6, 4, 0, 1}, make([]byte, 20)...)), // ARP
	}
	// An inner IPv4 header claiming more than the frame holds.
	long := ip4(a2, a1, 9701, "inner-longer-than-frame")
	binary.BigEndian.PutUint16(long[2:], 600)
	long[10], long[11] = 0, 0
	binary.BigEndian.PutUint16(long[10:], csumFold(csumAdd(0, long[:20])))
	junk = append(junk, eth4(long))
	want++ // its inner source is node 2's pod: the one junk frame the trust rule judges
	for _, j := range junk {
		sendVXLAN(t, n3.Node, tunNode[0], j)
	}
	// A host that is no node.
	sendVXLAN(t, lab.strang, tunNode[0], eth4(ip4(a3, a1, 9701, "stranger")))
	want++
	// Pods sending VXLAN themselves: pod 1 to its own node, pod 3 to node 1.
	_, h1 := n1.HostVeth("fx1")
	_, h3 := n3.HostVeth("fx3")
	hb1 := counter(t, n1.Maps(), h1, maps.DirEgress, maps.ReasonDropTunSrc).Packets
	hb3 := counter(t, n3.Maps(), h3, maps.DirEgress, maps.ReasonDropTunSrc).Packets
	sendUDPFrom(t, p1, tunNode[0], datapath.VXLANPort, eth4(ip4(a3, a1, 9701, "pod1-to-own-node")))
	sendUDPFrom(t, p3, tunNode[0], datapath.VXLANPort, eth4(ip4(neighbour(a3), a1, 9701, "pod3-to-node1")))

	arrived := append(pod1(3*time.Second), pod16(100*time.Millisecond)...)
	arrived = append(append(arrived, node1(100*time.Millisecond)...), pod2(100*time.Millisecond)...)
	if len(arrived) != 0 {
		t.Errorf("forged inner packets arrived: %q", arrived)
	}
	if got := a14WaitDrops(t, n1, before, want, idxT, idxU); got != want {
		t.Errorf("node 1 counted %d tunnel drops (tunnel device and uplink), want %d (one per forged inner packet)\ntunnel device: %s\nuplink: %s",
			got, want, dumpCounters(n1.Maps(), idxT), dumpCounters(n1.Maps(), idxU))
	}
	for _, c := range []struct {
		name       string
		e          *testenv.Env
		idx        int
		before     uint64
		hostVethOf string
	}{{"pod 1 to node 1", n1, h1, hb1, "fx1"}, {"pod 3 to node 1", n3, h3, hb3, "fx3"}} {
		if d := counter(t, c.e.Maps(), c.idx, maps.DirEgress, maps.ReasonDropTunSrc).Packets - c.before; d != 1 {
			t.Errorf("%s: its host veth counted %d drop_tunnel_source, want 1", c.name, d)
		}
	}

	// Genuine datagrams of node 3 still arrive: plain, and in outer
	// fragments (a 1430-byte datagram over node 3's 1400-byte link), as the
	// tunnel socket took them.
	sendVXLAN(t, n3.Node, tunNode[0], eth4(ip4(a3, a1, 9701, "genuine")))
	a14Send(t, n3.Node, tunNode[0], eth4(ip4(a3, a1, 9701, "genuine-outer-frag"+strings.Repeat("y", 1360))), nil, true)
	got := pod1(3 * time.Second)
	if m := missing(got, []string{"genuine from", "genuine-outer-frag"}); len(m) != 0 {
		t.Errorf("node 3's genuine datagrams lost: %q (arrived %d: %.60q)", m, len(got), got)
	}
	if err := testenv.Ping(p3, a1, 2); err != nil {
		t.Errorf("pod 3 to pod 1 after the attack: %v", err)
	}
}

// TestAttack14DecapBadOuterChecksum: node 3's genuine datagram (its pod to
// pod 1) with a wrong outer UDP checksum: the tunnel socket refuses it
// (UDP checksum error), so the uplink's decapsulation, which skips the
// socket, must not deliver it either; the same datagram with checksum 0
// (IPv4's "none", as nodes send) arrives.
func TestAttack14DecapBadOuterChecksum(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("bc1")
	p3, r3 := n3.RunPod("bc3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	if err := testenv.Ping(p3, a1, 2); err != nil {
		t.Fatal(err)
	}
	got := listenUDP4(t, p1, 9704)
	a14SendRaw(t, n3.Node, tunNode[2], tunNode[0], vxlanFrame(a3, a1, 9704, []byte("bad-outer-csum")), "bad", 0)
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q: a datagram whose outer UDP checksum is wrong was decapsulated (the socket refuses it)", arrived)
	}
	sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(a3, a1, 9704, []byte("zero-csum")))
	if arrived := got(2 * time.Second); len(arrived) != 1 {
		t.Errorf("pod 1 received %q, want the control datagram", arrived)
	}
}

// TestAttack14DecapSpoofedOnOtherLink: node 1 has a second link (a
// private network, its own address, rp_filter loose as the tunnel docs
// allow) to a host that is no node. That host sends VXLAN with node 3's
// address as the outer source, to node 1's address, through that link,
// inner source node 3's pod: docs/tunnel.md's check 1 wants a node's
// datagram from the next hop toward that node, on the link the route back
// leaves by (uplink0 here). Pod 1 must receive nothing.
func TestAttack14DecapSpoofedOnOtherLink(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	side := testenv.NewNS(t)
	must(t, n1.InNode(func() error {
		l, err := vethTo("side0", "side0", side)
		if err != nil {
			return err
		}
		if err := labAddr(l, "192.168.77.1/24"); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	}))
	must(t, side.Do(func(ns.NetNS) error {
		return ipCmds([]string{"link", "set", "lo", "up"}, []string{"addr", "add", "192.168.77.2/24", "dev", "side0", "nodad"},
			[]string{"link", "set", "side0", "up"}, []string{"route", "add", "10.77.1.0/24", "via", "192.168.77.1"})
	}))
	looseRPFilter(t, n1)
	must(t, n1.InNode(func() error { return tunSysctl("net.ipv4.conf.side0.rp_filter", "2") }))
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("ol1")
	p3, r3 := n3.RunPod("ol3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	if err := testenv.Ping(p3, a1, 2); err != nil {
		t.Fatal(err)
	}
	got := listenUDP4(t, p1, 9705)
	sendVXLANAs(t, side, tunNode[2], tunNode[0], vxlanFrame(a3, a1, 9705, []byte("side-as-node3")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		var links string
		n1.InNode(func() error {
			b, _ := exec.Command("bpftool", "net", "show").CombinedOutput()
			links = string(b)
			return nil
		})
		t.Errorf("pod 1 received %q: a host on node 1's second link passed as node 3 (outer source spoofed, not from the next hop toward node 3)\n%s", arrived, links)
	}
	// Control: node 3 itself.
	sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(a3, a1, 9705, []byte("node3")))
	if arrived := got(2 * time.Second); len(arrived) != 1 {
		t.Errorf("pod 1 received %q, want node 3's datagram", arrived)
	}
}

// TestAttack14DecapNodeLeft: node 3 leaves the peers file (written
// through a rename, as the agent reads it) while it keeps sending: once
// node 1's agent dropped its routes, node 3's VXLAN for its (former) pod
// to pod 1 must not arrive, whether right after genuine traffic (the
// outer-MAC check's remembered answer) or later, and is counted.
func TestAttack14DecapNodeLeft(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	// The agent reads the peers file at each reconcile.
	startTunAgents(t, lab, "--reconcile-interval", "1s")
	p1, r1 := n1.RunPod("nl1")
	p3, r3 := n3.RunPod("nl3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	if err := testenv.Ping(p3, a1, 2); err != nil {
		t.Fatal(err)
	}
	got := listenUDP4(t, p1, 9706)
	sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(a3, a1, 9706, []byte("before-leaving")))
	if arrived := got(2 * time.Second); len(arrived) != 1 {
		t.Fatalf("pod 1 received %q before node 3 left, want 1", arrived)
	}
	var peers []agent.Peer
	for i := 0; i < 2; i++ {
		p4, p6 := tunPods(i)
		peers = append(peers, agent.Peer{NodeIP: tunNode[i].String(), PodCIDRs: []string{p4, p6}})
	}
	a14WritePeers(t, lab.peers, peers)
	var routes string
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		n1.InNode(func() error {
			b, _ := exec.Command("ip", "route", "show", "proto", "199").CombinedOutput()
			routes = string(b)
			return nil
		})
		if !strings.Contains(routes, tunNode[2].String()) {
			break
		}
	}
	if strings.Contains(routes, tunNode[2].String()) {
		t.Fatalf("node 1 still routes to node 3 15 s after it left the peers file:\n%s", routes)
	}
	idxT, _, _ := tunDevice(t, n1)
	idxU := uplinkIndex(t, n1)
	before := a14Drops(t, n1, idxT, idxU)
	for i := 0; i < 3; i++ {
		sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(a3, a1, 9706, []byte(fmt.Sprintf("after-leaving-%d", i))))
		time.Sleep(200 * time.Millisecond)
	}
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q from node 3 after it left the peers", arrived)
	}
	if d := a14WaitDrops(t, n1, before, 3, idxT, idxU); d != 3 {
		t.Errorf("node 1 counted %d tunnel drops for node 3's 3 datagrams after it left, want 3\ntunnel device: %s\nuplink: %s",
			d, dumpCounters(n1.Maps(), idxT), dumpCounters(n1.Maps(), idxU))
	}
}

// a14WritePeers replaces the peers file through a rename.
func a14WritePeers(t *testing.T, path string, peers []agent.Peer) {
	t.Helper()
	b, err := json.Marshal(peers)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(filepath.Dir(path), ".peers.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// a14SendRaw sends payload from src to node:4789 (IPv4 or IPv6) through a
// raw socket: csum "zero" (none), "bad" (a wrong non-zero one) or "good";
// udpLen, when not 0, replaces the UDP length field.
func a14SendRaw(t *testing.T, from ns.NetNS, src, node net.IP, payload []byte, csum string, udpLen int) {
	t.Helper()
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], uint16(datapath.VXLANPort))
	if udpLen == 0 {
		udpLen = 8 + len(payload)
	}
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	udp = append(udp, payload...)
	var pseudo []byte
	network := "ip4:udp"
	if src.To4() != nil {
		pseudo = append(append(append([]byte{}, src.To4()...), node.To4()...), 0, 17, byte(udpLen>>8), byte(udpLen))
	} else {
		network = "ip6:udp"
		pseudo = append(append(append([]byte{}, src.To16()...), node.To16()...), 0, 0, byte(udpLen>>8), byte(udpLen), 0, 0, 0, 17)
	}
	sum := csumFold(csumAdd(csumAdd(0, pseudo), udp[:min(udpLen, len(udp))]))
	switch csum {
	case "zero":
		sum = 0
	case "bad":
		if sum ^= 0x5a5a; sum == 0 {
			sum = 1
		}
	}
	binary.BigEndian.PutUint16(udp[6:], sum)
	must(t, from.Do(func(ns.NetNS) error {
		c, err := net.ListenPacket(network, src.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.WriteTo(udp, &net.IPAddr{IP: node})
		return err
	}))
}

// TestAttack14DecapMalformedOuterUDP: node 3's genuine datagrams (its pod
// to pod 1) whose outer UDP header is wrong in ways the tunnel socket
// refuses: a UDP length shorter than the datagram that cuts the inner IPv4
// header (the socket trims to it), and over the IPv6 underlay a zero
// checksum (udp6zerocsumrx off) and a wrong one. None may be delivered;
// the same frames well formed are.
func TestAttack14DecapMalformedOuterUDP(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("mu1")
	p3, r3 := n3.RunPod("mu3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	testenv.WaitIPv6Ready(t, n3.Node)
	if err := testenv.Ping(p3, a1, 2); err != nil {
		t.Fatal(err)
	}
	got := listenUDP4(t, p1, 9707)
	frame := func(s string) []byte { return vxlanFrame(a3, a1, 9707, []byte(s)) }
	// The UDP length ends 10 bytes into the inner IPv4 header.
	a14SendRaw(t, n3.Node, tunNode[2], tunNode[0], frame("udp-length-short"), "good", 8+8+14+10)
	a14SendRaw(t, n3.Node, tunNode6[2], tunNode6[0], frame("ipv6-zero-csum"), "zero", 0)
	a14SendRaw(t, n3.Node, tunNode6[2], tunNode6[0], frame("ipv6-bad-csum"), "bad", 0)
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q: datagrams the tunnel socket refuses were decapsulated", arrived)
	}
	// Controls: well formed, IPv4 and IPv6 underlay.
	a14SendRaw(t, n3.Node, tunNode[2], tunNode[0], frame("ipv4-good"), "good", 0)
	a14SendRaw(t, n3.Node, tunNode6[2], tunNode6[0], frame("ipv6-good"), "good", 0)
	if arrived := got(2 * time.Second); len(missing(arrived, []string{"ipv4-good", "ipv6-good"})) != 0 {
		t.Errorf("pod 1 received %q, want both well-formed datagrams", arrived)
	}
}

// TestAttack14DecapHostFirewall: node 1's own firewall quarantines node 3
// (an INPUT rule dropping UDP 4789 from it, as an operator isolating a
// compromised node, or a host firewall admitting VXLAN from listed hosts
// only, would write). The tunnel socket sat behind that rule; the uplink's
// decapsulation must not carry node 3's pod's packets past it.
func TestAttack14DecapHostFirewall(t *testing.T) {
	lab := newTunLab(t)
	n1 := lab.nodes[0]
	startTunAgents(t, lab)
	pods, a4, _ := lab.podPerNode(t, "fw")
	p1, p2, p3 := pods[0], pods[1], pods[2]
	a1 := a4[0]
	for _, p := range []ns.NetNS{p2, p3} {
		if err := testenv.Ping(p, a1, 2); err != nil {
			t.Fatal(err)
		}
	}
	must(t, n1.InNode(func() error {
		out, err := exec.Command("iptables", "-w", "-I", "INPUT", "-p", "udp", "--dport", "4789", "-s", tunNode[2].String(), "-j", "DROP").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}))
	got := listenUDP4(t, p1, 9708)
	sendUDPFrom(t, p3, a1, 9708, []byte("quarantined-node3"))
	sendUDPFrom(t, p2, a1, 9708, []byte("node2"))
	arrived := got(2 * time.Second)
	if len(missing(arrived, []string{"node2"})) != 0 {
		t.Errorf("pod 1 received %q, want node 2's pod's datagram", arrived)
	}
	if len(missing(arrived, []string{"quarantined-node3"})) == 0 {
		var rules string
		n1.InNode(func() error {
			b, _ := exec.Command("iptables", "-w", "-nvL", "INPUT").CombinedOutput()
			rules = string(b)
			return nil
		})
		t.Errorf("pod 1 received node 3's pod's datagram through node 1's firewall rule dropping VXLAN from node 3:\n%s", rules)
	}
}

// TestAttack14DecapOuterBroadcast: node 2 (a genuine node on node 1's
// subnet) sends its pod's VXLAN to the subnet's broadcast address and to
// 255.255.255.255: the socket bound to every address takes broadcasts,
// docs/tunnel.md's check 4 wants the outer destination to be an address
// node 1 is known by. Pod 1 must receive neither, and both are counted.
func TestAttack14DecapOuterBroadcast(t *testing.T) {
	lab := newTunLab(t)
	n1, n2 := lab.nodes[0], lab.nodes[1]
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("ob1")
	p2, r2 := n2.RunPod("ob2")
	a1, _ := testenv.PodIPs(t, r1)
	a2, _ := testenv.PodIPs(t, r2)
	if err := testenv.Ping(p2, a1, 2); err != nil {
		t.Fatal(err)
	}
	idxT, _, _ := tunDevice(t, n1)
	idxU := uplinkIndex(t, n1)
	before := a14Drops(t, n1, idxT, idxU)
	got := listenUDP4(t, p1, 9709)
	for _, dst := range []net.IP{net.ParseIP("10.77.1.255").To4(), net.IPv4bcast.To4()} {
		payload := vxlanFrame(a2, a1, 9709, []byte("broadcast-"+dst.String()))
		must(t, n2.InNode(func() error {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: tunNode[1]})
			if err != nil {
				return err
			}
			defer c.Close()
			rc, _ := c.SyscallConn()
			rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1) })
			_, err = c.WriteToUDP(payload, &net.UDPAddr{IP: dst, Port: datapath.VXLANPort})
			return err
		}))
	}
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q sent to a broadcast address", arrived)
	}
	if d := a14WaitDrops(t, n1, before, 2, idxT, idxU); d != 2 {
		t.Errorf("node 1 counted %d tunnel drops for 2 broadcast datagrams, want 2\ntunnel device: %s\nuplink: %s",
			d, dumpCounters(n1.Maps(), idxT), dumpCounters(n1.Maps(), idxU))
	}
}

// TestAttack14DecapIngressPolicy: pod a of node 1 isolated for ingress,
// only node 2's pod b allowed. Node 3's pod c, whose datagrams node 1 now
// decapsulates at the uplink (the tunnel device's VXLAN receive counts
// none of its pings), must still be judged by a's ingress policy: TCP, UDP
// and ping, IPv4 and IPv6 inside, all blocked and counted; b reaches a.
func TestAttack14DecapIngressPolicy(t *testing.T) {
	lab := newTunLab(t)
	n1 := lab.nodes[0]
	n1.Extra["networkPolicy"] = true
	startTunAgents(t, lab)
	pods, a4, a6 := lab.podPerNode(t, "ip")
	a, b, c := pods[0], pods[1], pods[2]
	serve(t, a, 7003, "a")
	_, idx := n1.HostVeth("ip1")
	pw := n1.Maps().Policy().Writer()
	if err := pw.Apply(uint32(idx), policy.Endpoint{}); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []net.IP{a4[0], a6[0]} {
		reach(t, c, "tcp", ip, 7003, "a")
	}
	if err := pw.Apply(uint32(idx), policy.Endpoint{Ingress: isolated(
		allowAll(prefix(a4[1].String()+"/32")), allowAll(prefix(a6[1].String()+"/128")))}); err != nil {
		t.Fatal(err)
	}
	drops0 := counter(t, n1.Maps(), idx, maps.DirIngress, maps.ReasonDropPolicy).Packets + counter(t, n1.Maps(), idx, maps.DirEgress, maps.ReasonDropPolicy).Packets
	rx0 := tunRx(t, n1)
	for _, ip := range []net.IP{a4[0], a6[0]} {
		if err := testenv.Ping(c, ip, 1); err == nil {
			t.Errorf("node 3's pod pinged %s, whose ingress admits node 2's pod only", ip)
		}
		blocked(t, c, "tcp", ip, 7003)
		blocked(t, c, "udp", ip, 7003)
	}
	rx := tunRx(t, n1) - rx0
	drops := counter(t, n1.Maps(), idx, maps.DirIngress, maps.ReasonDropPolicy).Packets + counter(t, n1.Maps(), idx, maps.DirEgress, maps.ReasonDropPolicy).Packets - drops0
	t.Logf("tunnel device's VXLAN receive counted %d packets during the blocked attempts; %d policy drops on a's host veth", rx, drops)
	if drops == 0 {
		t.Errorf("no policy drop counted on a's host veth for node 3's pod's blocked attempts")
	}
	for _, ip := range []net.IP{a4[0], a6[0]} {
		reach(t, b, "tcp", ip, 7003, "a")
		reach(t, b, "udp", ip, 7003, "a")
	}
}

// a14Send6DstOpts sends payload from node e's address src to dst:4789
// over UDP with an IPv6 destination options header (without it:
// sendTunnelPortAs).
func a14Send6DstOpts(t *testing.T, e *testenv.Env, src, dst net.IP, payload []byte) {
	t.Helper()
	must(t, e.InNode(func() error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: src}, &net.UDPAddr{IP: dst, Port: datapath.VXLANPort})
		if err != nil {
			return err
		}
		defer c.Close()
		err = sockSetup(c, func(fd int) error {
			return unix.SetsockoptString(fd, unix.IPPROTO_IPV6, unix.IPV6_DSTOPTS, string([]byte{0, 0, 1, 4, 0, 0, 0, 0}))
		})
		if err != nil {
			return err
		}
		_, err = c.Write(payload)
		return err
	}))
}

// TestAttack14DecapForged6: the same trust rules over the IPv6 underlay
// and toward addresses node 1 is not known by: node 3 claiming node 2's
// pod and node 1's own range, behind a destination options header too;
// node 3's genuine frame to node 1's second, unlisted address (IPv4 and
// IPv6: check 4); the stranger as itself over IPv6. Nothing arrives, each
// is one counted drop; node 3's genuine datagram over IPv6 arrives, also
// behind the options header.
func TestAttack14DecapForged6(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	second, second6 := addSecondAddrs(t, n1, "10.77.1.50", "fd77:1::50")
	startTunAgents(t, lab)
	pods, a4, _ := lab.podPerNode(t, "f6")
	p1, p3 := pods[0], pods[2]
	a1, a2, a3 := a4[0], a4[1], a4[2]
	testenv.WaitIPv6Ready(t, n1.Node)
	testenv.WaitIPv6Ready(t, n3.Node)
	if err := testenv.Ping(p3, a1, 2); err != nil {
		t.Fatal(err)
	}
	// Warm up node 1's neighbour entries toward node 3's IPv6 address.
	sendTunnelPortAs(t, n3, tunNode6[2], tunNode6[0], datapath.VXLANPort, vxlanFrame(a3, a1, 9710, []byte("warm")))
	got := listenUDP4(t, p1, 9710)
	got(time.Second)
	idxT, _, _ := tunDevice(t, n1)
	idxU := uplinkIndex(t, n1)
	before := a14Drops(t, n1, idxT, idxU)
	sendTunnelPortAs(t, n3, tunNode6[2], tunNode6[0], datapath.VXLANPort, vxlanFrame(a2, a1, 9710, []byte("other-node6")))
	sendTunnelPortAs(t, n3, tunNode6[2], tunNode6[0], datapath.VXLANPort, vxlanFrame(neighbour(a1), a1, 9710, []byte("own-range6")))
	a14Send6DstOpts(t, n3, tunNode6[2], tunNode6[0], vxlanFrame(a2, a1, 9710, []byte("other-node6-dstopts")))
	sendTunnelPortAs(t, n3, tunNode6[2], second6, datapath.VXLANPort, vxlanFrame(a3, a1, 9710, []byte("unlisted6")))
	sendTunnelPortAs(t, n3, tunNode[2], second, datapath.VXLANPort, vxlanFrame(a3, a1, 9710, []byte("unlisted4")))
	sendVXLANAs(t, lab.strang, tunStrang6, tunNode6[0], vxlanFrame(a3, a1, 9710, []byte("stranger6")))
	if arrived := got(3 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q", arrived)
	}
	if d := a14WaitDrops(t, n1, before, 6, idxT, idxU); d != 6 {
		t.Errorf("node 1 counted %d tunnel drops for 6 forged datagrams, want 6\ntunnel device: %s\nuplink: %s",
			d, dumpCounters(n1.Maps(), idxT), dumpCounters(n1.Maps(), idxU))
	}
	sendTunnelPortAs(t, n3, tunNode6[2], tunNode6[0], datapath.VXLANPort, vxlanFrame(a3, a1, 9710, []byte("genuine6")))
	a14Send6DstOpts(t, n3, tunNode6[2], tunNode6[0], vxlanFrame(a3, a1, 9710, []byte("genuine6-dstopts")))
	if arrived := got(3 * time.Second); len(missing(arrived, []string{"genuine6 ", "genuine6-dstopts"})) != 0 {
		t.Errorf("pod 1 received %q, want node 3's two genuine datagrams", arrived)
	}
}

// TestAttack14DecapAgentRestart: node 3 sends forged datagrams (its own
// outer address, node 2's pod as the inner source) to pod 1 every 2 ms
// while node 1's agent is killed with SIGKILL, stays away and a new one
// starts and rewrites the tunnel maps. None may arrive at any moment; node
// 3's genuine datagrams, sent alongside, keep arriving once the new agent
// is up.
func TestAttack14DecapAgentRestart(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	procs := startTunAgents(t, lab)
	pods, a4, _ := lab.podPerNode(t, "ar")
	p1, p3 := pods[0], pods[2]
	a1, a2, a3 := a4[0], a4[1], a4[2]
	if err := testenv.Ping(p3, a1, 2); err != nil {
		t.Fatal(err)
	}
	got := listenUDP4(t, p1, 9711)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- n3.InNode(func() error {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: tunNode[0], Port: datapath.VXLANPort})
			if err != nil {
				return err
			}
			defer c.Close()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return nil
				default:
				}
				c.Write(vxlanFrame(a2, a1, 9711, []byte(fmt.Sprintf("forged-%d", i))))
				if i%25 == 0 {
					c.Write(vxlanFrame(a3, a1, 9711, []byte(fmt.Sprintf("genuine-%d", i))))
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}()
	time.Sleep(300 * time.Millisecond)
	procs[0].Cmd.Process.Kill()
	procs[0].Exited(5 * time.Second)
	time.Sleep(time.Second)
	n1.StartAgent(n1.WriteConfDir(), append(lab.agentArgs(n1), "--tunnel", "vxlan", "--metrics-addr", "")...)
	time.Sleep(2 * time.Second)
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	arrived := got(2 * time.Second)
	var forged, genuine int
	for _, a := range arrived {
		if strings.HasPrefix(a, "forged") {
			forged++
		} else {
			genuine++
		}
	}
	t.Logf("through the agent's kill and restart: %d forged and %d genuine datagrams arrived", forged, genuine)
	if forged != 0 {
		t.Errorf("%d forged datagrams (node 3 claiming node 2's pod) reached pod 1 during the agent's restart: %.200q", forged, arrived)
	}
	if genuine == 0 {
		t.Errorf("none of node 3's genuine datagrams arrived")
	}
}

// TestAttack14DecapNestedAndHostPort: (1) pod 3 sends a VXLAN datagram of
// its own through the tunnel (its own address outside: genuine for node
// 1's trust rule) to node 1's tunnel device address and to pod 1 itself,
// the inner one claiming node 2's pod: node 1 must not decapsulate the
// inner one into pod 1 (pod 1 gets the datagram on 4789 as plain UDP at
// most). (2) Node 3 forges node 2's pod as the inner source to node 1's
// hostPort at node 1's address (which cni_from_tunnel DNATs): the hostPort
// pod must receive nothing; node 3's own pod's datagram there arrives.
func TestAttack14DecapNestedAndHostPort(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	pods, a4, _ := lab.podPerNode(t, "nh")
	p1, p3 := pods[0], pods[2]
	a1, a2, a3 := a4[0], a4[1], a4[2]
	h := hostPortPod(n1, "nhh", 30091)
	if err := testenv.Ping(p3, a1, 2); err != nil {
		t.Fatal(err)
	}
	p4, _ := tunPods(0)
	_, cidr1, _ := net.ParseCIDR(p4)
	inner := listenUDP4(t, p1, 9712)
	raw := listenUDP4(t, p1, datapath.VXLANPort)
	hostPort := listenUDP4(t, h, 8080)
	sendUDPFrom(t, p3, cidr1.IP, datapath.VXLANPort, vxlanFrame(a2, a1, 9712, []byte("nested-to-device-address")))
	sendUDPFrom(t, p3, a1, datapath.VXLANPort, vxlanFrame(a2, a1, 9712, []byte("nested-to-pod")))
	sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(a2, tunNode[0], 30091, []byte("forged-to-hostport")))
	if arrived := inner(3 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received inner datagrams of pod 3's own VXLAN: %q", arrived)
	}
	t.Logf("pod 1 on UDP 4789 (plain UDP, allowed): %d datagrams", len(raw(100*time.Millisecond)))
	if arrived := hostPort(100 * time.Millisecond); len(arrived) != 0 {
		t.Errorf("the hostPort pod received %q: node 3 claimed node 2's pod through node 1's hostPort", arrived)
	}
	sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(a3, tunNode[0], 30091, []byte("genuine-to-hostport")))
	if arrived := hostPort(3 * time.Second); len(arrived) != 1 {
		t.Errorf("the hostPort pod received %q, want node 3's pod's datagram", arrived)
	}
}

// a14Tagged is a VXLAN frame whose inner Ethernet header carries the VLAN
// tags tpids (each with VLAN 0: priority tagged, which the stack takes as
// untagged) before an IPv4 packet.
func a14Tagged(tpids []uint16, l3 []byte) []byte {
	b := []byte{0x08, 0, 0, 0, 0, 0, 1, 0}
	b = append(b, a14InnerDst...)
	b = append(b, a14InnerSrc...)
	for _, tp := range tpids {
		b = append(b, byte(tp>>8), byte(tp), 0, 0)
	}
	b = append(b, 0x08, 0x00)
	return append(b, l3...)
}

// TestAttack14DecapInnerVLAN: node 3 forges node 2's pod as the inner
// source behind a priority tag (802.1Q, VLAN 0) and behind two tags
// (802.1ad then 802.1Q): a parser that looks for IPv4 right after the
// inner MAC addresses sees none and might pass the frame on unjudged,
// while the stack strips a VLAN-0 tag and delivers the packet. Nothing
// may reach pod 1.
func TestAttack14DecapInnerVLAN(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	pods, a4, _ := lab.podPerNode(t, "vl")
	p1, p3 := pods[0], pods[2]
	a1, a2, a3 := a4[0], a4[1], a4[2]
	if err := testenv.Ping(p3, a1, 2); err != nil {
		t.Fatal(err)
	}
	got := listenUDP4(t, p1, 9713)
	idxT, _, _ := tunDevice(t, n1)
	idxU := uplinkIndex(t, n1)
	ip4 := func(src net.IP, what string) []byte {
		return a14IP4UDP(src, a1, 9713, []byte(what), nil, 0x4000, 0)
	}
	sendVXLAN(t, n3.Node, tunNode[0], a14Tagged([]uint16{0x8100}, ip4(a2, "forged-vlan0")))
	sendVXLAN(t, n3.Node, tunNode[0], a14Tagged([]uint16{0x88a8, 0x8100}, ip4(a2, "forged-qinq")))
	if arrived := got(3 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q: node 3 claimed node 2's pod behind inner VLAN tags", arrived)
	}
	t.Logf("after the tagged forgeries: tunnel device %s; uplink %s", dumpCounters(n1.Maps(), idxT), dumpCounters(n1.Maps(), idxU))
	// Not asserted: whether node 3's own pod gets through behind a tag.
	sendVXLAN(t, n3.Node, tunNode[0], a14Tagged([]uint16{0x8100}, ip4(a3, "genuine-vlan0")))
	t.Logf("node 3's own pod behind a VLAN-0 tag: %q", got(2*time.Second))
}

// TestAttack14DecapIPsecPolicy: docs/tunnel.md answers the attacker
// beyond the router (a node's address forged with the gateway's MAC) with
// IPsec between nodes. Node 1 requires ESP for VXLAN from node 3 (an
// inbound xfrm policy, transport mode); a plaintext VXLAN datagram with
// node 3's address, which is what such an attacker sends (here node 3
// itself sends it, through the router as the attacker's would come), must
// not reach pod 1: the kernel's UDP receive drops it on the policy, and
// the uplink's decapsulation must not skip that.
func TestAttack14DecapIPsecPolicy(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("xp1")
	p3, r3 := n3.RunPod("xp3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	if err := testenv.Ping(p3, a1, 2); err != nil {
		t.Fatal(err)
	}
	must(t, n1.InNode(func() error {
		return ipCmds([]string{"xfrm", "policy", "add", "src", tunNode[2].String() + "/32", "dst", tunNode[0].String() + "/32",
			"proto", "udp", "dport", "4789", "dir", "in", "tmpl", "src", tunNode[2].String(), "dst", tunNode[0].String(),
			"proto", "esp", "mode", "transport"})
	}))
	got := listenUDP4(t, p1, 9714)
	sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(a3, a1, 9714, []byte("plaintext-as-node3")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		var st string
		n1.InNode(func() error {
			b, _ := exec.Command("cat", "/proc/net/xfrm_stat").CombinedOutput()
			st = string(b)
			return nil
		})
		t.Errorf("pod 1 received %q: a plaintext VXLAN datagram from node 3's address passed node 1's policy requiring ESP\n%s", arrived, st)
	}
}

// TestAttack14DecapOtherPortsAndForward: (1) node 3's genuine VXLAN frame
// sent to UDP 8472 (Linux's own VXLAN port) and 6081 (Geneve's), where no
// tunnel socket of node 1 listens: nothing may be decapsulated. (2) Node
// 1's FORWARD rule dropping node 3's pod CIDR toward pod 1 still holds for
// what the uplink decapsulates (the inner packet must go through the
// stack's forwarding), and node 2's pod still gets through.
func TestAttack14DecapOtherPortsAndForward(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	pods, a4, _ := lab.podPerNode(t, "op")
	p1, p2, p3 := pods[0], pods[1], pods[2]
	a1, a3 := a4[0], a4[2]
	if err := testenv.Ping(p3, a1, 2); err != nil {
		t.Fatal(err)
	}
	got := listenUDP4(t, p1, 9715)
	for _, port := range []int{8472, 6081} {
		payload := vxlanFrame(a3, a1, 9715, []byte(fmt.Sprintf("to-port-%d", port)))
		must(t, n3.InNode(func() error {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: tunNode[0], Port: port})
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write(payload)
			return err
		}))
	}
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q: decapsulated from a port no tunnel socket listens on", arrived)
	}
	p3cidr, _ := tunPods(2)
	must(t, n1.InNode(func() error {
		out, err := exec.Command("iptables", "-w", "-I", "FORWARD", "-s", p3cidr, "-d", a1.String(), "-j", "DROP").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}))
	sendUDPFrom(t, p3, a1, 9715, []byte("pod3-forward-dropped"))
	sendUDPFrom(t, p2, a1, 9715, []byte("pod2"))
	arrived := got(2 * time.Second)
	if len(missing(arrived, []string{"pod3-forward-dropped"})) == 0 {
		t.Errorf("pod 1 received node 3's pod's datagram past node 1's FORWARD rule dropping its pod CIDR: %q", arrived)
	}
	if len(missing(arrived, []string{"pod2"})) != 0 {
		t.Errorf("pod 1 received %q, want node 2's pod's datagram", arrived)
	}
}

// tunRx is the tunnel device's received-packet count on node e (its VXLAN
// receive's).
func tunRx(t *testing.T, e *testenv.Env) uint64 {
	t.Helper()
	var rx uint64
	err := e.InNode(func() error {
		l, err := netlink.LinkByName(datapath.TunnelDevice)
		if err == nil && l.Attrs().Statistics != nil {
			rx = l.Attrs().Statistics.RxPackets
		}
		return err
	})
	if err != nil {
		t.Fatalf("tunnel device: %v", err)
	}
	return rx
}
