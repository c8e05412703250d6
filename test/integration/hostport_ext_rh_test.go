// Attack (round 12 review) on hp_ip6_chain (bpf/lib/hostport.h): a routing
// header with segments left, which makes the packet's destination address
// a waypoint, not the datagram's destination.

package integration

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// rhFrame is a UDP datagram (remoteIP6:sport -> uplinkIP6:dport) behind a
// type 0 routing header with one address (via) and segments left 1.
func rhFrame(src, dst net.HardwareAddr, via net.IP, sport, dport int, payload []byte) []byte {
	rh := make([]byte, 24)
	rh[0], rh[1], rh[2], rh[3] = 17, 2, 0, 1
	copy(rh[8:], via.To16())
	d := udpDatagram(remoteIP6, sport, via, dport, payload) // checksummed to the final destination
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(rh)+len(d)))
	h[6], h[7] = 43, 64
	copy(h[8:], remoteIP6.To16())
	copy(h[24:], uplinkIP6.To16())
	return append(append(append(ethHeader(src, dst, 0x86dd), h...), rh...), d...)
}

// paramProblems collects the ICMPv6 parameter problems netns receives, by
// source address, for wait.
func paramProblems(t *testing.T, netns ns.NetNS) func(wait time.Duration) []string {
	t.Helper()
	var pc net.PacketConn
	must(t, netns.Do(func(ns.NetNS) error {
		var err error
		pc, err = net.ListenPacket("ip6:ipv6-icmp", "::")
		return err
	}))
	t.Cleanup(func() { pc.Close() })
	return func(wait time.Duration) []string {
		var got []string
		buf := make([]byte, 2048)
		for end := time.Now().Add(wait); time.Now().Before(end); {
			pc.SetReadDeadline(end)
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				break
			}
			if n > 0 && buf[0] == 4 {
				got = append(got, from.String())
			}
		}
		return got
	}
}

// TestHostPortUDP6RoutingHeaderSegmentsLeft: a datagram to the node's
// address : hostPort behind a routing header with segments left 1 is not
// for the node (RFC 8200 4.4: the node is a waypoint; Linux refuses a type
// 0 header then with a parameter problem, accept_source_route 0). To a
// port with no mapping the node's stack answers so, from uplinkIP6. To a
// hostPort, hp_ip6_chain walks the routing header as if it were done and
// the datagram is DNATed into the pod (its pseudo-header checksum fixed up
// for a destination it was not computed over); the pod's kernel answers
// the parameter problem, which is not translated back (the quoted packet's
// extension header) and reaches the outside client from the pod's own
// address: the pod's address shown to whoever sends such a datagram, and
// the node's answer missing. Red at int11 (12270a8): to hostPort 8100 the
// parameter problem comes from the pod's address, not from uplinkIP6; the
// no-mapping control green. Right: a routing header with segments left is
// not walked (the packet left to the stack, as for any port).
func TestHostPortUDP6RoutingHeaderSegmentsLeft(t *testing.T) {
	e := newHPEnv(t)
	p := e.NewPod()
	e.MustAddHP(p, "rh", testenv.PM{HostPort: 8100, ContainerPort: 100, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, p)
	got := listenUDP6(t, p, 100)
	pp := paramProblems(t, e.remote)
	remMAC, upMAC := linkMAC(t, e.remote, "eth0"), linkMAC(t, e.Node, "uplink0")
	via := net.ParseIP("fd00:99::9")
	for _, c := range []struct {
		what string
		port int
	}{
		{"a port with no mapping", 8997},
		{"hostPort 8100", 8100},
	} {
		sendFrames(t, e.remote, "eth0", [][]byte{rhFrame(remMAC, upMAC, via, 40400, c.port, []byte("waypoint"))})
		from := pp(2 * time.Second)
		if len(from) != 1 || from[0] != uplinkIP6.String() {
			t.Errorf("UDP to %s behind a routing header with segments left: parameter problems from %v, want one from the node %s",
				c.what, from, uplinkIP6)
		}
	}
	if g := got(time.Second); len(g) != 0 {
		t.Errorf("the pod's socket got %q", g)
	}
	e.MustDel(p, "rh")
	e.AssertNoHostPorts()
}
