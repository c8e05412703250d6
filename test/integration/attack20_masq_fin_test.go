// attack20: hostile review of "the pod's FIN counts only once the server
// acknowledged it" (docs/masquerade.md, "No pod starves the others"): the
// server's acknowledgement names the FIN's end, but it also names any
// segment that ends where the pod's data ends.

package integration

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a20TCP4 is an IPv4 TCP segment with an ack number, a window and a payload.
func a20TCP4(src net.IP, sport int, dst net.IP, dport int, seq, ack uint32, flags byte, payload []byte) []byte {
	tcp := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(tcp[0:], uint16(sport))
	binary.BigEndian.PutUint16(tcp[2:], uint16(dport))
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12], tcp[13] = 5<<4, flags
	binary.BigEndian.PutUint16(tcp[14:], 502)
	tcp = append(tcp, payload...)
	ph := make([]byte, 12)
	copy(ph[0:], src.To4())
	copy(ph[4:], dst.To4())
	ph[9] = 6
	binary.BigEndian.PutUint16(ph[10:], uint16(len(tcp)))
	binary.BigEndian.PutUint16(tcp[16:], csum16(append(ph, tcp...)))
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, 6
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
	copy(ip[12:], src.To4())
	copy(ip[16:], dst.To4())
	binary.BigEndian.PutUint16(ip[10:], csum16(ip))
	return append(ip, tcp...)
}

// a20Seqs reads a TCP socket's next sequence number to send and to
// receive (TCP_REPAIR, as CRIU does), leaving the socket as it was.
func a20Seqs(t *testing.T, c net.Conn) (snd, rcv uint32) {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	rc.Control(func(fd uintptr) {
		f := int(fd)
		q := func(which int) uint32 {
			if serr != nil {
				return 0
			}
			if serr = unix.SetsockoptInt(f, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, which); serr != nil {
				return 0
			}
			v, err := unix.GetsockoptInt(f, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
			serr = err
			return uint32(v)
		}
		if serr = unix.SetsockoptInt(f, unix.IPPROTO_TCP, unix.TCP_REPAIR, 1); serr != nil {
			return
		}
		snd, rcv = q(2), q(1) // TCP_SEND_QUEUE, TCP_RECV_QUEUE
		unix.SetsockoptInt(f, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, 0)
		if err := unix.SetsockoptInt(f, unix.IPPROTO_TCP, unix.TCP_REPAIR, 0); serr == nil {
			serr = err
		}
	})
	if serr != nil {
		t.Fatalf("TCP_REPAIR: %v", serr)
	}
	return snd, rcv
}

// a20HalfCloseServer serves on outsideIP:port: it answers a client's first
// line, half-closes (its FIN) and reads on, recording in got the clients
// whose "again" lines arrive.
func a20HalfCloseServer(t *testing.T, lab *masqLab, port int) (map[string]bool, *sync.Mutex) {
	return halfCloseServer(t, lab, port, 0)
}

// halfCloseServer is a20HalfCloseServer's server, half-closing delay after
// its answer (0: at once).
func halfCloseServer(t *testing.T, lab *masqLab, port int, delay time.Duration) (map[string]bool, *sync.Mutex) {
	var mu sync.Mutex
	got := map[string]bool{}
	must(t, lab.out.Do(func(ns.NetNS) error {
		ln, err := net.Listen("tcp", hp(outsideIP, port))
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		acceptEach(ln, func(c net.Conn) {
			c.SetDeadline(time.Now().Add(40 * time.Second))
			r := bufio.NewReader(c)
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s", c.RemoteAddr(), line)
			time.Sleep(delay)
			c.(*net.TCPConn).CloseWrite()
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if strings.HasPrefix(line, "again") {
					mu.Lock()
					got[c.RemoteAddr().String()] = true
					mu.Unlock()
				}
			}
		})
		return nil
	}))
	return got, &mu
}

// TestAttack20MasqShareFINBelowNext: limit 8 on a 32-port range, the server
// of TestAttack16MasqShareBogusFIN (answers, half-closes, reads on). Pod x
// opens 8 connections, reads each answer and the server's FIN, then sends
// on each, from a raw socket, a FIN one below its next sequence number
// (its last byte, already acknowledged, again with a FIN). The server's
// TCP takes it for an old retransmission: it ignores the FIN and answers
// with a duplicate ACK, whose number is exactly the FIN's end. x then
// opens 8 more and sends a line on all 16: more than 8 node ports
// delivering it means a FIN the server never took released x's share.
func TestAttack20MasqShareFINBelowNext(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	lab.a.Extra["ipMasqPortRange"] = "62300-62331"
	lab.a.Extra["ipMasqPodPortLimit"] = 8
	got, mu := a20HalfCloseServer(t, lab, 7490)
	srv := hp(outsideIP, 7490)
	run := func(id string, base int, fin bool) int {
		x, r := lab.a.RunPod(id)
		x4, _ := testenv.PodIPs(t, r)
		var conns []net.Conn
		open := func(from int, first bool) {
			for j := from; j < from+8; j++ {
				f, err := a14Dial(x, "tcp", base+j, srv)
				if err != nil {
					t.Logf("%s: dial %d: %v", id, j, err)
					continue
				}
				t.Cleanup(func() { f.c.Close() })
				f.c.SetDeadline(time.Now().Add(4 * time.Second))
				f.c.Write([]byte("hello\n"))
				f.r.ReadString('\n')
				io.Copy(io.Discard, f.r) // the server's FIN
				conns = append(conns, f.c)
				if first {
					snd, rcv := a20Seqs(t, f.c) // the control reads them too
					if fin {
						must(t, a15SendRaw4(x, outsideIP, a20TCP4(x4, base+j, outsideIP, 7490, snd-1, rcv, 0x11, nil)))
					}
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
		t.Logf("%s (FINs below next %v): share after the first 8: %d; at the end %d of %d connections delivered, share %d, recycled %d", id, fin, s0, n, len(conns), s, c["recycled"])
		return n
	}
	if n := run("a20fy", 50000, false); n > 8 {
		t.Errorf("control: pod y, no FIN sent, has %d live flows to one server, over its share of 8", n)
	}
	if n := run("a20fx", 51000, true); n > 8 {
		t.Errorf("pod x holds %d live masqueraded connections to one server, over its share of 8: its FINs one below its next sequence number (ignored by the server, answered by a duplicate ACK naming their end) counted as its close", n)
	}
}

// TestAttack20MasqShareFINWithData: the server of
// TestAttack20MasqShareFINBelowNext; pod x opens 8 connections, reads each
// answer and the server's FIN, then closes 4 by a FIN carrying its last
// line ("bye", as a TCP sends its last data and its FIN together) and 4 by
// a bare FIN, both from a raw socket at its next sequence number: the
// server takes each (its ACK covers the FIN). A FIN each way: x's share
// must fall to 0.
func TestAttack20MasqShareFINWithData(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	lab.a.Extra["ipMasqPortRange"] = "62400-62431"
	lab.a.Extra["ipMasqPodPortLimit"] = 8
	a20HalfCloseServer(t, lab, 7491)
	srv := hp(outsideIP, 7491)
	x, r := lab.a.RunPod("a20dx")
	x4, _ := testenv.PodIPs(t, r)
	var conns []net.Conn
	for j := 0; j < 8; j++ {
		f, err := a14Dial(x, "tcp", 52000+j, srv)
		if err != nil {
			t.Fatalf("dial %d: %v", j, err)
		}
		t.Cleanup(func() { f.c.Close() })
		f.c.SetDeadline(time.Now().Add(4 * time.Second))
		f.c.Write([]byte("hello\n"))
		f.r.ReadString('\n')
		io.Copy(io.Discard, f.r)
		conns = append(conns, f.c)
	}
	_, ifx := lab.a.HostVeth("a20dx")
	if s0, _ := a16Share(t, lab.a, ifx, "tcp", srv); s0 != 8 {
		t.Fatalf("control: x's share with 8 half-closed connections is %d, want 8", s0)
	}
	for j, c := range conns {
		snd, rcv := a20Seqs(t, c)
		var data []byte
		if j < 4 {
			data = []byte("bye\n")
		}
		must(t, a15SendRaw4(x, outsideIP, a20TCP4(x4, 52000+j, outsideIP, 7491, snd, rcv, 0x19, data)))
	}
	var s int
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if s, _ = a16Share(t, lab.a, ifx, "tcp", srv); s == 0 {
			break
		}
	}
	if s != 0 {
		t.Errorf("x closed its 8 connections by FINs the server took (4 of them carrying data): share %d, want 0", s)
	}
}
