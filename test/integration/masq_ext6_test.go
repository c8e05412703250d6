// Round 12 mend: replies to masqueraded IPv6 flows that carry extension
// headers (masq_reverse, bpf/from_uplink.c).

package integration

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// serveTCP6Opts listens on [::]:port in netns with setup applied to the
// listening socket (its accepted connections inherit its IPv6 options) and
// answers each connection with one line, then closes it.
func serveTCP6Opts(t *testing.T, netns ns.NetNS, port int, setup func(fd int) error, line string) {
	t.Helper()
	var ln net.Listener
	must(t, netns.Do(func(ns.NetNS) error {
		lc := net.ListenConfig{Control: controlSetup(setup)}
		var err error
		ln, err = lc.Listen(context.Background(), "tcp6", fmt.Sprintf("[::]:%d", port))
		return err
	}))
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(line + "\n"))
			c.Close()
		}
	}()
}

// controlSetup is a net.Dialer or net.ListenConfig Control that applies
// setup to the socket before it connects or listens.
func controlSetup(setup func(fd int) error) func(_, _ string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error { return rawSetup(c, setup) }
}

// TestMasqIPv6ReplyExtHeaders: a pod's IPv6 flows to the outside are
// masqueraded (source the node's uplink address); the outside server
// answers with a destination options header, or a hop-by-hop header, on
// its replies (sticky socket options, as a stack with IPV6_DSTOPTS sends
// them). Each reply must be translated back to the pod, as a reply
// without headers is. Red before (mend12, 7aa7159): from_uplink parsed
// the reply with flow_parse6, which takes the header after the fixed one
// for the transport's, found none, and left the reply to the node's
// stack, addressed to the node: the pod's UDP echo never came and its
// TCP connection never completed; the plain control green.
func TestMasqIPv6ReplyExtHeaders(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	pod, _ := lab.a.RunPod("x1")
	cases := []struct {
		what  string
		port  int
		setup func(fd int) error
	}{
		{"no extension header", 7100, func(int) error { return nil }},
		{"a destination options header", 7101, ip6OptsSock(false, true)},
		{"a hop-by-hop header", 7102, ip6OptsSock(true, false)},
	}
	for _, c := range cases {
		serveUDP6EchoOpts(t, lab.out, c.port, c.setup)
		serveTCP6Opts(t, lab.out, c.port, c.setup, fmt.Sprintf("tcp-%d", c.port))
	}
	for _, c := range cases {
		addr := hp(outsideIP6, c.port)
		if err := echoUDP6Opts(pod, addr, 100, 3, func(int) error { return nil }); err != nil {
			t.Errorf("UDP from the pod to %s, whose replies carry %s: %v", addr, c.what, err)
		}
		line, err := readLineTCP6Opts(pod, addr, func(int) error { return nil })
		if want := fmt.Sprintf("tcp-%d\n", c.port); err != nil || line != want {
			t.Errorf("TCP from the pod to %s, whose segments carry %s: read %q, %v; want %q", addr, c.what, line, err, want)
		}
	}
}

// readLineTCP6Opts dials addr from netns with a socket setup prepares
// before it connects (its segments carry the headers setup puts on them)
// and reads one line.
func readLineTCP6Opts(netns ns.NetNS, addr string, setup func(fd int) error) (string, error) {
	var line string
	err := netns.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 3 * time.Second, Control: controlSetup(setup)}
		c, err := d.Dial("tcp6", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		line, err = bufio.NewReader(c).ReadString('\n')
		return err
	})
	return line, err
}

// TestMasqIPv6PodExtHeaders: the pod's own IPv6 packets carry a
// destination options header, or a hop-by-hop header (sticky socket
// options): they must leave masqueraded (the outside has no route to the
// pod: only a masqueraded flow is answered), as the plain control does.
// Red before (mend12, 7aa7159): masq_egress parsed the packet with
// flow_parse6 alone, refused it, and let it leave with the pod's address:
// neither the UDP echo nor the TCP connection was answered.
func TestMasqIPv6PodExtHeaders(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	pod, _ := lab.a.RunPod("x2")
	serveUDP6EchoOpts(t, lab.out, 7110, func(int) error { return nil })
	serveTCP6Opts(t, lab.out, 7110, func(int) error { return nil }, "tcp-7110")
	addr := hp(outsideIP6, 7110)
	for _, c := range []struct {
		what  string
		setup func(fd int) error
	}{
		{"no extension header", func(int) error { return nil }},
		{"a destination options header", ip6OptsSock(false, true)},
		{"a hop-by-hop header", ip6OptsSock(true, false)},
	} {
		if err := echoUDP6Opts(pod, addr, 100, 3, c.setup); err != nil {
			t.Errorf("UDP with %s from the pod to %s: %v", c.what, addr, err)
		}
		if line, err := readLineTCP6Opts(pod, addr, c.setup); err != nil || line != "tcp-7110\n" {
			t.Errorf("TCP with %s from the pod to %s: read %q, %v", c.what, addr, line, err)
		}
	}
}
