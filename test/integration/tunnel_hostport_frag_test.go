// hostPort UDP datagrams that cross in fragments (lib/hostport.h
// hp_frag_flow): a reply the hostPort pod fragments once it learned a
// smaller path, a client's request larger than its MTU, both through the
// tunnel and off the wire, IPv4 and IPv6; and fragments nobody's first
// fragment opened.

package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// serveUDPEcho answers every datagram to port in netns, IPv4 and IPv6,
// with the datagram itself, from sockets at the kernel's default (path MTU
// discovery "want": larger than the known path, it is fragmented).
func serveUDPEcho(t *testing.T, netns ns.NetNS, port int) {
	t.Helper()
	for _, fam := range []string{"udp4", "udp6"} {
		var pc net.PacketConn
		must(t, netns.Do(func(ns.NetNS) error {
			var err error
			pc, err = net.ListenPacket(fam, fmt.Sprintf(":%d", port))
			return err
		}))
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 65536)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(buf[:n], from)
			}
		}()
	}
}

// echoConnectedUDP sends a size-byte datagram (its bytes numbered) to addr
// from netns on a connected socket (answers only from addr count) once a
// second, up to tries times, and returns the request that got the first
// whole echo back.
func echoConnectedUDP(netns ns.NetNS, addr string, size, tries int) (sent int, err error) {
	err = netns.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		req, buf := make([]byte, size), make([]byte, 65536)
		for i := range req {
			req[i] = byte(i)
		}
		var last string
		for sent = 1; sent <= tries; sent++ {
			c.Write(req)
			for end := time.Now().Add(time.Second); ; {
				c.SetReadDeadline(end)
				n, err := c.Read(buf)
				if err != nil {
					break
				}
				if n == size && string(buf[:n]) == string(req) {
					return nil
				}
				last = fmt.Sprintf("a %d-byte answer", n)
			}
		}
		return fmt.Errorf("no whole %d-byte echo from %s to %d requests (%s)", size, addr, tries, last)
	})
	return sent, err
}

// TestTunnelHostPortUDPFragmentedReply: as TestTunnelUDPBeyondPathMTU, but
// pod 3 asks node 1's hostPort (IPv4, IPv6) on a connected socket. Once the
// hostPort pod learns the path MTU (1350) it fragments its 1400-byte
// answers (IP_PMTUDISC_WANT, the default). Before hp_frag_flow,
// hostport_from_pod did not translate fragments (flow_parse4/6 refuse
// them), so they left with the pod's own address and port, and a
// connected client (a DNS resolver) dropped them: no answer in 20 s, v4
// and v6 (pmtu8, 19:12 UTC). An unconnected client
// (TestAttack8TunnelUDPBeyondPathMTU) took the answer from the wrong
// address, which is why that test passed.
func TestTunnelHostPortUDPFragmentedReply(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	lab.nodesInCluster(true)
	startTunAgents(t, lab)
	p3, _ := n3.RunPod("udpfrag3")
	hp1 := n1.NewPod()
	n1.CleanupDel(hp1, "udpfrag1")
	n1.MustAddHP(hp1, "udpfrag1", testenv.PM{HostPort: 11355, ContainerPort: 5355, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, hp1)
	testenv.WaitIPv6Ready(t, p3)
	const size = 1400
	serveUDPBoth(t, hp1, 5355, size)
	for _, addr := range []string{hp(tunNode[0], 11355), hp(tunNode6[0], 11355)} {
		sent, n, err := askConnectedUDP(p3, addr, 20)
		switch {
		case err != nil:
			t.Errorf("pod 3 asking hostPort %s for %d bytes: %v", addr, size, err)
		case n != size:
			t.Errorf("pod 3 asking hostPort %s: a %d-byte answer, want %d", addr, n, size)
		default:
			t.Logf("%s: answered after %d requests", addr, sent)
		}
	}
}

// TestTunnelHostPortUDPFragmented: datagrams larger than the client's MTU
// to node 1's hostPort, echoed whole by the hostPort pod (MTU 1450), on
// connected sockets, IPv4 and IPv6: both directions are fragments. From
// the stranger, a host of node 1's subnet (off the wire: cni_from_uplink,
// the replies out by the FIB), 4000 bytes. From pod 3 through the tunnel
// (cni_from_tunnel; node addresses are cluster CIDRs, so pod 3 keeps its
// address and the replies go back by tun_redirect): first 1400 bytes,
// which teaches the hostPort pod the path MTU (its unfragmented answer
// carries DF and is refused by the stack: "fragmentation needed" / "packet
// too big"), then 4000. Before hp_frag_flow every case got nothing: the
// request's fragments went to the node's own stack, which had no socket
// for them, and the reply's left untranslated.
func TestTunnelHostPortUDPFragmented(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	lab.nodesInCluster(true)
	startTunAgents(t, lab)
	p3, _ := n3.RunPod("frag3")
	hp1 := n1.NewPod()
	n1.CleanupDel(hp1, "frag1")
	n1.MustAddHP(hp1, "frag1", testenv.PM{HostPort: 11356, ContainerPort: 5356, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, hp1)
	testenv.WaitIPv6Ready(t, p3)
	serveUDPEcho(t, hp1, 5356)
	for _, c := range []struct {
		who   string
		from  ns.NetNS
		node  net.IP
		sizes []int
	}{
		{"the stranger", lab.strang, tunNode[0], []int{4000}},
		{"the stranger", lab.strang, tunNode6[0], []int{4000}},
		{"pod 3", p3, tunNode[0], []int{1400, 4000}},
		{"pod 3", p3, tunNode6[0], []int{1400, 4000}},
	} {
		addr := hp(c.node, 11356)
		for _, size := range c.sizes {
			sent, err := echoConnectedUDP(c.from, addr, size, 15)
			if err != nil {
				t.Errorf("%s to hostPort %s: %v", c.who, addr, err)
				continue
			}
			t.Logf("%s to %s: %d bytes echoed after %d requests", c.who, addr, size, sent)
		}
	}
}

// fragFrame is an IPv4 or IPv6 fragment (by sip's family) of a UDP
// datagram: id, the offset in 8-byte units, more fragments to come or
// not, and data, the bytes of the datagram at that offset (at offset 0, the
// UDP header first).
func fragFrame(src, dst net.HardwareAddr, sip, dip net.IP, id uint32, off int, more bool, data []byte) []byte {
	mf := 0
	if more {
		mf = 1
	}
	if sip.To4() != nil {
		h := make([]byte, 20)
		h[0], h[8], h[9] = 0x45, 64, 17
		binary.BigEndian.PutUint16(h[2:], uint16(20+len(data)))
		binary.BigEndian.PutUint16(h[4:], uint16(id))
		binary.BigEndian.PutUint16(h[6:], uint16(mf<<13|off))
		copy(h[12:], sip.To4())
		copy(h[16:], dip.To4())
		binary.BigEndian.PutUint16(h[10:], csumFold(csumAdd(0, h)))
		return append(append(ethHeader(src, dst, 0x0800), h...), data...)
	}
	h := make([]byte, 48)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(8+len(data)))
	h[6], h[7] = 44, 64
	copy(h[8:], sip.To16())
	copy(h[24:], dip.To16())
	h[40] = 17
	binary.BigEndian.PutUint16(h[42:], uint16(off<<3|mf))
	binary.BigEndian.PutUint32(h[44:], id)
	return append(append(ethHeader(src, dst, 0x86dd), h...), data...)
}

// udpDatagram is a UDP header and payload sip:sport -> dip:dport with its
// checksum, as a datagram to be cut into fragments.
func udpDatagram(sip net.IP, sport int, dip net.IP, dport int, payload []byte) []byte {
	u := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], uint16(sport))
	binary.BigEndian.PutUint16(u[2:], uint16(dport))
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	u = append(u, payload...)
	var ps []byte
	if sip.To4() != nil {
		ps = append(append(append([]byte{}, sip.To4()...), dip.To4()...), 0, 17, byte(len(u)>>8), byte(len(u)))
	} else {
		ps = append(append(append([]byte{}, sip.To16()...), dip.To16()...), 0, 0, byte(len(u)>>8), byte(len(u)), 0, 0, 0, 17)
	}
	c := csumFold(csumAdd(csumAdd(0, ps), u))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], c)
	return u
}

// TestHostPortForgedFragments: fragments the stranger forges to node 1's
// hostPort, IPv4 and IPv6. Its own datagram in two fragments reaches the
// pod's socket (the control: what hp_frag_flow translates). A later
// fragment alone (an identification no first fragment opened) and a later
// fragment of that datagram sent again after its first fragment was
// refused (a first fragment to a port no hostPort maps: nothing noted)
// never reach the pod: its stack counts no fragment (IpReasmReqds,
// Ip6ReasmReqds), no datagram.
func TestHostPortForgedFragments(t *testing.T) {
	lab := newTunLab6(t)
	n1 := lab.nodes[0]
	startTunAgents(t, lab)
	hp1 := n1.NewPod()
	n1.CleanupDel(hp1, "forgefrag1")
	n1.MustAddHP(hp1, "forgefrag1", testenv.PM{HostPort: 11357, ContainerPort: 5357, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, hp1)
	got4 := listenUDP4(t, hp1, 5357)
	got6 := listenUDP6(t, hp1, 5357)
	strMAC, n1MAC := linkMAC(t, lab.strang, "uplink0"), linkMAC(t, n1.Node, "uplink0")
	payload := make([]byte, 48)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	for _, c := range []struct {
		src, dst net.IP
		got      func(time.Duration) []string
		reasm    string
	}{
		{tunStrang, tunNode[0], got4, "IpReasmReqds"},
		{tunStrang6, tunNode6[0], got6, "Ip6ReasmReqds"},
	} {
		d := udpDatagram(c.src, 40100, c.dst, 11357, payload)
		// Control: the datagram in two fragments (24 bytes, then the rest).
		sendFrames(t, lab.strang, "uplink0", [][]byte{
			fragFrame(strMAC, n1MAC, c.src, c.dst, 0x4242, 0, true, d[:24]),
			fragFrame(strMAC, n1MAC, c.src, c.dst, 0x4242, 3, false, d[24:]),
		})
		if g := c.got(2 * time.Second); len(g) != 1 || !strings.HasPrefix(g[0], string(payload)+" from ") {
			t.Errorf("%s: the stranger's datagram in two fragments to hostPort %s: the pod got %q, want it", c.src, hp(c.dst, 11357), g)
		}
		before := podSNMP(t, hp1)
		d2 := udpDatagram(c.src, 40101, c.dst, 11358, payload)
		sendFrames(t, lab.strang, "uplink0", [][]byte{
			// A later fragment no first fragment opened.
			fragFrame(strMAC, n1MAC, c.src, c.dst, 0x5151, 3, false, d[24:]),
			// A first fragment to a port no hostPort maps, then its later
			// fragment: nothing was noted for it.
			fragFrame(strMAC, n1MAC, c.src, c.dst, 0x6161, 0, true, d2[:24]),
			fragFrame(strMAC, n1MAC, c.src, c.dst, 0x6161, 3, false, d2[24:]),
		})
		g := c.got(2 * time.Second)
		after := podSNMP(t, hp1)
		if r := after[c.reasm] - before[c.reasm]; r != 0 || len(g) != 0 || len(podReceived(before, after)) != 0 {
			t.Errorf("%s: forged fragments to node 1 reached the hostPort pod: %s %d, datagrams %q, %v",
				c.src, c.reasm, r, g, podReceived(before, after))
		}
	}
}
