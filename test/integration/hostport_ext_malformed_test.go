// Attack (round 12 review) on hp_ip6_chain (bpf/lib/hostport.h): IPv6
// extension header chains crafted to mis-compute the UDP offset.

package integration

import (
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// chainFrame is an IPv6 packet remoteIP6 -> uplinkIP6 whose first next
// header is first, carrying chain (extension headers as given) and data.
func chainFrame(src, dst net.HardwareAddr, first byte, chain, data []byte) []byte {
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(chain)+len(data)))
	h[6], h[7] = first, 64
	copy(h[8:], remoteIP6.To16())
	copy(h[24:], uplinkIP6.To16())
	return append(append(append(ethHeader(src, dst, 0x86dd), h...), chain...), data...)
}

func fragHdr(next byte, off int, more bool, id uint32) []byte {
	f := make([]byte, 8)
	f[0] = next
	m := 0
	if more {
		m = 1
	}
	binary.BigEndian.PutUint16(f[2:], uint16(off<<3|m))
	binary.BigEndian.PutUint32(f[4:], id)
	return f
}

// TestHostPortUDP6MalformedChains: datagrams to an IPv6 hostPort whose
// extension header chain is malformed or past what hp_ip6_chain walks: a
// hop-by-hop header whose length points past the packet, two fragment
// headers in one chain, and 5 destination options headers. None may reach
// the pod (a mis-computed UDP offset would rewrite payload bytes as ports
// or deliver a datagram the stack would refuse), and a well-formed one
// right after is delivered (the program did not choke). Green at int11
// (12270a8): the attacks failed; kept as the guard of hp_ip6_chain's
// refusals, untested before (TestHostPortUDP6ExtensionHeaders sends
// well-formed chains only).
func TestHostPortUDP6MalformedChains(t *testing.T) {
	e := newHPEnv(t)
	p := e.NewPod()
	e.MustAddHP(p, "extbad", testenv.PM{HostPort: 8100, ContainerPort: 100, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, p)
	got := listenUDP6(t, p, 100)
	remMAC, upMAC := linkMAC(t, e.remote, "eth0"), linkMAC(t, e.Node, "uplink0")
	payload := []byte(strings.Repeat("malformed chain ", 3))
	d := udpDatagram(remoteIP6, 40500, uplinkIP6, 8100, payload)
	const hbh, frag, dst = 0, 44, 60
	long := []byte{17, 255, 1, 4, 0, 0, 0, 0} // 2048 bytes claimed, 8 there
	var five []byte
	for i := 0; i < 5; i++ {
		next := byte(dst)
		if i == 4 {
			next = 17
		}
		five = append(five, padOpts(next)...)
	}
	for _, c := range []struct {
		what  string
		first byte
		chain []byte
	}{
		{"a hop-by-hop header longer than the packet", hbh, long},
		{"two fragment headers (atomic, then atomic)", frag, append(fragHdr(frag, 0, false, 0x9901), fragHdr(17, 0, false, 0x9901)...)},
		{"two fragment headers (first, then first)", frag, append(fragHdr(frag, 0, true, 0x9902), fragHdr(17, 0, true, 0x9902)...)},
		{"5 destination options headers", dst, five},
	} {
		sendFrames(t, e.remote, "eth0", [][]byte{chainFrame(remMAC, upMAC, c.first, c.chain, d)})
		if g := got(time.Second); len(g) != 0 {
			t.Errorf("a datagram behind %s to hostPort %s: the pod got %q, want nothing", c.what, hp(uplinkIP6, 8100), g)
		}
	}
	sendFrames(t, e.remote, "eth0", [][]byte{chainFrame(remMAC, upMAC, dst, padOpts(17), d)})
	if g := got(2 * time.Second); len(g) != 1 || !strings.HasPrefix(g[0], string(payload)+" from ") {
		t.Errorf("a well-formed datagram behind a destination options header after them: the pod got %q, want it", g)
	}
	e.MustDel(p, "extbad")
	e.AssertNoHostPorts()
}
