// hostPort UDP datagrams in fragments off the wire and hairpin, and
// fragments nobody's translated first fragment announced (lib/hostport.h
// hp_frag_flow), in the plain hostPort lab (newHPEnv: runs with every
// kernel-feature fallback too).

package integration

import (
	"encoding/binary"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

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

// TestHostPortUDPFragmented: 4000-byte UDP datagrams (fragmented by the
// sender) to a hostPort, echoed whole by the pod (which fragments its
// answer too), on connected sockets: from the remote host at the uplink's
// IPv4 and IPv6 address (cni_from_uplink, the replies out by the FIB), and
// from another pod of the node (hairpin: from_container DNATs the
// request's fragments, the reply's come back the same way). Before
// hp_frag_flow none was answered: the request's fragments went to the
// node's stack, which has no socket for them.
func TestHostPortUDPFragmented(t *testing.T) {
	e := newHPEnv(t)
	p, c := e.NewPod(), e.NewPod()
	e.MustAddHP(p, "echo", testenv.PM{HostPort: 8095, ContainerPort: 95, Protocol: "udp"})
	e.CleanupDel(c, "client")
	testenv.PodIPs(t, e.Add(c, "client"))
	testenv.WaitIPv6Ready(t, p)
	testenv.WaitIPv6Ready(t, c)
	serveUDPEcho(t, p, 95)
	for _, ip := range []net.IP{uplinkIP4, uplinkIP6} {
		addr := hp(ip, 8095)
		if sent, err := echoConnectedUDP(e.remote, addr, 4000, 10); err != nil {
			t.Errorf("the remote host to hostPort %s: %v", addr, err)
		} else {
			t.Logf("the remote host to %s: echoed after %d requests", addr, sent)
		}
		if sent, err := echoConnectedUDP(c, addr, 4000, 10); err != nil {
			t.Errorf("a pod of the node to hostPort %s (hairpin): %v", addr, err)
		} else {
			t.Logf("a pod of the node to %s: echoed after %d requests", addr, sent)
		}
	}
	e.MustDel(p, "echo")
	e.AssertNoHostPorts()
}

// TestHostPortForgedFragments: fragments the remote host forges to the
// node's hostPort, IPv4 and IPv6. Its own datagram in two fragments
// reaches the pod's socket (the control: what hp_frag_flow translates). A
// later fragment alone (an identification no first fragment opened) and a
// later fragment whose first fragment went to a port no hostPort maps
// (nothing noted) never reach the pod: its stack counts no fragment
// (IpReasmReqds, Ip6ReasmReqds), no datagram.
func TestHostPortForgedFragments(t *testing.T) {
	e := newHPEnv(t)
	p := e.NewPod()
	e.MustAddHP(p, "frag", testenv.PM{HostPort: 8096, ContainerPort: 96, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, p)
	got4, got6 := listenUDP4(t, p, 96), listenUDP6(t, p, 96)
	remMAC, upMAC := linkMAC(t, e.remote, "eth0"), linkMAC(t, e.Node, "uplink0")
	payload := make([]byte, 48)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	for _, c := range []struct {
		src, dst net.IP
		got      func(time.Duration) []string
		reasm    string
	}{
		{remoteIP4, uplinkIP4, got4, "IpReasmReqds"},
		{remoteIP6, uplinkIP6, got6, "Ip6ReasmReqds"},
	} {
		d := udpDatagram(c.src, 40100, c.dst, 8096, payload)
		// Control: the datagram in two fragments (24 bytes, then the rest).
		sendFrames(t, e.remote, "eth0", [][]byte{
			fragFrame(remMAC, upMAC, c.src, c.dst, 0x4242, 0, true, d[:24]),
			fragFrame(remMAC, upMAC, c.src, c.dst, 0x4242, 3, false, d[24:]),
		})
		if g := c.got(2 * time.Second); len(g) != 1 || !strings.HasPrefix(g[0], string(payload)+" from ") {
			t.Errorf("%s: the remote host's datagram in two fragments to hostPort %s: the pod got %q, want it", c.src, hp(c.dst, 8096), g)
		}
		before := podSNMP(t, p)
		d2 := udpDatagram(c.src, 40101, c.dst, 8097, payload)
		sendFrames(t, e.remote, "eth0", [][]byte{
			// A later fragment no first fragment opened.
			fragFrame(remMAC, upMAC, c.src, c.dst, 0x5151, 3, false, d[24:]),
			// A first fragment to a port no hostPort maps, then its later
			// fragment: nothing was noted for it.
			fragFrame(remMAC, upMAC, c.src, c.dst, 0x6161, 0, true, d2[:24]),
			fragFrame(remMAC, upMAC, c.src, c.dst, 0x6161, 3, false, d2[24:]),
		})
		g := c.got(2 * time.Second)
		after := podSNMP(t, p)
		if r := after[c.reasm] - before[c.reasm]; r != 0 || len(g) != 0 || len(podReceived(before, after)) != 0 {
			t.Errorf("%s: forged fragments to the node reached the hostPort pod: %s %d, datagrams %q, %v",
				c.src, c.reasm, r, g, podReceived(before, after))
		}
	}
	e.MustDel(p, "frag")
	e.AssertNoHostPorts()
}

// TestPolicyHostPortFragments: NetworkPolicy over a hostPort datagram that
// arrives in fragments (the remote host's, hand-made: 24 bytes, then the
// rest), IPv4 and IPv6. Pod h isolated for ingress with no peer allowed:
// the first fragment, translated, is denied where it enters h, and its
// later fragment, translated from the ports noted for it, is denied too
// (its first did not pass): h's stack counts no fragment, and the drops
// are counted. Allowed the remote host's UDP to port 80, the same
// datagram reaches h's stack whole (the control).
func TestPolicyHostPortFragments(t *testing.T) {
	p := newPolLab(t, false)
	remMAC, upMAC := linkMAC(t, p.remote, "eth0"), linkMAC(t, p.Node, "uplink0")
	payload := make([]byte, 48)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	id := uint32(0x7100)
	send := func(src, dst net.IP) {
		id++
		d := udpDatagram(src, 40200, dst, hostPortH, payload)
		sendFrames(t, p.remote, "eth0", [][]byte{
			fragFrame(remMAC, upMAC, src, dst, id, 0, true, d[:24]),
			fragFrame(remMAC, upMAC, src, dst, id, 3, false, d[24:]),
		})
		time.Sleep(300 * time.Millisecond)
	}
	for _, fam := range []int{4, 6} {
		reasm := map[int]string{4: "Ip", 6: "Ip6"}[fam]
		p.apply(t, "h", policy.Endpoint{Ingress: isolated()})
		before, drops := podSNMP(t, p.h), p.drops(t, "h", maps.DirIngress)
		send(remoteIP[fam], uplinkIP[fam])
		after := podSNMP(t, p.h)
		if r := after[reasm+"ReasmReqds"] - before[reasm+"ReasmReqds"]; r != 0 || len(podReceived(before, after)) != 0 {
			t.Errorf("IPv%d: a fragmented datagram to denying h's hostPort reached its stack: %d fragments, %v", fam, r, podReceived(before, after))
		}
		if d := p.drops(t, "h", maps.DirIngress) - drops; d != 2 {
			t.Errorf("IPv%d: %d policy drops at h, want both fragments", fam, d)
		}
		p.apply(t, "h", policy.Endpoint{Ingress: isolated(allowPorts(host(remoteIP[fam]), syscall.IPPROTO_UDP, 80, 80))})
		before = podSNMP(t, p.h)
		send(remoteIP[fam], uplinkIP[fam])
		after = podSNMP(t, p.h)
		if ok := after[reasm+"ReasmOKs"] - before[reasm+"ReasmOKs"]; ok != 1 {
			t.Errorf("IPv%d: allowed, the fragmented datagram was reassembled %d times in h, want once (%v)", fam, ok, podReceived(before, after))
		}
	}
}
