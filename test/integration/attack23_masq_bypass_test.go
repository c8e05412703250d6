// attack23: hostile review, from the outside, of a pod's share of ports
// towards one destination (docs/masquerade.md, "No pod starves the
// others"): a pod, alone or with an accomplice outside the node that knows
// the masqueraded tuple (the server names it in its answer) but not the
// server's sequence numbers, tries to make a live connection stop counting.
// Each test: limit 8; the pod opens 8 connections, cheats on some, opens 8
// more and sends a line on all 16; more than 8 delivered means a live
// connection stopped counting.

package integration

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a23Raw is a raw IPv4 socket (IP_HDRINCL) made in one netns, kept open so
// that thousands of segments go out fast.
type a23Raw struct{ fd, fd6 int }

func a23OpenRaw(t *testing.T, netns ns.NetNS) *a23Raw {
	t.Helper()
	r := &a23Raw{fd: -1, fd6: -1}
	must(t, netns.Do(func(ns.NetNS) error {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
		r.fd = fd
		if err != nil {
			return err
		}
		r.fd6, err = syscall.Socket(syscall.AF_INET6, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
		return err
	}))
	t.Cleanup(func() { syscall.Close(r.fd); syscall.Close(r.fd6) })
	return r
}

// send sends the IPv4 or IPv6 packet pkt to its own destination address;
// ENOBUFS (a full qdisc under a burst) is retried.
func (r *a23Raw) send(pkt []byte) error {
	var sa syscall.Sockaddr
	fd := r.fd
	if pkt[0]>>4 == 6 {
		sa6 := &syscall.SockaddrInet6{}
		copy(sa6.Addr[:], pkt[24:40])
		sa, fd = sa6, r.fd6
	} else {
		sa4 := &syscall.SockaddrInet4{}
		copy(sa4.Addr[:], pkt[16:20])
		sa = sa4
	}
	for {
		err := syscall.Sendto(fd, pkt, 0, sa)
		if err != syscall.ENOBUFS {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// a23Conn is one of the pod's connections as the cheat sees it: the
// socket, its ports (the pod's, the server's, the node's as the server
// named it) and its next sequence numbers (snd: the pod's write_seq; rcv:
// the server's next).
type a23Conn struct {
	c                   net.Conn
	sport, dport, nport int
	snd, rcv            uint32
	x4                  net.IP
	v6                  net.IP // the pod's IPv6 address on an IPv6 connection
	x                   ns.NetNS
	pod, out            *a23Raw
}

// podSeg sends a segment from the pod (raw, its own address and port).
func (a *a23Conn) podSeg(t *testing.T, seq, ack uint32, flags byte, data []byte) {
	if a.v6 != nil {
		must(t, a.pod.send(a23TCP6(a.v6, a.sport, outsideIP6, a.dport, seq, ack, flags, data)))
		return
	}
	must(t, a.pod.send(a20TCP4(a.x4, a.sport, outsideIP, a.dport, seq, ack, flags, data)))
}

// srvSeg sends, from the outside netns, a segment forged as the server's to
// the node's masqueraded tuple.
func (a *a23Conn) srvSeg(t *testing.T, seq, ack uint32, flags byte) {
	if a.v6 != nil {
		must(t, a.out.send(a23TCP6(outsideIP6, a.dport, labNodeA6, a.nport, seq, ack, flags, nil)))
		return
	}
	must(t, a.out.send(a20TCP4(outsideIP, a.dport, labNodeA, a.nport, seq, ack, flags, nil)))
}

// a23TCP6 is a20TCP4's segment in IPv6.
func a23TCP6(src net.IP, sport int, dst net.IP, dport int, seq, ack uint32, flags byte, payload []byte) []byte {
	tcp := a20TCP4(net.IPv4zero, sport, net.IPv4zero, dport, seq, ack, flags, payload)[20:]
	tcp[16], tcp[17] = 0, 0
	ph := make([]byte, 40)
	copy(ph[0:], src.To16())
	copy(ph[16:], dst.To16())
	binary.BigEndian.PutUint32(ph[32:], uint32(len(tcp)))
	ph[39] = 6
	binary.BigEndian.PutUint16(tcp[16:], csum16(append(ph, tcp...)))
	h := make([]byte, 40)
	h[0], h[6], h[7] = 0x60, 6, 64
	binary.BigEndian.PutUint16(h[4:], uint16(len(tcp)))
	copy(h[8:], src.To16())
	copy(h[24:], dst.To16())
	return append(h, tcp...)
}

// a23Cheat acts on one of the pod's first connections; beforeFIN cheats
// run after the server's answer and before its FIN is read (its server
// half-closes later), the others once its FIN was read.
type a23Cheat func(t *testing.T, a *a23Conn)

// a23Round: pod id (local ports from base) opens 8 connections to the
// server on port (a server of halfCloseServer's), cheats on the first
// ncheat, opens 8 more and sends "again" on all 16. It returns how many
// delivered it.
func a23Round(t *testing.T, lab *masqLab, port int, delay time.Duration, id string, base, ncheat int, beforeFIN bool, cheat a23Cheat) int {
	return a23RoundAt(t, lab, outsideIP, port, delay, id, base, ncheat, beforeFIN, cheat)
}

// a23RoundAt is a23Round against the server on sip (outsideIP or
// outsideIP6).
func a23RoundAt(t *testing.T, lab *masqLab, sip net.IP, port int, delay time.Duration, id string, base, ncheat int, beforeFIN bool, cheat a23Cheat) int {
	return a23RoundFull(t, lab, sip, port, delay, id, base, ncheat, beforeFIN, cheat).n
}

// a23Result is what a23RoundFull saw: n connections of the 16 delivered
// "again", the pod's share towards the server after the first 8 (share0)
// and at the end (share), and the masquerade's counters at the end.
type a23Result struct {
	n, share0, share int
	counters         map[string]uint64
}

// a23RoundFull is a23RoundAt with the shares and counters.
func a23RoundFull(t *testing.T, lab *masqLab, sip net.IP, port int, delay time.Duration, id string, base, ncheat int, beforeFIN bool, cheat a23Cheat) a23Result {
	got, mu := a23HalfCloseServer(t, lab, sip, port, delay)
	srv := hp(sip, port)
	x, r := lab.a.RunPod(id)
	x4, x6 := testenv.PodIPs(t, r)
	if sip.To4() != nil {
		x6 = nil
	}
	pod, out := a23OpenRaw(t, x), a23OpenRaw(t, lab.out)
	var conns []net.Conn
	open := func(from int, first bool) {
		for j := from; j < from+8; j++ {
			f, err := a14Dial(x, "tcp", base+j, srv)
			if err != nil {
				t.Logf("%s: dial %d: %v", id, j, err)
				continue
			}
			t.Cleanup(func() { f.c.Close() })
			f.c.SetDeadline(time.Now().Add(4*time.Second + delay))
			f.c.Write([]byte("hello\n"))
			answer, _ := f.r.ReadString('\n')
			conns = append(conns, f.c)
			a := &a23Conn{c: f.c, sport: base + j, dport: port, x4: x4, v6: x6, x: x, pod: pod, out: out}
			if fs := strings.Fields(answer); len(fs) > 0 {
				if _, p, err := net.SplitHostPort(fs[0]); err == nil {
					a.nport, _ = strconv.Atoi(p)
				}
			}
			doCheat := first && j < ncheat && cheat != nil
			if doCheat && a.nport == 0 {
				t.Errorf("%s: no node port in the server's answer %q", id, answer)
			}
			if doCheat && beforeFIN {
				a.snd, a.rcv = a20Seqs(t, f.c)
				cheat(t, a)
			}
			io.Copy(io.Discard, f.r) // the server's FIN
			if doCheat && !beforeFIN {
				a.snd, a.rcv = a20Seqs(t, f.c)
				cheat(t, a)
			}
		}
	}
	open(0, true)
	time.Sleep(1200 * time.Millisecond)
	_, ifx := lab.a.HostVeth(id)
	s0, _ := a16Share(t, lab.a, ifx, "tcp", srv)
	open(8, false)
	mu.Lock()
	clear(got)
	mu.Unlock()
	for _, c := range conns {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		c.Write([]byte("again\n"))
	}
	time.Sleep(1500 * time.Millisecond)
	mu.Lock()
	n := len(got)
	mu.Unlock()
	s, c := a16Share(t, lab.a, ifx, "tcp", srv)
	t.Logf("%s: share after the first 8: %d; at the end %d of %d connections delivered, share %d, recycled %d, icmp_error_in %d, drop_pod_limit %d", id, s0, n, len(conns), s, c["recycled"], c["icmp_error_in"], c["drop_pod_limit"])
	return a23Result{n: n, share0: s0, share: s, counters: c}
}

// a23Lines is n bytes of 63-byte lines of 'x' (each ending "\n").
func a23Lines(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'x'
		if i%64 == 63 || i == n-1 {
			b[i] = '\n'
		}
	}
	return b
}

// TestAttack23MasqShareBlindAckSpray: the pod sends a raw FIN 16 MiB past
// its next sequence number (past the server's window: dropped, the FIN
// waits); the accomplice then sprays forged "server" ACKs of exactly the
// FIN's end, their sequence numbers every 32 KiB over the whole space
// (131072 segments: one lands within 32 KiB of the server's next, inside
// any window). A check of the server's segments that takes any sequence
// number in its window as "in order" lets one through.
func TestAttack23MasqShareBlindAckSpray(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "63200-63231")
	n := a23Round(t, lab, 7532, 0, "a23bs", 43000, 2, false, func(t *testing.T, a *a23Conn) {
		fin := a.snd + 1<<24
		a.podSeg(t, fin, a.rcv, 0x11, nil)
		for k := uint32(0); k < 1<<17; k++ {
			a.srvSeg(t, k<<15+7777, fin+1, 0x10)
		}
	})
	if n > 8 {
		t.Errorf("attack23: RED pod holds %d live connections to one server, over its share of 8: a FIN the server dropped (16 MiB past its window), then blind forged server ACKs of its end sprayed over the sequence space, counted", n)
	}
}

// TestAttack23MasqShareFINAfterZeroWindow: the server answers and then
// reads nothing for 1.5 s (then half-closes and reads on): the pod writes
// until its socket's buffer is full (the server's window closed, data
// queued unsent), then sends a raw FIN one below its write_seq (even
// connections: its end is where the queued data ends) or at it (odd: just
// past it); the server drops it (zero window). Then the pod completes its
// line: once the server reads, the queued data goes and the server
// acknowledges past the FIN's end.
func TestAttack23MasqShareFINAfterZeroWindow(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "63300-63331")
	n := a23Round(t, lab, 7533, 1500*time.Millisecond, "a23zw", 44000, 8, true, func(t *testing.T, a *a23Conn) {
		a.c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
		w, _ := a.c.Write(a23Lines(32 << 20))
		snd, rcv := a20Seqs(t, a.c)
		seq := snd - 1
		if a.sport%2 == 1 {
			seq = snd
		}
		a.podSeg(t, seq, rcv, 0x11, nil)
		a.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		tail := 64 - w%64 // to the end of the line cut by the deadline
		if tail < 64 {
			a.c.Write(a23Lines(64)[64-tail:])
		}
		t.Logf("port %d: %d bytes written before the window closed, FIN at write_seq%+d", a.sport, w, int32(seq-snd))
	})
	if n > 8 {
		t.Errorf("attack23: RED pod holds %d live connections to one server, over its share of 8: a FIN sent while the server's window was zero (dropped by it) counted once the queued data was acknowledged", n)
	}
}

// TestAttack23MasqShareFINWithDataDropped: as
// TestAttack23MasqShareFINAfterZeroWindow, the server's window closed, the
// pod's raw FIN at its write_seq carries 1400 bytes (a FIN with its last
// data) the server drops whole (its window is zero); the pod's socket then
// sends the same 1400 bytes and one more: the server acknowledges exactly the dropped FIN's
// end, with data only.
func TestAttack23MasqShareFINWithDataDropped(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "63400-63431")
	n := a23Round(t, lab, 7534, 1500*time.Millisecond, "a23fd", 45000, 8, true, func(t *testing.T, a *a23Conn) {
		a.c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
		w, _ := a.c.Write(a23Lines(32 << 20))
		snd, rcv := a20Seqs(t, a.c)
		// its last data: the rest of the line the deadline cut, then lines
		last := append(a23Lines(64)[w%64:], a23Lines(1400-64+w%64)...)
		a.podSeg(t, snd, rcv, 0x19, last)
		a.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		a.c.Write(append(last, '\n'))
	})
	if n > 8 {
		t.Errorf("attack23: RED pod holds %d live connections to one server, over its share of 8: a FIN carrying data the server dropped (zero window) counted when the socket's data reached its end", n)
	}
}

// TestAttack23MasqShareForgedServerRST: the accomplice outside sprays
// forged "server" RSTs on the node's masqueraded tuple, blind sequence
// numbers every 32 KiB over the space (131072 segments: some land in the
// pod's window, which its TCP answers with a challenge ACK and survives,
// RFC 5961; the server never sees them). The pod's connection lives on; an
// RST only the masquerade saw must not release its share.
func TestAttack23MasqShareForgedServerRST(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "64000-64031")
	n := a23Round(t, lab, 7560, 0, "a23rs", 47200, 2, false, func(t *testing.T, a *a23Conn) {
		c0 := a23Challenges(a.x)
		for k := uint32(0); k < 1<<17; k++ {
			if s := k<<15 + 7777; s != a.rcv {
				a.srvSeg(t, s, 0, 0x04)
			}
		}
		time.Sleep(100 * time.Millisecond)
		t.Logf("port %d: the pod's challenge ACKs (TcpExtTCPChallengeACK) %d -> %d", a.sport, c0, a23Challenges(a.x))
	})
	if n > 8 {
		t.Errorf("attack23: RED pod holds %d live connections to one server, over its share of 8: forged server RSTs from outside (blind sequence numbers, the pod's TCP survived them) released it", n)
	}
}

// a23ICMP4 is an ICMPv4 error (type, code) from src to dst quoting the
// first 8 bytes of a TCP segment of ours (qsrc:qsport -> qdst:qdport, seq).
func a23ICMP4(src, dst net.IP, typ, code byte, qsrc net.IP, qsport int, qdst net.IP, qdport int, seq uint32) []byte {
	q := a20TCP4(qsrc, qsport, qdst, qdport, seq, 0, 0x10, nil)[:28]
	icmp := append([]byte{typ, code, 0, 0, 0, 0, 0, 0}, q...)
	if typ == 3 && code == 4 {
		icmp[6], icmp[7] = 0x02, 0x30 // next-hop MTU 560
	}
	binary.BigEndian.PutUint16(icmp[2:], csum16(icmp))
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, 1
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(icmp)))
	copy(ip[12:], src.To4())
	copy(ip[16:], dst.To4())
	binary.BigEndian.PutUint16(ip[10:], csum16(ip))
	return append(ip, icmp...)
}

// TestAttack23MasqShareForgedICMPErrors: the accomplice outside sends, on
// each of the pod's first 8 connections, ICMP errors quoting the node's
// masqueraded segment (host and port unreachable, administratively
// prohibited: soft errors an established TCP survives, RFC 1122), from the
// server's address and from the gateway. The connection lives on; an ICMP
// error must not release its share.
func TestAttack23MasqShareForgedICMPErrors(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "64100-64131")
	n := a23Round(t, lab, 7561, 0, "a23ic", 47300, 8, false, func(t *testing.T, a *a23Conn) {
		for _, from := range []net.IP{outsideIP, labGW} {
			for _, code := range []byte{1, 3, 13} {
				must(t, a.out.send(a23ICMP4(from, labNodeA, 3, code, labNodeA, a.nport, outsideIP, a.dport, a.snd)))
			}
		}
	})
	if n > 8 {
		t.Errorf("attack23: RED pod holds %d live connections to one server, over its share of 8: forged ICMP errors from outside (soft errors its TCP survived) released it", n)
	}
}

// a23Challenges is the pod's count of challenge ACKs sent (RFC 5961).
func a23Challenges(x ns.NetNS) int {
	n := -1
	x.Do(func(ns.NetNS) error {
		b, err := os.ReadFile("/proc/net/netstat")
		if err != nil {
			return err
		}
		ls := strings.Split(string(b), "\n")
		for i := 0; i+1 < len(ls); i += 2 {
			ks, vs := strings.Fields(ls[i]), strings.Fields(ls[i+1])
			for j := range ks {
				if ks[j] == "TCPChallengeACK" && j < len(vs) {
					n, _ = strconv.Atoi(vs[j])
				}
			}
		}
		return nil
	})
	return n
}

// TestAttack23MasqShareOddFlags: pod by pod, a raw segment one below the
// pod's next with SYN and FIN (the server answers a SYN on an established
// connection with a challenge ACK of the pod's next: exactly the FIN's
// end), with SYN, FIN and ACK, with FIN and RST (an RST out of the
// server's window, ignored), and with FIN and URG.
func TestAttack23MasqShareOddFlags(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "64500-64595")
	for i, c := range []struct {
		id    string
		flags byte
	}{{"a23o03", 0x03}, {"a23o13", 0x13}, {"a23o05", 0x05}, {"a23o31", 0x31}} {
		n := a23Round(t, lab, 7591+i, 0, c.id, 49200+100*i, 8, false, func(t *testing.T, a *a23Conn) {
			a.podSeg(t, a.snd-1, a.rcv, c.flags, nil)
		})
		if n > 8 {
			t.Errorf("attack23: RED pod %s holds %d live connections to one server, over its share of 8: a segment one below its next with flags %#02x counted as its close", c.id, n, c.flags)
		}
	}
}
