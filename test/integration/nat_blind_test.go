// Blind attacks on a masqueraded TCP flow's tracked sequence number (issue
// 28 defect 3, hostile review): the attacker on node A's link knows the
// flow's wire tuple but sees none of its segments.

package integration

import (
	"encoding/binary"
	"math/rand"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// masqIdleConn opens a connection from pod to a server in the outside
// namespace on srv:port and returns both ends and the node port the
// server saw.
func masqIdleConn(t *testing.T, lab *masqLab, pod ns.NetNS, srv, node net.IP, port int) (cli, sc net.Conn, nodePort int) {
	t.Helper()
	var ln net.Listener
	if err := lab.out.Do(func(ns.NetNS) (err error) { ln, err = net.Listen("tcp", hp(srv, port)); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if s, err := ln.Accept(); err == nil {
			accepted <- s
		}
	}()
	if err := pod.Do(func(ns.NetNS) (err error) {
		cli, err = net.DialTimeout("tcp", hp(srv, port), 5*time.Second)
		return
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	select {
	case sc = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the server accepted nothing")
	}
	t.Cleanup(func() { sc.Close() })
	seen := sc.RemoteAddr().(*net.TCPAddr)
	if !seen.IP.Equal(node) {
		t.Fatalf("the server saw %s, want node A's address", seen)
	}
	return cli, sc, seen.Port
}

// TestMasqBlindRSTSpray: a blind attacker covers the whole sequence space
// against a masquerading pod's idle connection. "rst": one RST every
// 2*65535 sequence numbers (32769 frames), so one of them lands within the
// pod's smallest tracked window of the server's next sequence number.
// "push": one-byte data segments every 4*65535 sequence numbers, each
// followed by an RST at the segment's end (16385 pairs), so that one
// segment carries the tracked sequence number to a value the attacker
// chose and its RST then matches it exactly. Neither attacker saw a
// segment of the flow; conntrack (Linux 6.x) closes a flow only on an RST
// at exactly the sequence number the pod acknowledged, and the pod's own
// TCP (RFC 5961) answers any other with a challenge ACK, so a ptp pod
// keeps its connection. Here the flow must not be marked closing, and after
// longer than a closed flow lives (10 s) the server's next segment must
// still reach the pod. IPv4 and IPv6. Fails on nat-hardening 82548ff: both
// sprays close the flow.
func TestMasqBlindRSTSpray(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	pod := a.NewPod()
	a.CleanupDel(pod, "p")
	a.Add(pod, "p")
	brMAC, upMAC := linkMAC(t, lab.out, "br0"), linkMAC(t, a.Node, "uplink0")

	for _, c := range []struct {
		name      string
		srv, node net.IP
		port      int
		push      bool
	}{
		{"rst/v4", outsideIP, labNodeA, 7204, false},
		{"rst/v6", outsideIP6, labNodeA6, 7206, false},
		{"push/v4", outsideIP, labNodeA, 7214, true},
		{"push/v6", outsideIP6, labNodeA6, 7216, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cli, sc, nodePort := masqIdleConn(t, lab, pod, c.srv, c.node, c.port)
			off := rand.Uint32() // the attacker knows nothing of the server's ISN
			var spray [][]byte
			if !c.push {
				for k := uint64(0); k*2*65535 < 1<<32; k++ {
					seq := off + uint32(k*2*65535)
					flags := byte(tcpRST)
					if k%2 == 1 {
						flags |= tcpACK
					}
					spray = append(spray, tcpFrame(brMAC, upMAC, c.srv, c.port, c.node, nodePort, seq, 0, flags, 0))
				}
			} else {
				for k := uint64(0); k*4*65535 < 1<<32; k++ {
					seq := off + uint32(k*4*65535)
					spray = append(spray,
						tcpDataFrame(brMAC, upMAC, c.srv, c.port, c.node, nodePort, seq, 0, tcpACK|tcpPSH, []byte{'x'}),
						tcpFrame(brMAC, upMAC, c.srv, c.port, c.node, nodePort, seq+1, 0, tcpRST, 0))
				}
			}
			sendFrames(t, lab.out, "br0", spray)
			time.Sleep(200 * time.Millisecond)
			flows, err := a.Maps().ListSNAT()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range flows {
				if f.Peer.Port() == uint16(c.port) && int(f.Node.Port()) == nodePort && f.Closing {
					t.Errorf("%d blind frames marked the flow %+v closing (it dies in 10 s)", len(spray), f)
				}
			}
			time.Sleep(11 * time.Second) // longer than a closed flow's 10 s
			if _, err := sc.Write([]byte("pong\n")); err != nil {
				t.Fatal(err)
			}
			cli.SetReadDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 16)
			if n, err := cli.Read(buf); err != nil || string(buf[:n]) != "pong\n" {
				t.Fatalf("the pod's idle connection after %d blind frames: read %q, %v; want pong", len(spray), buf[:n], err)
			}
		})
	}
}

// tcpDataFrame is a TCP segment without options, carrying payload.
func tcpDataFrame(src, dst net.HardwareAddr, sip net.IP, sport int, dip net.IP, dport int, seq, ack uint32, flags byte, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(h[0:], uint16(sport))
	binary.BigEndian.PutUint16(h[2:], uint16(dport))
	binary.BigEndian.PutUint32(h[4:], seq)
	binary.BigEndian.PutUint32(h[8:], ack)
	h[12] = 5 << 4
	h[13] = flags
	binary.BigEndian.PutUint16(h[14:], 512)
	return l4Frame(src, dst, sip, dip, 6, append(h, payload...), 16)
}

// TestMasqBlindFIN: a masquerading pod half-closes its connection to an
// outside server (it sent its request and shut down its side, as a client
// of a long poll does) and waits for the answer. A blind attacker sends
// 2048 FINs naming the flow's tuple, sequence numbers spread over the
// whole space (none at the server's next one). With the pod's FIN, a FIN
// from the peer marks the flow closing: it must count only when it is the
// server's (in order), or the flow dies 10 s later and the server's answer
// is lost, where conntrack checks a FIN's sequence number as any
// segment's. IPv4 and IPv6. Fails on nat-hardening 82548ff.
func TestMasqBlindFIN(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	pod := a.NewPod()
	a.CleanupDel(pod, "p")
	a.Add(pod, "p")
	brMAC, upMAC := linkMAC(t, lab.out, "br0"), linkMAC(t, a.Node, "uplink0")

	for _, c := range []struct {
		name      string
		srv, node net.IP
		port      int
	}{{"v4", outsideIP, labNodeA, 7404}, {"v6", outsideIP6, labNodeA6, 7406}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cli, sc, nodePort := masqIdleConn(t, lab, pod, c.srv, c.node, c.port)
			if err := cli.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			sc.SetReadDeadline(time.Now().Add(3 * time.Second))
			if n, err := sc.Read(make([]byte, 8)); n != 0 || err == nil {
				t.Fatalf("the server read %d, %v; want the pod's FIN", n, err)
			}
			off := rand.Uint32()
			var spray [][]byte
			for i := uint32(0); i < 2048; i++ {
				spray = append(spray, tcpFrame(brMAC, upMAC, c.srv, c.port, c.node, nodePort, off+i<<21, rand.Uint32(), tcpFIN|tcpACK, 512))
			}
			sendFrames(t, lab.out, "br0", spray)
			time.Sleep(12 * time.Second) // longer than a closed flow's 10 s
			if _, err := sc.Write([]byte("pong\n")); err != nil {
				t.Fatal(err)
			}
			cli.SetReadDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 16)
			if n, err := cli.Read(buf); err != nil || string(buf[:n]) != "pong\n" {
				t.Fatalf("the pod's half-closed connection after %d blind FINs: read %q, %v; want pong", len(spray), buf[:n], err)
			}
		})
	}
}
