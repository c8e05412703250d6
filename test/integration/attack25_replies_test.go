// attack25: hostile review, black box, of NetworkPolicy's flow entries
// against traffic forged to look like an allowed flow's replies
// (docs/networkpolicy.md, "Flows"): "a 'reply' of a flow that no entry
// holds is judged by the rules like any new packet", and "an ICMP error
// passes when the packet it quotes belongs to a flow of the pod and it goes
// to that packet's sender".

package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// Remote's ports in attack25's reply tests: TCP only on a25TCPPort, UDP
// only on a25UDPPort, so the remote host can send from each port in the
// other protocol.
const (
	a25TCPPort   = 7101
	a25UDPPort   = 7102
	a25OtherPort = 7103
)

// a25Flows is pod a's two allowed flows with the remote host in one family:
// a TCP connection from a:tcpPort to remote:a25TCPPort and a UDP exchange
// from a:udpPort (an unconnected socket, udp) to remote:a25UDPPort.
type a25Flows struct {
	fam              int
	tcpPort, udpPort int
	conn             connPair
	udp              *net.UDPConn
	echo             *net.UDPConn // the remote host's UDP a25UDPPort
}

// a25Allow lets the remote host's TCP a25TCPPort and UDP a25UDPPort in
// family fam.
func a25Allow(fam int) policy.Allow {
	return policy.Allow{Prefix: host(remoteIP[fam]), Ports: []policy.PortRange{
		{Proto: policy.ProtoTCP, First: a25TCPPort, Last: a25TCPPort},
		{Proto: policy.ProtoUDP, First: a25UDPPort, Last: a25UDPPort}}}
}

// a25Lab is podPolLab with a isolated both ways, its egress allowing the
// remote host's TCP a25TCPPort and UDP a25UDPPort only, the remote host's
// servers on those, and a's two flows open in each family.
func a25Lab(t *testing.T) (*podPolLab, map[int]*a25Flows) {
	t.Helper()
	l := newPodPolLab(t)
	l.apply(t, policy.Endpoint{
		Ingress: isolated(),
		Egress:  isolated(a25Allow(4), a25Allow(6)),
	})
	flows := map[int]*a25Flows{}
	for _, fam := range []int{4, 6} {
		f := &a25Flows{fam: fam, tcpPort: 41000 + fam*10, udpPort: 41001 + fam*10}
		accepted := acceptTCP(t, l.remote, fam, hp(remoteIP[fam], a25TCPPort))
		var echo *net.UDPConn
		must(t, l.remote.Do(func(ns.NetNS) error {
			var err error
			echo, err = net.ListenUDP(fmt.Sprintf("udp%d", fam), &net.UDPAddr{IP: remoteIP[fam], Port: a25UDPPort})
			return err
		}))
		t.Cleanup(func() { echo.Close() })
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := echo.ReadFromUDP(buf)
				if err != nil {
					return
				}
				echo.WriteToUDP(append([]byte("echo:"), buf[:n]...), from)
			}
		}()
		var c net.Conn
		must(t, l.a.Do(func(ns.NetNS) error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: l.aIP[fam], Port: f.tcpPort}, Timeout: 2 * time.Second}
			var err error
			c, err = d.Dial("tcp", hp(remoteIP[fam], a25TCPPort))
			return err
		}))
		t.Cleanup(func() { c.Close() })
		select {
		case s := <-accepted:
			f.conn = connPair{"a-to-remote", fam, c, s}
		case <-time.After(3 * time.Second):
			t.Fatalf("IPv%d: remote accepted nothing", fam)
		}
		must(t, l.a.Do(func(ns.NetNS) error {
			var err error
			f.udp, err = net.ListenUDP(fmt.Sprintf("udp%d", fam), &net.UDPAddr{IP: l.aIP[fam], Port: f.udpPort})
			return err
		}))
		t.Cleanup(func() { f.udp.Close() })
		f.udpExchange(t, "opening")
		f.tcpExchange(t, "opening")
		f.echo = echo
		flows[fam] = f
	}
	return l, flows
}

// udpExchange sends msg to the remote echo from a's UDP socket and wants
// the echo back: the allowed flow's replies pass.
func (f *a25Flows) udpExchange(t *testing.T, msg string) {
	t.Helper()
	msg = fmt.Sprintf("%s-v%d", msg, f.fam)
	for try := 0; try < 3; try++ {
		if _, err := f.udp.WriteToUDP([]byte(msg), &net.UDPAddr{IP: remoteIP[f.fam], Port: a25UDPPort}); err != nil {
			t.Fatal(err)
		}
		if bigReceived(f.udp, "echo:"+msg, time.Second) {
			return
		}
	}
	t.Errorf("IPv%d: a's allowed UDP exchange with the remote host (%s) got no echo", f.fam, msg)
}

// tcpExchange sends a line each way on a's allowed connection.
func (f *a25Flows) tcpExchange(t *testing.T, msg string) {
	t.Helper()
	for _, dir := range []struct{ from, to net.Conn }{{f.conn.client, f.conn.srv}, {f.conn.srv, f.conn.client}} {
		if _, err := dir.from.Write([]byte(msg + "\n")); err != nil {
			t.Fatalf("IPv%d: write on a's connection: %v", f.fam, err)
		}
		dir.to.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, len(msg)+1)
		if _, err := readFull(dir.to, buf); err != nil || string(buf) != msg+"\n" {
			t.Errorf("IPv%d: a's allowed connection (%s): read %q, %v", f.fam, msg, buf, err)
		}
	}
}

func readFull(c net.Conn, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// TestAttack25ForgedRepliesOffTuple: pod a is isolated both ways; its
// egress allows the remote host's TCP 7101 and UDP 7102, and it holds one
// flow of each. The remote host, whose address is the allowed flows' peer,
// sends a what looks like replies of them but are not: UDP from the flow's
// peer port to a port a listens on but never used; UDP to a's TCP flow's
// port (the protocol differs); UDP from another port of the peer's to a's
// UDP flow's port; a TCP connection from the UDP flow's peer port to a's
// UDP flow's port (a listens there in TCP); bare ACKs from the TCP flow's
// peer port to a port a never used. The docs: a flow's entry holds its
// protocol, both addresses and both ports, and "a 'reply' of a flow that no
// entry holds is judged by the rules like any new packet": a's ingress
// allows nothing, so each must be dropped at a's door and counted as
// drop_policy ingress on a's host veth. The real flows keep working.
func TestAttack25ForgedRepliesOffTuple(t *testing.T) {
	t.Parallel()
	l, flows := a25Lab(t)
	drops := func() uint64 { return counter(t, l.m, l.idx, maps.DirIngress, maps.ReasonDropPolicy).Packets }
	for _, fam := range []int{4, 6} {
		f := flows[fam]
		aIP := l.aIP[fam]
		other := f.udpPort + 2 // a listens here (UDP and TCP) and never sent from it
		var lnOther, lnTCPPort *net.UDPConn
		must(t, l.a.Do(func(ns.NetNS) error {
			var err error
			if lnOther, err = net.ListenUDP(fmt.Sprintf("udp%d", fam), &net.UDPAddr{IP: aIP, Port: other}); err != nil {
				return err
			}
			lnTCPPort, err = net.ListenUDP(fmt.Sprintf("udp%d", fam), &net.UDPAddr{IP: aIP, Port: f.tcpPort})
			return err
		}))
		defer lnOther.Close()
		defer lnTCPPort.Close()
		tcpOnUDPPort := acceptTCP(t, l.a, fam, hp(aIP, f.udpPort))

		udpCases := []struct {
			name  string
			sport int
			dport int
			ln    *net.UDPConn
		}{
			{"udp-from-peer-port-to-unused-port", a25UDPPort, other, lnOther},
			{"udp-to-tcp-flow-port", a25TCPPort, f.tcpPort, lnTCPPort},
			{"udp-from-other-peer-port", a25OtherPort, f.udpPort, f.udp},
		}
		for _, c := range udpCases {
			marker := fmt.Sprintf("forged-%s-v%d", c.name, fam)
			before := drops()
			for i := 0; i < 3; i++ {
				if c.sport == a25UDPPort { // the echo server's own socket
					if _, err := f.echo.WriteToUDP([]byte(marker), &net.UDPAddr{IP: aIP, Port: c.dport}); err != nil {
						t.Fatal(err)
					}
					continue
				}
				sendForged(t, l.remote, &net.UDPAddr{IP: remoteIP[fam], Port: c.sport}, &net.UDPAddr{IP: aIP, Port: c.dport}, marker)
			}
			if bigReceived(c.ln, marker, time.Second) {
				t.Errorf("IPv%d %s: remote:%d -> a:%d reached a's socket, whose ingress allows nothing", fam, c.name, c.sport, c.dport)
			}
			if d := drops() - before; d < 3 {
				t.Errorf("IPv%d %s: a's drop_policy ingress counter moved by %d, want 3", fam, c.name, d)
			}
		}

		// TCP from the UDP flow's peer port to the UDP flow's pod port.
		before := drops()
		err := l.remote.Do(func(ns.NetNS) error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: remoteIP[fam], Port: a25UDPPort}, Timeout: 700 * time.Millisecond}
			c, err := d.Dial("tcp", hp(aIP, f.udpPort))
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			t.Errorf("IPv%d: remote:%d connected over TCP to a:%d, a's UDP flow's port (ingress allows nothing)", fam, a25UDPPort, f.udpPort)
		}
		select {
		case c := <-tcpOnUDPPort:
			c.Close()
			t.Errorf("IPv%d: a accepted remote's TCP connection on its UDP flow's port", fam)
		default:
		}
		if drops() == before {
			t.Errorf("IPv%d: remote's SYN to a's UDP flow's port: no drop_policy counted on a's ingress", fam)
		}

		// Bare ACKs (and an ACK carrying a FIN, a PSH) from the TCP flow's
		// peer port to a port a never used, and to the flow's pod port
		// from another peer port.
		remMAC, upMAC := linkMAC(t, l.remote, "eth0"), linkMAC(t, l.Node, "uplink0")
		frames := [][]byte{
			tcpFrame(remMAC, upMAC, remoteIP[fam], a25TCPPort, aIP, other, 1000, 1000, tcpACK, 512),
			tcpFrame(remMAC, upMAC, remoteIP[fam], a25TCPPort, aIP, other, 1000, 1000, tcpACK|tcpPSH, 512),
			tcpFrame(remMAC, upMAC, remoteIP[fam], a25TCPPort, aIP, other, 1000, 1000, tcpACK|tcpFIN, 512),
			tcpFrame(remMAC, upMAC, remoteIP[fam], a25OtherPort, aIP, f.tcpPort, 1000, 1000, tcpACK, 512),
			tcpFrame(remMAC, upMAC, remoteIP[fam], a25UDPPort, aIP, f.tcpPort, 1000, 1000, tcpACK, 512),
		}
		before = drops()
		sendFrames(t, l.remote, "eth0", frames)
		time.Sleep(300 * time.Millisecond)
		if d := drops() - before; d != uint64(len(frames)) {
			t.Errorf("IPv%d: %d forged ACKs off a's TCP flow's tuple: a's drop_policy ingress counter moved by %d, want %d",
				fam, len(frames), d, len(frames))
		}

		// The real flows still pass both ways.
		f.udpExchange(t, "after-forgeries")
		f.tcpExchange(t, "after-forgeries")
	}
}

// a25ICMPError is an ICMP (fam 4) or ICMPv6 message of type and code whose
// body (after the 4 bytes of the unused field / echo id and sequence)
// quotes the IP packet src:sport -> dst:dport of protocol proto, followed
// by marker. The ICMPv6 checksum is the kernel's.
func a25ICMPError(fam int, typ, code byte, proto uint8, src net.IP, sport int, dst net.IP, dport int, marker []byte) []byte {
	l4len := 8
	if proto == 6 {
		l4len = 20
	}
	q := quotedPacket(src, dst, proto, l4len)
	l4 := q[len(q)-l4len:]
	binary.BigEndian.PutUint16(l4[0:], uint16(sport))
	binary.BigEndian.PutUint16(l4[2:], uint16(dport))
	if proto == 6 {
		l4[12], l4[13] = 5<<4, tcpACK
	} else {
		binary.BigEndian.PutUint16(l4[4:], 8)
	}
	m := append(append([]byte{typ, code, 0, 0, 0x42, 0x42, 0, 1}, q...), marker...)
	if fam == 4 {
		binary.BigEndian.PutUint16(m[2:], csum16(m))
	}
	return m
}

// TestAttack25ICMPErrorsOffFlow: a's allowed UDP flow a:p -> remote:7102
// lives; the remote host sends a ICMP errors about it. The docs' test is
// conntrack's: the quoted packet belongs to a flow of the pod and the error
// goes to that packet's sender. One that quotes a's own datagram passes
// (control). Dropped, each counted as drop_policy ingress on a's host veth:
// an error quoting the flow the other way round (the remote's datagram to
// a: a did not send it), one quoting TCP on the UDP flow's ports, one
// quoting a's next port, and an echo reply (no error at all) carrying a's
// datagram's header.
func TestAttack25ICMPErrorsOffFlow(t *testing.T) {
	t.Parallel()
	l, flows := a25Lab(t)
	drops := func() uint64 { return counter(t, l.m, l.idx, maps.DirIngress, maps.ReasonDropPolicy).Packets }
	for _, fam := range []int{4, 6} {
		f := flows[fam]
		aIP, rIP := l.aIP[fam], remoteIP[fam]
		unreach, unreachCode, echoReply := byte(3), byte(3), byte(0)
		if fam == 6 {
			unreach, unreachCode, echoReply = 1, 4, 129
		}
		fd := rawICMPListen(t, l.a, fam)
		mark := func(name string) []byte { return []byte(fmt.Sprintf("a25-icmp-%s-v%d", name, fam)) }

		// Control: the error about a's own datagram reaches a.
		m := mark("control")
		sendICMP(t, l.remote, aIP, a25ICMPError(fam, unreach, unreachCode, 17, aIP, f.udpPort, rIP, a25UDPPort, m), 2)
		if !rawSaw(fd, m, 2*time.Second) {
			t.Errorf("IPv%d: the remote host's port unreachable about a's own datagram did not reach a", fam)
		}

		cases := []struct {
			name string
			msg  []byte
		}{
			{"reversed", a25ICMPError(fam, unreach, unreachCode, 17, rIP, a25UDPPort, aIP, f.udpPort, mark("reversed"))},
			{"tcp-on-udp-ports", a25ICMPError(fam, unreach, unreachCode, 6, aIP, f.udpPort, rIP, a25UDPPort, mark("tcp-on-udp-ports"))},
			{"next-port", a25ICMPError(fam, unreach, unreachCode, 17, aIP, f.udpPort+1, rIP, a25UDPPort, mark("next-port"))},
			{"echo-reply-carrying-quote", a25ICMPError(fam, echoReply, 0, 17, aIP, f.udpPort, rIP, a25UDPPort, mark("echo-reply-carrying-quote"))},
		}
		for _, c := range cases {
			before := drops()
			sendICMP(t, l.remote, aIP, c.msg, 3)
			if rawSaw(fd, mark(c.name), time.Second) {
				t.Errorf("IPv%d %s: the remote host's ICMP message reached a, whose ingress allows nothing", fam, c.name)
			}
			if d := drops() - before; d != 3 {
				t.Errorf("IPv%d %s: a's drop_policy ingress counter moved by %d, want 3", fam, c.name, d)
			}
		}
		f.udpExchange(t, "after-icmp")
	}
}
