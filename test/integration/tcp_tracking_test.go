// The TCP RST tracking of bpf/lib/tcpseq.h under attack (issues 23 and
// 24): masqueraded policy flows, data-then-RST pairs, a
// tuple reused with a new ISN. Each test was red before its fix.

package integration

import (
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// tcpTrackLab is the policy lab (podPolLab) with ipMasq when masq.
type tcpTrackLab struct {
	*podPolLab
}

func newTCPTrackLab(t *testing.T, masq bool) *tcpTrackLab {
	t.Helper()
	var extra map[string]any
	if masq {
		extra = map[string]any{"ipMasq": true, "clusterCIDRs": []string{cluster[4], cluster[6]}}
	}
	return &tcpTrackLab{newPodPolLabWith(t, extra)}
}

// polFlow is pod a's policy flow of TCP ports podPort and peerPort in
// family fam, if any.
func (l *tcpTrackLab) polFlow(t *testing.T, fam, podPort, peerPort int) (maps.PolicyFlow, bool) {
	t.Helper()
	flows, err := l.Maps().Policy().ListFlows()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Ifindex == l.idx && f.Proto == 6 && int(f.Pod.Port()) == podPort && int(f.Peer.Port()) == peerPort &&
			f.Pod.Addr().Is4() == (fam == 4) {
			return f, true
		}
	}
	return maps.PolicyFlow{}, false
}

func (l *tcpTrackLab) polState(t *testing.T, fam, podPort, peerPort int) string {
	t.Helper()
	f, ok := l.polFlow(t, fam, podPort, peerPort)
	if !ok {
		return "absent"
	}
	return maps.FlowState(6, f.Flags)
}

// tcpTrackConn is a connection from pod a to the remote server on port, with
// the server's next sequence number (it sent nothing yet).
type tcpTrackConn struct {
	fam      int
	port     int
	cli, srv net.Conn
	aPort    int    // a's port
	wirePort int    // the port the server sees (the masquerade's, or a's)
	wireIP   net.IP // the address the server sees
	srvNext  uint32 // the server's next sequence number
	name     string
}

func (l *tcpTrackLab) dial(t *testing.T, fam, port int, name string) *tcpTrackConn {
	t.Helper()
	var ln net.Listener
	must(t, l.remote.Do(func(ns.NetNS) (err error) {
		ln, err = net.Listen(fmt.Sprintf("tcp%d", fam), hp(remoteIP[fam], port))
		return
	}))
	t.Cleanup(func() { ln.Close() })
	isn := sniffSynAck(t, l.remote, "eth0", port)
	accepted := make(chan net.Conn, 1)
	go func() {
		if s, err := ln.Accept(); err == nil {
			accepted <- s
		}
	}()
	c := &tcpTrackConn{fam: fam, port: port, name: name}
	must(t, l.a.Do(func(ns.NetNS) (err error) {
		c.cli, err = net.DialTimeout("tcp", hp(remoteIP[fam], port), 3*time.Second)
		return
	}))
	t.Cleanup(func() { c.cli.Close() })
	select {
	case c.srv = <-accepted:
	case <-time.After(3 * time.Second):
		t.Fatalf("%s v%d: the server accepted nothing", name, fam)
	}
	t.Cleanup(func() { c.srv.Close() })
	select {
	case s := <-isn:
		c.srvNext = s + 1
	case <-time.After(5 * time.Second):
		t.Fatalf("%s v%d: no SYN-ACK seen on the remote link", name, fam)
	}
	c.aPort = c.cli.LocalAddr().(*net.TCPAddr).Port
	seen := c.srv.RemoteAddr().(*net.TCPAddr)
	c.wirePort, c.wireIP = seen.Port, seen.IP
	return c
}

// pushed wants the server's push to reach a.
func (c *tcpTrackConn) pushed(t *testing.T, why string) {
	t.Helper()
	if _, err := c.srv.Write([]byte("pushed")); err != nil {
		t.Errorf("%s v%d: server write: %v", c.name, c.fam, err)
		return
	}
	buf := make([]byte, 16)
	c.cli.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, err := c.cli.Read(buf)
	if err != nil || string(buf[:n]) != "pushed" {
		t.Errorf("IPv%d %s: a's read of the server's push: %q, %v; want it delivered (%s)", c.fam, c.name, buf[:n], err, why)
	}
}

// forgedPair is a blind attacker's lucky pair: a data segment that covers
// the server's next sequence number (seq 100 before it, 200 bytes), with
// an acknowledgement far from anything a sent (the pod's TCP discards it,
// RFC 5961 5.2), then an RST at the segment's end. One such pair in 2^32/L
// lands when the tracking follows unacknowledged data.
func forgedPair(src, dst net.HardwareAddr, c *tcpTrackConn, dip net.IP, dport int) [][]byte {
	seq := c.srvNext - 100
	payload := make([]byte, 200)
	for i := range payload {
		payload[i] = 'x'
	}
	return [][]byte{
		tcpDataFrame(src, dst, remoteIP[c.fam], c.port, dip, dport, seq, 0x5eed0000, tcpACK|tcpPSH, payload),
		tcpFrame(src, dst, remoteIP[c.fam], c.port, dip, dport, seq+200, 0, tcpRST, 0),
	}
}

// TestPolicyMasqueradedFlowForgedRST: a is isolated both ways, its egress
// allowing the remote server, and masquerades (ipMasq): its connection
// leaves with the node's address and a port of the masquerade's. A host on
// the wire sends the node, posing as the server, an RST far from the
// server's sequence number ("rst"), or a data segment covering it then an
// RST at its end ("pair"). Neither may close the flow, in the masquerade
// (cni_snat) or in a's policy (cni_pol_ct_parts): after longer than a
// closed flow lives, the server's push still reaches a. An RST at exactly
// the server's next number still closes both ("exact"). IPv4 and IPv6.
func TestPolicyMasqueradedFlowForgedRST(t *testing.T) {
	t.Parallel()
	l := newTCPTrackLab(t, true)
	var allows []policy.Allow
	for _, fam := range []int{4, 6} {
		allows = append(allows, policy.Allow{Prefix: host(remoteIP[fam]), Ports: []policy.PortRange{{Proto: 6, First: 7300, Last: 7399}}})
	}
	if err := l.Maps().Policy().Writer().Apply(uint32(l.idx), policy.Endpoint{Ingress: isolated(), Egress: isolated(allows...)}); err != nil {
		t.Fatal(err)
	}
	src, dst := linkMAC(t, l.remote, "eth0"), linkMAC(t, l.Node, "uplink0")
	var conns []*tcpTrackConn
	for _, fam := range []int{4, 6} {
		for i, name := range []string{"control", "rst", "pair", "exact"} {
			c := l.dial(t, fam, 7300+10*fam+i, name)
			if !c.wireIP.Equal(uplinkIP[fam]) {
				t.Fatalf("%s v%d: the server saw %s, want the node's %s (masqueraded)", name, fam, c.wireIP, uplinkIP[fam])
			}
			conns = append(conns, c)
		}
	}
	for _, c := range conns {
		var frames [][]byte
		switch c.name {
		case "rst":
			for i := uint32(0); i < 64; i++ {
				frames = append(frames, tcpFrame(src, dst, remoteIP[c.fam], c.port, c.wireIP, c.wirePort, c.srvNext+1<<20+i<<26, 0, tcpRST, 0))
			}
		case "pair":
			frames = forgedPair(src, dst, c, c.wireIP, c.wirePort)
		case "exact":
			frames = [][]byte{tcpFrame(src, dst, remoteIP[c.fam], c.port, c.wireIP, c.wirePort, c.srvNext, 0, tcpRST, 0)}
		}
		if frames != nil {
			sendFrames(t, l.remote, "eth0", frames)
		}
	}
	time.Sleep(200 * time.Millisecond)
	for _, c := range conns {
		st := l.polState(t, c.fam, c.aPort, c.port)
		if (c.name == "exact") != (st == "closing") {
			t.Errorf("IPv%d %s: a's policy flow is %s", c.fam, c.name, st)
		}
	}
	time.Sleep(11 * time.Second) // past the closing timeout (10 s idle)
	for _, c := range conns {
		if c.name != "exact" {
			c.pushed(t, "the forged frames missed the server's sequence number: a's TCP ignored them, so must its flows")
		}
	}
}

// TestTCPTrackingForgedDataThenRST: a's ingress is isolated, its egress open; it
// holds a connection to a server off the node (not masqueraded). A blind
// attacker sends data segments then an RST at each one's end: if a data
// segment covering the server's next sequence number moves the tracked
// number, the RST behind it matches, and 2^32/L pairs (L bytes a segment)
// are bound to close the flow instead of 2^32 RSTs. Here the lucky pair
// (its segment covers the number; its acknowledgement is far off, so a's
// TCP discards it) must not close a's policy flow: after longer than a
// closed flow lives, the server's push still reaches a. IPv4 and IPv6.
func TestTCPTrackingForgedDataThenRST(t *testing.T) {
	t.Parallel()
	l := newTCPTrackLab(t, false)
	if err := l.Maps().Policy().Writer().Apply(uint32(l.idx), policy.Endpoint{Ingress: isolated()}); err != nil {
		t.Fatal(err)
	}
	src, dst := linkMAC(t, l.remote, "eth0"), linkMAC(t, l.Node, "uplink0")
	var conns []*tcpTrackConn
	for _, fam := range []int{4, 6} {
		for i, name := range []string{"control", "pair"} {
			conns = append(conns, l.dial(t, fam, 7400+10*fam+i, name))
		}
	}
	for _, c := range conns {
		if c.name == "pair" {
			sendFrames(t, l.remote, "eth0", forgedPair(src, dst, c, l.aIP[c.fam], c.aPort))
		}
	}
	time.Sleep(200 * time.Millisecond)
	for _, c := range conns {
		if st := l.polState(t, c.fam, c.aPort, c.port); st != "established" {
			t.Errorf("IPv%d %s: a's policy flow is %s, want established", c.fam, c.name, st)
		}
	}
	time.Sleep(11 * time.Second)
	for _, c := range conns {
		c.pushed(t, "a's TCP discarded the forged segment and ignored the RST")
	}
}

// nsCmd runs a command in netns, failing the test on error.
func nsCmd(t *testing.T, netns ns.NetNS, args ...string) {
	t.Helper()
	must(t, netns.Do(func(ns.NetNS) error {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}))
}

// blockTCP drops, in netns, every TCP segment it sends from or to port
// (dir --sport, --dport: a host that vanishes without a word), until the
// call it returns.
func blockTCP(t *testing.T, netns ns.NetNS, fam int, dir string, port int) func() {
	t.Helper()
	cmd := map[int]string{4: "iptables-nft", 6: "ip6tables-nft"}[fam]
	rule := []string{"OUTPUT", "-p", "tcp", dir, fmt.Sprint(port), "-j", "DROP"}
	nsCmd(t, netns, append([]string{cmd, "-I"}, rule...)...)
	return func() { nsCmd(t, netns, append([]string{cmd, "-D"}, rule...)...) }
}

// TestTCPTrackingTupleReusedWithNewISN: the remote host dials a server in a pod
// from a fixed port: a's, whose ingress is isolated but for it ("reuse",
// "forged-syn": its policy flow), or web's through its hostPort
// ("reuse-hostport": its cni_ct flow).
//
// "reuse": both ends lose the connection without a word reaching the other
// (the client's host crashed, the pod's socket timed out on its silence),
// and the client dials again from the same port with a new ISN. The pod's
// server accepts it; the flow's tracking must follow the new connection,
// whose client's RST then closes the flow at once (else its RSTs and FINs
// are refused and the entry lingers an hour).
//
// "forged-syn": a host on the wire sends a SYN naming a live connection's
// tuple with a sequence number of its own. a's TCP answers it with a
// challenge ACK (RFC 5961 4.2); the flow must stay as it was: established
// (not reset to a handshake's 120 s), its tracking on the real client,
// whose RST still closes it. IPv4 and IPv6.
func TestTCPTrackingTupleReusedWithNewISN(t *testing.T) {
	t.Parallel()
	l := newTCPTrackLab(t, false)
	var allows []policy.Allow
	for _, fam := range []int{4, 6} {
		allows = append(allows, policy.Allow{Prefix: host(remoteIP[fam]), Ports: []policy.PortRange{{Proto: 6, First: 7500, Last: 7599}}})
	}
	if err := l.Maps().Policy().Writer().Apply(uint32(l.idx), policy.Endpoint{Ingress: isolated(allows...)}); err != nil {
		t.Fatal(err)
	}
	web := l.NewPod()
	const hostPort = 8095
	l.MustAddHP(web, "web", testenv.PM{HostPort: hostPort, ContainerPort: 80, Protocol: "tcp"})
	_, webIdx := l.HostVeth("web")
	if err := l.Maps().Policy().Writer().Apply(uint32(webIdx), policy.Endpoint{}); err != nil { // open: no policy selects it
		t.Fatal(err)
	}
	src, dst := linkMAC(t, l.remote, "eth0"), linkMAC(t, l.Node, "uplink0")
	for _, fam := range []int{4, 6} {
		for i, name := range []string{"reuse", "forged-syn", "reuse-hostport"} {
			port, cport := 7500+10*fam+i, 40500+10*fam+i
			pod, listen, dial := l.a, hp(l.aIP[fam], port), hp(l.aIP[fam], port)
			state := func() string { return l.polState(t, fam, port, cport) }
			if name == "reuse-hostport" {
				pod, listen, dial, port = web, hp(net.IPv6zero, 80), hp(uplinkIP[fam], hostPort), 80
				if fam == 4 {
					listen = hp(net.IPv4zero, 80)
				}
				state = func() string { return l.ctState(t, fam, cport) }
			}
			var ln net.Listener
			must(t, pod.Do(func(ns.NetNS) (err error) {
				ln, err = net.Listen(fmt.Sprintf("tcp%d", fam), listen)
				return
			}))
			t.Cleanup(func() { ln.Close() })
			connect := func() (cli, srv *net.TCPConn) {
				t.Helper()
				accepted := make(chan net.Conn, 1)
				go func() {
					if s, err := ln.Accept(); err == nil {
						accepted <- s
					}
				}()
				d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: remoteIP[fam], Port: cport}}
				var c net.Conn
				must(t, l.remote.Do(func(ns.NetNS) (err error) {
					c, err = d.Dial("tcp", dial)
					return
				}))
				t.Cleanup(func() { c.Close() })
				select {
				case s := <-accepted:
					t.Cleanup(func() { s.Close() })
					return c.(*net.TCPConn), s.(*net.TCPConn)
				case <-time.After(5 * time.Second):
					t.Fatalf("%s v%d: the pod accepted nothing", name, fam)
				}
				return nil, nil
			}
			cli, srv := connect()
			echo(t, cli, srv, fmt.Sprintf("%s v%d, first connection", name, fam))
			if st := state(); st != "established" {
				t.Fatalf("%s v%d: the flow is %s, want established", name, fam, st)
			}
			switch name {
			case "reuse", "reuse-hostport":
				// The client's host forgets the connection: its RST never leaves.
				unblock := blockTCP(t, l.remote, fam, "--sport", cport)
				cli.SetLinger(0)
				cli.Close()
				// The pod's socket times out on the silence: nothing of it leaves.
				unblockPod := blockTCP(t, pod, fam, "--sport", port)
				must(t, setUserTimeout(srv, 300*time.Millisecond))
				srv.Write([]byte("lost"))
				srv.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := srv.Read(make([]byte, 8)); err == nil || !strings.Contains(err.Error(), "timed out") {
					t.Fatalf("%s v%d: the pod's socket read: %v, want it timed out", name, fam, err)
				}
				unblock()
				unblockPod()
				cli, srv = connect()
				echo(t, cli, srv, fmt.Sprintf("%s v%d, second connection", name, fam))
			case "forged-syn":
				sendFrames(t, l.remote, "eth0", [][]byte{
					tcpFrame(src, dst, remoteIP[fam], cport, l.aIP[fam], port, 0x0badf00d, 0, tcpSYN, 1024),
				})
				time.Sleep(200 * time.Millisecond)
				if st := state(); st != "established" {
					t.Errorf("%s v%d: after the forged SYN the flow is %s, want established", name, fam, st)
				}
				echo(t, cli, srv, fmt.Sprintf("%s v%d, after the forged SYN", name, fam))
			}
			// The client's RST (at its own next number) closes the flow.
			cli.SetLinger(0)
			cli.Close()
			time.Sleep(200 * time.Millisecond)
			if st := state(); st != "closing" {
				t.Errorf("%s v%d: after the client's RST the flow is %s, want closing", name, fam, st)
			}
		}
	}
}

// ctState is the state of the hostPort flow (cni_ct) from the remote
// host's port cport in family fam, "absent" when there is none.
func (l *tcpTrackLab) ctState(t *testing.T, fam, cport int) string {
	t.Helper()
	flows, err := l.Maps().HostPorts().ListCT()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Proto == 6 && f.IPv6 == (fam == 6) && int(f.Client.Port()) == cport {
			return f.State
		}
	}
	return "absent"
}

// echo sends a byte each way over cli and srv.
func echo(t *testing.T, cli, srv net.Conn, what string) {
	t.Helper()
	buf := make([]byte, 1)
	for _, p := range [][2]net.Conn{{cli, srv}, {srv, cli}} {
		if _, err := p[0].Write([]byte("x")); err != nil {
			t.Fatalf("%s: write: %v", what, err)
		}
		p[1].SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := p[1].Read(buf); err != nil {
			t.Fatalf("%s: read: %v", what, err)
		}
	}
}

// setUserTimeout sets TCP_USER_TIMEOUT on c.
func setUserTimeout(c *net.TCPConn, d time.Duration) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, 0x12 /* TCP_USER_TIMEOUT */, int(d/time.Millisecond))
	})
	if err != nil {
		return err
	}
	return serr
}

// TestPolicyClosedFlowNotReopened: the remote host's connection to a's server
// was allowed when it opened; since, a's policy lets nothing in (the flow
// lives on: established flows are not cut). The client closes it with an
// RST, which closes a's flow entry, and dials again from the same port: a
// new connection, which the rules deny. The closed entry (10 s left) must
// not let its SYN in, as conntrack kills a closed entry a SYN meets and
// the rules judge the SYN as new. IPv4 and IPv6.
func TestPolicyClosedFlowNotReopened(t *testing.T) {
	t.Parallel()
	l := newTCPTrackLab(t, false)
	var allows []policy.Allow
	for _, fam := range []int{4, 6} {
		allows = append(allows, policy.Allow{Prefix: host(remoteIP[fam]), Ports: []policy.PortRange{{Proto: 6, First: 7600, Last: 7699}}})
	}
	w := l.Maps().Policy().Writer()
	if err := w.Apply(uint32(l.idx), policy.Endpoint{Ingress: isolated(allows...)}); err != nil {
		t.Fatal(err)
	}
	type conn struct {
		fam, port, cport int
		cli              net.Conn
	}
	var conns []conn
	for _, fam := range []int{4, 6} {
		port, cport := 7600+fam, 40600+fam
		var ln net.Listener
		must(t, l.a.Do(func(ns.NetNS) (err error) {
			ln, err = net.Listen(fmt.Sprintf("tcp%d", fam), hp(l.aIP[fam], port))
			return
		}))
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				s, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { s.Close() })
			}
		}()
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: remoteIP[fam], Port: cport}}
		var c net.Conn
		must(t, l.remote.Do(func(ns.NetNS) (err error) {
			c, err = d.Dial("tcp", hp(l.aIP[fam], port))
			return
		}))
		conns = append(conns, conn{fam, port, cport, c})
	}
	if err := w.Apply(uint32(l.idx), policy.Endpoint{Ingress: isolated()}); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		c.cli.(*net.TCPConn).SetLinger(0)
		c.cli.Close()
	}
	time.Sleep(200 * time.Millisecond)
	for _, c := range conns {
		if st := l.polState(t, c.fam, c.port, c.cport); st != "closing" {
			t.Errorf("v%d: after the client's RST a's flow is %s, want closing", c.fam, st)
		}
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: remoteIP[c.fam], Port: c.cport}}
		err := l.remote.Do(func(ns.NetNS) error {
			cc, err := d.Dial("tcp", hp(l.aIP[c.fam], c.port))
			if err == nil {
				cc.Close()
			}
			return err
		})
		if err == nil {
			t.Errorf("v%d: a new connection from the closed flow's port reached a, whose policy lets nothing in", c.fam)
		}
	}
}
