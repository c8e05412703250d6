// fin20: attacks on the rule that closed attack20's red (docs/masquerade.md,
// "No pod starves the others"): a pod's FIN counts only when its end is
// past the highest end the pod sent (or it is the waiting FIN again), and
// data reaching a waiting FIN's end cancels it.

package integration

import (
	"bufio"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// f20Send is what a round sends on each of the pod's first 8 connections
// once the server's answer and FIN were read: snd and rcv are the socket's
// next sequence numbers.
type f20Send func(t *testing.T, x ns.NetNS, x4 net.IP, sport int, c net.Conn, snd, rcv uint32)

// f20Dial is a14Dial with the SYN's sequence number chosen (isn != 0): set
// through TCP_REPAIR before connect, which keeps a write_seq already set.
func f20Dial(x ns.NetNS, lport int, srv string, isn uint32) (*a14Flow, error) {
	if isn == 0 {
		return a14Dial(x, "tcp", lport, srv)
	}
	var f *a14Flow
	err := x.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 4 * time.Second, LocalAddr: &net.TCPAddr{Port: lport},
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				rc.Control(func(fd uintptr) {
					f := int(fd)
					for _, o := range [][2]int{{unix.TCP_REPAIR, 1}, {unix.TCP_REPAIR_QUEUE, 2}, {unix.TCP_QUEUE_SEQ, int(int32(isn))}, {unix.TCP_REPAIR, 0}} {
						if serr == nil {
							serr = unix.SetsockoptInt(f, unix.IPPROTO_TCP, o[0], o[1])
						}
					}
				})
				return serr
			}}
		c, err := d.Dial("tcp", srv)
		if err != nil {
			return err
		}
		f = &a14Flow{c: c, r: bufio.NewReader(c), proto: "tcp"}
		return nil
	})
	return f, err
}

// f20Round: pod id opens 8 connections (from base, ISN isn unless 0) to the
// half-closing server on port, reads each answer and the server's FIN,
// hands each to send, then opens 8 more and sends "again" on all 16.
// Returns how many delivered it (more than 8: over the pod's share).
func f20Round(t *testing.T, lab *masqLab, port int, id string, base int, isn uint32, send f20Send) int {
	got, mu := a20HalfCloseServer(t, lab, port)
	srv := hp(outsideIP, port)
	x, r := lab.a.RunPod(id)
	x4, _ := testenv.PodIPs(t, r)
	var conns []net.Conn
	open := func(from int, first bool) {
		for j := from; j < from+8; j++ {
			f, err := f20Dial(x, base+j, srv, isn)
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
			if first && send != nil {
				snd, rcv := a20Seqs(t, f.c)
				send(t, x, x4, base+j, f.c, snd, rcv)
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
	t.Logf("%s: share after the first 8: %d; at the end %d of %d connections delivered, share %d, recycled %d", id, s0, n, len(conns), s, c["recycled"])
	return n
}

func f20Lab(t *testing.T, portRange string) *masqLab {
	lab := newMasqLab(t)
	lab.a.Extra["ipMasqPortRange"] = portRange
	lab.a.Extra["ipMasqPodPortLimit"] = 8
	return lab
}

// f20Raw sends one raw segment from the pod to the server on port.
func f20Raw(t *testing.T, x ns.NetNS, x4 net.IP, sport, port int, seq, ack uint32, flags byte, data []byte) {
	must(t, a15SendRaw4(x, outsideIP, a20TCP4(x4, sport, outsideIP, port, seq, ack, flags, data)))
}

// TestAttack20MasqShareFINOldByte: as TestAttack20MasqShareFINBelowNext,
// the raw FIN two below the pod's next sequence number carrying one byte
// (its second-to-last, again): its end is the pod's next, the server takes
// it for a retransmission and acknowledges exactly that end.
func TestAttack20MasqShareFINOldByte(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "62500-62531")
	n := f20Round(t, lab, 7492, "f20ob", 53000, 0, func(t *testing.T, x ns.NetNS, x4 net.IP, sport int, _ net.Conn, snd, rcv uint32) {
		f20Raw(t, x, x4, sport, 7492, snd-2, rcv, 0x19, []byte("o"))
	})
	if n > 8 {
		t.Errorf("pod holds %d live connections to one server, over its share of 8: FINs carrying an old byte (end = its next sequence number) counted", n)
	}
}

// TestAttack20MasqShareFINAheadOfData: the raw FIN goes first, one byte
// past the pod's next sequence number (new sequence space), then the
// socket sends two bytes ("z\n") over it: the server queues the FIN out of
// order, drops it once the data fills the hole (its end is no longer
// ahead) and acknowledges the data, whose end is exactly the FIN's.
func TestAttack20MasqShareFINAheadOfData(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "62600-62631")
	n := f20Round(t, lab, 7493, "f20ad", 54000, 0, func(t *testing.T, x ns.NetNS, x4 net.IP, sport int, c net.Conn, snd, rcv uint32) {
		f20Raw(t, x, x4, sport, 7493, snd+1, rcv, 0x11, nil)
		c.Write([]byte("z\n"))
	})
	if n > 8 {
		t.Errorf("pod holds %d live connections to one server, over its share of 8: FINs sent ahead of data that later took their place counted", n)
	}
}

// TestAttack20MasqShareFINUnsentAck: the raw FIN at exactly the pod's next
// sequence number, but acknowledging data the server never sent: the
// server drops it and answers with an ACK of the pod's earlier end. The
// pod then goes on sending on the connection.
func TestAttack20MasqShareFINUnsentAck(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "62700-62731")
	n := f20Round(t, lab, 7494, "f20ua", 55000, 0, func(t *testing.T, x ns.NetNS, x4 net.IP, sport int, _ net.Conn, snd, rcv uint32) {
		f20Raw(t, x, x4, sport, 7494, snd, rcv+100000, 0x11, nil)
	})
	if n > 8 {
		t.Errorf("pod holds %d live connections to one server, over its share of 8: FINs the server dropped (acking unsent data) counted", n)
	}
}

// TestAttack20MasqShareFINWrap: the pod's sequence numbers wrap around
// 2^32 inside its first line (ISN 2^32 - 4). A FIN one below its next
// sequence number (past the wrap) must not count; its own FIN at its next
// (pod w, 8 connections closed by a raw FIN each) must.
func TestAttack20MasqShareFINWrap(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "62800-62831")
	const isn = 1<<32 - 4
	n := f20Round(t, lab, 7495, "f20wx", 56000, isn, func(t *testing.T, x ns.NetNS, x4 net.IP, sport int, _ net.Conn, snd, rcv uint32) {
		if snd > 1<<31 {
			t.Errorf("next sequence number %#x: the ISN did not take, no wrap", snd)
		}
		f20Raw(t, x, x4, sport, 7495, snd-1, rcv, 0x11, nil)
	})
	if n > 8 {
		t.Errorf("pod holds %d live connections to one server, over its share of 8: FINs one below next across the wrap counted", n)
	}

	// The pod's own FINs across the wrap release its share.
	srv := hp(outsideIP, 7496)
	a20HalfCloseServer(t, lab, 7496)
	w, r := lab.a.RunPod("f20ww")
	w4, _ := testenv.PodIPs(t, r)
	var conns []net.Conn
	for j := 0; j < 8; j++ {
		f, err := f20Dial(w, 57000+j, srv, isn)
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
	_, ifw := lab.a.HostVeth("f20ww")
	if s0, _ := a16Share(t, lab.a, ifw, "tcp", srv); s0 != 8 {
		t.Fatalf("control: w's share with 8 half-closed connections is %d, want 8", s0)
	}
	for j, c := range conns {
		snd, rcv := a20Seqs(t, c)
		f20Raw(t, w, w4, 57000+j, 7496, snd, rcv, 0x11, nil)
	}
	var s int
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if s, _ = a16Share(t, lab.a, ifw, "tcp", srv); s == 0 {
			break
		}
	}
	if s != 0 {
		t.Errorf("w closed its 8 connections by FINs at its next sequence number, past the wrap: share %d, want 0", s)
	}
}

// f20DelayedCloseServer serves on outsideIP:port: it answers a client's
// first line, half-closes 600 ms later and reads on, recording in got the
// clients whose "again" lines arrive.
func f20DelayedCloseServer(t *testing.T, lab *masqLab, port int) (map[string]bool, *sync.Mutex) {
	return halfCloseServer(t, lab, port, 600*time.Millisecond)
}

// TestAttack20MasqShareFINAfterSYN: the pod re-seeds its flow's tracking
// with a raw SYN on the live tuple (the masquerade takes a pod's SYN as the
// port reused: its end then is the SYN's), its sequence number one below
// the server's next (so the tracking's end, from the SYN, matches the
// server's), after its last data and before the server's FIN (the server
// answers a SYN on an established connection with a challenge ACK and
// changes nothing). Then, where its next sequence number is past the SYN's
// (half of the connections), a FIN one below it: past the re-seeded end,
// and the server's duplicate ACK of it lines up with the re-seeded end.
func TestAttack20MasqShareFINAfterSYN(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "62900-62931")
	got, mu := f20DelayedCloseServer(t, lab, 7497)
	srv := hp(outsideIP, 7497)
	x, r := lab.a.RunPod("f20sy")
	x4, _ := testenv.PodIPs(t, r)
	var conns []net.Conn
	sent := 0
	for j := 0; j < 16; j++ {
		f, err := a14Dial(x, "tcp", 58000+j, srv)
		if err != nil {
			t.Logf("dial %d: %v", j, err)
			continue
		}
		t.Cleanup(func() { f.c.Close() })
		f.c.SetDeadline(time.Now().Add(4 * time.Second))
		f.c.Write([]byte("hello\n"))
		f.r.ReadString('\n')
		conns = append(conns, f.c)
		if j >= 8 {
			continue
		}
		snd, rcv := a20Seqs(t, f.c)
		f20Raw(t, x, x4, 58000+j, 7497, rcv-1, 0, 0x02, nil)
		io.Copy(io.Discard, f.r) // the server's FIN
		if int32(snd-rcv) > 0 {
			f20Raw(t, x, x4, 58000+j, 7497, snd-1, rcv+1, 0x11, nil)
			sent++
		}
		if j == 7 {
			time.Sleep(1200 * time.Millisecond)
		}
	}
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
	_, ifx := lab.a.HostVeth("f20sy")
	s, c := a16Share(t, lab.a, ifx, "tcp", srv)
	t.Logf("FINs after a SYN on %d of the first 8; at the end %d of %d connections delivered, share %d, recycled %d", sent, n, len(conns), s, c["recycled"])
	if n > 8 {
		t.Errorf("pod holds %d live connections to one server, over its share of 8: FINs below next after a SYN re-seeding the tracking counted", n)
	}
}
