// Attack (round 12 review): ICMPv6 errors about hostPort UDP datagrams
// that carry IPv6 extension headers, which hp_ip6_chain now translates
// (lib/hostport.h) but icmp_err_parse (lib/icmp.h) does not walk.

package integration

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// udp6RefusedOpts is udpRefused over IPv6 from a socket whose datagrams
// carry the headers setup puts on them.
func udp6RefusedOpts(netns ns.NetNS, addr string, setup func(fd int) error) error {
	return netns.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp6", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := sockSetup(c.(*net.UDPConn), setup); err != nil {
			return err
		}
		buf := make([]byte, 64)
		for try := 0; try < 3; try++ {
			c.Write([]byte("anyone?"))
			c.SetReadDeadline(time.Now().Add(time.Second))
			_, err := c.Read(buf)
			if errors.Is(err, syscall.ECONNREFUSED) {
				return nil
			}
			if err == nil {
				return fmt.Errorf("an answer came")
			}
		}
		return fmt.Errorf("no port unreachable reached the socket")
	})
}

// TestHostPortUDP6ExtHeaderPortUnreachable: a remote client's UDP datagram
// to an IPv6 hostPort whose pod port is closed. Plain, the pod's port
// unreachable is translated back (hostport_icmp_error_out) and the
// client's connected socket gets ECONNREFUSED. The same datagram behind a
// destination options header (or a hop-by-hop header) is now translated
// into the pod (hp_ip6_chain), but the pod's error quoting it is not
// translated back: icmp_err_parse refuses an extension header in the
// quoted packet, so the error leaves with the pod's address, quoting the
// pod's address and port, which no socket of the client matches (and
// which shows the client the pod's address). Red at int11 (12270a8) for
// both header cases, the plain case green. Right: what is translated one
// way has its ICMP errors translated the other (the quoted packet's chain
// walked as hp_ip6_chain walks it), as for a datagram without headers.
func TestHostPortUDP6ExtHeaderPortUnreachable(t *testing.T) {
	e := newHPEnv(t)
	p := e.NewPod()
	// nobody listens on 5302
	e.MustAddHP(p, "extunreach", testenv.PM{HostPort: 8102, ContainerPort: 5302, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, p)
	addr := hp(uplinkIP6, 8102)
	for _, c := range []struct {
		what  string
		setup func(fd int) error
	}{
		{"no extension header", func(int) error { return nil }},
		{"a destination options header", ip6OptsSock(false, true)},
		{"a hop-by-hop header", ip6OptsSock(true, false)},
	} {
		if err := udp6RefusedOpts(e.remote, addr, c.setup); err != nil {
			t.Errorf("UDP with %s to hostPort %s, whose pod port 5302 is closed: %v", c.what, addr, err)
		}
	}
	e.MustDel(p, "extunreach")
	e.AssertNoHostPorts()
}
