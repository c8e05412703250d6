// A pod's own tunnel datagrams (docs/tunnel.md, "Only nodes may tunnel"):
// whatever way a pod's VXLAN datagram takes to a node's tunnel port, it
// must not leave its node, where masquerade would give it the node's
// address and the receiving node's trust rule would take its inner packet
// as one of the sender node's pods. TestTunnelPodVXLANViaDNAT
// (tunnel_spoof_test.go) is the ClusterIP way; these are the others.

package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// iptablesIn runs iptables (or ip6tables) rules in a node.
func iptablesIn(t *testing.T, e *testenv.Env, cmd string, rules ...[]string) {
	t.Helper()
	must(t, e.InNode(func() error {
		for _, r := range rules {
			if out, err := exec.Command(cmd, r...).CombinedOutput(); err != nil {
				return fmt.Errorf("%s %v: %v: %s", cmd, r, err, out)
			}
		}
		return nil
	}))
}

// sendUDPFrom sends one datagram from a pod.
func sendUDPFrom(t *testing.T, pod ns.NetNS, dst net.IP, port int, payload []byte) {
	t.Helper()
	must(t, pod.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: dst, Port: port})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(payload)
		return err
	}))
}

// neighbour is the address after a's in the same /24 (a pod address the
// sender does not own).
func neighbour(a net.IP) net.IP {
	n := append(net.IP{}, a.To4()...)
	n[3]++
	return n
}

// tunDropEvents waits for the drop counter of ifindex idx to reach
// before+want and returns the agent's drop events of that reason and
// interface since seq.
func tunDropEvents(t *testing.T, e *testenv.Env, idx int, dir maps.Dir, r maps.Reason, before, want, seq uint64) []events.Record {
	t.Helper()
	m := e.Maps()
	deadline := time.Now().Add(3 * time.Second)
	for counter(t, m, idx, dir, r).Packets < before+want && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := counter(t, m, idx, dir, r).Packets - before; got != want {
		t.Errorf("ifindex %d: %d %s %s drops, want %d", idx, got, dir, r, want)
	}
	var out []events.Record
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		out = out[:0]
		for _, ev := range observeJSON(t, e, "--last", "1000") {
			if ev.Seq > seq && ev.Type == "drop" && ev.Reason == r.String() && ev.Ifindex == uint32(idx) && ev.Direction == dir.String() {
				out = append(out, ev)
			}
		}
		if uint64(len(out)) >= want {
			break
		}
	}
	if uint64(len(out)) != want {
		t.Errorf("ifindex %d: %d %s events, want %d: %+v", idx, len(out), r, want, out)
	}
	return out
}

// TestTunnelPodVXLANViaNodePort: a pod's datagram to its own node's
// address and a NodePort, kube-proxy's way (marked for masquerade, DNATed
// to node 1's VXLAN port, masqueraded by iptables in POSTROUTING before
// the uplink's programs run), is dropped at the uplink and counted on the
// pod's host veth, with an event; pod 1 receives nothing. The host veth
// saw a node address and port 30789 only.
func TestTunnelPodVXLANViaNodePort(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("np1")
	p3, r3 := n3.RunPod("np3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	_, idx3 := n3.HostVeth("np3")
	node3 := tunNode[2].String()
	iptablesIn(t, n3, "iptables",
		[]string{"-t", "nat", "-A", "PREROUTING", "-d", node3, "-p", "udp", "--dport", "30789", "-j", "MARK", "--or-mark", "0x4000"},
		[]string{"-t", "nat", "-A", "PREROUTING", "-d", node3, "-p", "udp", "--dport", "30789", "-j", "DNAT", "--to-destination", tunNode[0].String() + ":4789"},
		[]string{"-t", "nat", "-A", "POSTROUTING", "-m", "mark", "--mark", "0x4000/0x4000", "-j", "MASQUERADE"})

	got := listenUDP4(t, p1, 9993)
	seq := lastSeq(t, n3)
	before := counter(t, n3.Maps(), idx3, maps.DirEgress, maps.ReasonDropTunSrc).Packets
	sendUDPFrom(t, p3, tunNode[2], 30789, vxlanFrame(neighbour(a3), a1, 9993, []byte("pod-via-nodeport")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q: pod 3 (%s) tunnelled a packet claiming %s through a NodePort", arrived, a3, neighbour(a3))
	}
	evs := tunDropEvents(t, n3, idx3, maps.DirEgress, maps.ReasonDropTunSrc, before, 1, seq)
	// Seen at the uplink: after the DNAT and the masquerade.
	if len(evs) == 1 && (evs[0].Dst != tunNode[0].String() || evs[0].DstPort != 4789 || evs[0].Protocol != "udp") {
		t.Errorf("event %+v: want udp to %s:4789", evs[0], tunNode[0])
	}
	// A NodePort to node 1's pod (the pod's source kept, as kube-proxy
	// does for a pod client) still carries what is no tunnel datagram.
	iptablesIn(t, n3, "iptables",
		[]string{"-t", "nat", "-I", "PREROUTING", "-d", node3, "-p", "udp", "--dport", "30790", "-j", "DNAT", "--to-destination", a1.String() + ":9993"})
	sendUDPFrom(t, p3, tunNode[2], 30790, []byte("plain-nodeport"))
	if arrived := got(3 * time.Second); len(arrived) != 1 || !strings.HasPrefix(arrived[0], "plain-nodeport") {
		t.Errorf("pod 1 received %q through the NodePort, want the plain datagram", arrived)
	}
}

// TestTunnelPodVXLANToOwnNode: a pod's VXLAN datagram to its own node's
// address (which cni_node_ips holds; no masquerade on the way in) claiming
// another pod of that node is dropped at its host veth, counted there with
// an event; the other pod receives nothing.
func TestTunnelPodVXLANToOwnNode(t *testing.T) {
	lab := newTunLab(t)
	n3 := lab.nodes[2]
	startTunAgents(t, lab)
	p3, r3 := n3.RunPod("own3")
	q3, rq := n3.RunPod("own3b")
	a3, _ := testenv.PodIPs(t, r3)
	aq, _ := testenv.PodIPs(t, rq)
	_, idx3 := n3.HostVeth("own3")

	got := listenUDP4(t, q3, 9992)
	seq := lastSeq(t, n3)
	before := counter(t, n3.Maps(), idx3, maps.DirEgress, maps.ReasonDropTunSrc).Packets
	sendUDPFrom(t, p3, tunNode[2], 4789, vxlanFrame(neighbour(a3), aq, 9992, []byte("pod-to-own-node")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod %s received %q: pod %s tunnelled through its own node", aq, arrived, a3)
	}
	tunDropEvents(t, n3, idx3, maps.DirEgress, maps.ReasonDropTunSrc, before, 1, seq)
}

// udp6ExtFrame is an IPv6 UDP datagram sip:5555 -> dip:dport whose UDP
// header sits behind the extension headers named (0 hop-by-hop, 60
// destination options, 44 an atomic fragment: offset 0, no more
// fragments), each 8 bytes.
func udp6ExtFrame(src, dst net.HardwareAddr, sip, dip net.IP, dport int, exts []byte, payload []byte) []byte {
	udp := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], 5555)
	binary.BigEndian.PutUint16(udp[2:], uint16(dport))
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	udp = append(udp, payload...)
	ps := append(append(append([]byte{}, sip.To16()...), dip.To16()...), 0, 0, byte(len(udp)>>8), byte(len(udp)), 0, 0, 0, 17)
	c := csumFold(csumAdd(csumAdd(0, ps), udp))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], c)
	var chain []byte
	for i, x := range exts {
		next := byte(17)
		if i+1 < len(exts) {
			next = exts[i+1]
		}
		h := []byte{next, 0, 1, 4, 0, 0, 0, 0} // PadN over the 6 option bytes
		if x == 44 {
			h = []byte{next, 0, 0, 0, 0, 0, 0x24, byte(i + 1)} // offset 0, M clear, an id
		}
		chain = append(chain, h...)
	}
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(chain)+len(udp)))
	h[6], h[7] = exts[0], 64
	copy(h[8:], sip.To16())
	copy(h[24:], dip.To16())
	return append(append(append(ethHeader(src, dst, 0x86dd), h...), chain...), udp...)
}

// TestTunnelPodVXLANBehindExtHeaders6: a pod's IPv6 VXLAN datagram to node
// 1's IPv6 address whose UDP header sits behind extension headers
// (hop-by-hop, destination options, a fragment header, and all three) is
// dropped at its host veth, each counted with an event; pod 1 receives
// nothing. Node 3 masquerades its pods' IPv6 traffic to node 1 with
// ip6tables, as kube-proxy does what it marks: the datagram would otherwise
// reach node 1 from node 3's address and pass its trust rule.
func TestTunnelPodVXLANBehindExtHeaders6(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("x1")
	p3, r3 := n3.RunPod("x3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, a36 := testenv.PodIPs(t, r3)
	_, idx3 := n3.HostVeth("x3")
	m3 := n3.Maps()
	podMAC, hostMAC := podMACOf(t, p3, "eth0"), hostMACOf(m3, idx3)
	_, cidr36 := tunPods(2)
	iptablesIn(t, n3, "ip6tables",
		[]string{"-t", "nat", "-A", "POSTROUTING", "-s", cidr36, "-d", tunNode6[0].String(), "-j", "MASQUERADE"})
	// The underlay carries IPv6 between the subnets (what the frames would
	// take): node 3 reaches node 1's IPv6 address.
	must(t, n3.InNode(func() error {
		if out, err := exec.Command("ping", "-6", "-c", "1", "-W", "2", tunNode6[0].String()).CombinedOutput(); err != nil {
			return fmt.Errorf("ping node 1 over IPv6 from node 3: %v: %s", err, out)
		}
		return nil
	}))

	got := listenUDP4(t, p1, 9991)
	seq := lastSeq(t, n3)
	before := counter(t, m3, idx3, maps.DirEgress, maps.ReasonDropTunSrc).Packets
	chains := [][]byte{{0}, {60}, {44}, {0, 60, 44}}
	for _, exts := range chains {
		inner := vxlanFrame(neighbour(a3), a1, 9991, []byte(fmt.Sprintf("ext-%v", exts)))
		podRaw(t, p3, "eth0", udp6ExtFrame(podMAC, hostMAC, a36, tunNode6[0], 4789, exts, inner))
	}
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q: pod 3 tunnelled over IPv6 behind extension headers, claiming %s", arrived, neighbour(a3))
	}
	tunDropEvents(t, n3, idx3, maps.DirEgress, maps.ReasonDropTunSrc, before, uint64(len(chains)), seq)
	// A datagram behind the same headers to another port goes on.
	before = counter(t, m3, idx3, maps.DirEgress, maps.ReasonDropTunSrc).Packets
	podRaw(t, p3, "eth0", udp6ExtFrame(podMAC, hostMAC, a36, tunNode6[0], 4790, []byte{0, 60, 44}, []byte("other-port")))
	time.Sleep(300 * time.Millisecond)
	if d := counter(t, m3, idx3, maps.DirEgress, maps.ReasonDropTunSrc).Packets - before; d != 0 {
		t.Errorf("a datagram to port 4790 behind extension headers: %d drop_tunnel_source", d)
	}
}

// TestTunnelPodVXLANViaDNAT6 is TestTunnelPodVXLANViaDNAT over IPv6: a
// pod's datagram to an IPv6 ClusterIP that ip6tables DNATs to node 1's IPv6
// address and port 4789, masqueraded to node 3's, is dropped at the uplink
// (to_uplink's IPv6 path), counted on the pod's host veth with an event.
func TestTunnelPodVXLANViaDNAT6(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("d61")
	p3, r3 := n3.RunPod("d63")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	_, idx3 := n3.HostVeth("d63")
	svc := "fd00:96::77"
	_, cidr36 := tunPods(2)
	iptablesIn(t, n3, "ip6tables",
		[]string{"-t", "nat", "-A", "PREROUTING", "-d", svc, "-p", "udp", "--dport", "53", "-j", "DNAT", "--to-destination", "[" + tunNode6[0].String() + "]:4789"},
		[]string{"-t", "nat", "-A", "POSTROUTING", "-s", cidr36, "-d", tunNode6[0].String(), "-j", "MASQUERADE"})

	got := listenUDP4(t, p1, 9988)
	seq := lastSeq(t, n3)
	before := counter(t, n3.Maps(), idx3, maps.DirEgress, maps.ReasonDropTunSrc).Packets
	sendUDPFrom(t, p3, net.ParseIP(svc), 53, vxlanFrame(neighbour(a3), a1, 9988, []byte("pod-via-service6")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q: pod 3 tunnelled through an IPv6 Service, claiming %s", arrived, neighbour(a3))
	}
	evs := tunDropEvents(t, n3, idx3, maps.DirEgress, maps.ReasonDropTunSrc, before, 1, seq)
	if len(evs) == 1 && (evs[0].Dst != tunNode6[0].String() || evs[0].DstPort != 4789) {
		t.Errorf("event %+v: want udp to [%s]:4789", evs[0], tunNode6[0])
	}
}
