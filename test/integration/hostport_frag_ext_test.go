// hostPort UDP over IPv6 with extension headers (lib/hostport.h
// hp_ip6_chain): hop-by-hop and destination options before the fragment
// header, destination options after it, and whole datagrams behind them,
// both ways, in the plain hostPort lab (newHPEnv).

package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// padOpts is a hop-by-hop or destination options header holding one PadN
// option, as IPV6_HOPOPTS and IPV6_DSTOPTS take it (the kernel writes the
// next header) and as a frame carries it after a header of type next.
func padOpts(next byte) []byte { return []byte{next, 0, 1, 4, 0, 0, 0, 0} }

// extFragFrame is an IPv6 fragment of a UDP datagram (as fragFrame) with
// the extension headers of types exts (options headers, padOpts) between
// the fixed header and the fragment header; off < 0: no fragment header,
// data is the whole datagram behind the extension headers.
func extFragFrame(src, dst net.HardwareAddr, sip, dip net.IP, exts []byte, id uint32, off int, more bool,
	data []byte) []byte {
	var chain []byte
	tail := byte(44)
	if off < 0 {
		tail = 17
	}
	for i := range exts {
		next := tail
		if i+1 < len(exts) {
			next = exts[i+1]
		}
		chain = append(chain, padOpts(next)...)
	}
	if off >= 0 {
		f := make([]byte, 8)
		f[0] = 17
		mf := 0
		if more {
			mf = 1
		}
		binary.BigEndian.PutUint16(f[2:], uint16(off<<3|mf))
		binary.BigEndian.PutUint32(f[4:], id)
		chain = append(chain, f...)
	}
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(chain)+len(data)))
	h[6], h[7] = exts[0], 64
	copy(h[8:], sip.To16())
	copy(h[24:], dip.To16())
	return append(append(append(ethHeader(src, dst, 0x86dd), h...), chain...), data...)
}

// ip6OptsSock returns a socket setup that makes the kernel put a hop-by-hop
// (hbh) and/or destination options header (dst: after the fragment header,
// where Linux puts IPV6_DSTOPTS) on every datagram the socket sends.
func ip6OptsSock(hbh, dst bool) func(fd int) error {
	return func(fd int) error {
		if hbh {
			if err := unix.SetsockoptString(fd, unix.IPPROTO_IPV6, unix.IPV6_HOPOPTS, string(padOpts(0))); err != nil {
				return fmt.Errorf("IPV6_HOPOPTS: %w", err)
			}
		}
		if dst {
			if err := unix.SetsockoptString(fd, unix.IPPROTO_IPV6, unix.IPV6_DSTOPTS, string(padOpts(0))); err != nil {
				return fmt.Errorf("IPV6_DSTOPTS: %w", err)
			}
		}
		return nil
	}
}

func sockSetup(c syscall.Conn, setup func(fd int) error) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	return rawSetup(rc, setup)
}

// rawSetup applies setup to the socket of rc.
func rawSetup(rc syscall.RawConn, setup func(fd int) error) error {
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = setup(int(fd)) }); err != nil {
		return err
	}
	return serr
}

// serveUDP6EchoOpts is serveUDPEcho over IPv6 alone, its answers carrying
// the headers setup puts on them.
func serveUDP6EchoOpts(t *testing.T, netns ns.NetNS, port int, setup func(fd int) error) {
	t.Helper()
	var pc *net.UDPConn
	must(t, netns.Do(func(ns.NetNS) error {
		c, err := net.ListenPacket("udp6", fmt.Sprintf("[::]:%d", port))
		if err != nil {
			return err
		}
		pc = c.(*net.UDPConn)
		return sockSetup(pc, setup)
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

// echoUDP6Opts is echoConnectedUDP from a socket whose datagrams carry the
// headers setup puts on them.
func echoUDP6Opts(netns ns.NetNS, addr string, size, tries int, setup func(fd int) error) error {
	return netns.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp6", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := sockSetup(c.(*net.UDPConn), setup); err != nil {
			return err
		}
		req, buf := make([]byte, size), make([]byte, 65536)
		for i := range req {
			req[i] = byte(i * 7)
		}
		for sent := 1; sent <= tries; sent++ {
			c.Write(req)
			c.SetReadDeadline(time.Now().Add(time.Second))
			if n, err := c.Read(buf); err == nil && n == size && string(buf[:n]) == string(req) {
				return nil
			}
		}
		return fmt.Errorf("no whole %d-byte echo from %s to %d requests", size, addr, tries)
	})
}

// TestHostPortUDP6ExtensionHeaders: UDP to an IPv6 hostPort behind
// extension headers. Hand-made by the remote host: a datagram in two
// fragments with a destination options header, or a hop-by-hop and a
// destination options header, before each fragment header (as other
// stacks and middleboxes send them), and a whole datagram behind a
// destination options header, reach the pod's socket. Built by the kernel
// (4000-byte datagrams, fragmented, and 100-byte ones, echoed): the remote
// host's with a hop-by-hop header (before the fragment header) or a
// destination options header (after it, in the first fragment only), and
// a pod's of the node (hairpin) with both; and answers of a pod whose
// socket puts both on them, through the reply path (from_container). Before
// hp_ip6_chain none of these was translated: hp_frag_flow read a fragment
// header only right after the fixed header and UDP only right after that,
// and flow_parse6 walks no extension header.
func TestHostPortUDP6ExtensionHeaders(t *testing.T) {
	e := newHPEnv(t)
	p, q, cl := e.NewPod(), e.NewPod(), e.NewPod()
	e.MustAddHP(p, "ext", testenv.PM{HostPort: 8098, ContainerPort: 98, Protocol: "udp"},
		testenv.PM{HostPort: 8100, ContainerPort: 100, Protocol: "udp"})
	e.MustAddHP(q, "extreply", testenv.PM{HostPort: 8099, ContainerPort: 99, Protocol: "udp"})
	e.CleanupDel(cl, "client")
	testenv.PodIPs(t, e.Add(cl, "client"))
	for _, n := range []ns.NetNS{p, q, cl} {
		testenv.WaitIPv6Ready(t, n)
	}
	got := listenUDP6(t, p, 100)
	remMAC, upMAC := linkMAC(t, e.remote, "eth0"), linkMAC(t, e.Node, "uplink0")
	payload := []byte(strings.Repeat("extension headers ", 3))
	d := udpDatagram(remoteIP6, 40300, uplinkIP6, 8100, payload)
	const hbh, dst = 0, 60
	for i, c := range []struct {
		what  string
		exts  []byte
		whole bool
	}{
		{"a destination options header before the fragment header", []byte{dst}, false},
		{"a hop-by-hop and a destination options header before the fragment header", []byte{hbh, dst}, false},
		{"a whole datagram behind a destination options header", []byte{dst}, true},
	} {
		id := uint32(0x8800 + i)
		frames := [][]byte{
			extFragFrame(remMAC, upMAC, remoteIP6, uplinkIP6, c.exts, id, 0, true, d[:24]),
			extFragFrame(remMAC, upMAC, remoteIP6, uplinkIP6, c.exts, id, 3, false, d[24:]),
		}
		if c.whole {
			frames = [][]byte{extFragFrame(remMAC, upMAC, remoteIP6, uplinkIP6, c.exts, 0, -1, false, d)}
		}
		sendFrames(t, e.remote, "eth0", frames)
		if g := got(2 * time.Second); len(g) != 1 || !strings.HasPrefix(g[0], string(payload)+" from ") {
			t.Errorf("the remote host's datagram with %s to hostPort %s: the pod got %q, want it", c.what, hp(uplinkIP6, 8100), g)
		}
	}

	serveUDPEcho(t, p, 98)
	serveUDP6EchoOpts(t, q, 99, ip6OptsSock(true, true))
	plain := func(int) error { return nil }
	for _, size := range []int{4000, 100} {
		for _, c := range []struct {
			what   string
			from   ns.NetNS
			port   int
			client func(int) error
		}{
			{"the remote host, hop-by-hop header", e.remote, 8098, ip6OptsSock(true, false)},
			{"the remote host, destination options header", e.remote, 8098, ip6OptsSock(false, true)},
			{"a pod of the node (hairpin), both headers", cl, 8098, ip6OptsSock(true, true)},
			{"the remote host, answered with both headers", e.remote, 8099, plain},
			{"a pod of the node (hairpin), answered with both headers", cl, 8099, plain},
		} {
			addr := hp(uplinkIP6, c.port)
			if err := echoUDP6Opts(c.from, addr, size, 5, c.client); err != nil {
				t.Errorf("%d bytes, %s, to hostPort %s: %v", size, c.what, addr, err)
			}
		}
	}
	e.MustDel(p, "ext")
	e.MustDel(q, "extreply")
	e.AssertNoHostPorts()
}
