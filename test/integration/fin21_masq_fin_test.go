// fin21: attacks on the bound that closed attack21's red (docs/masquerade.md,
// "No pod starves the others"): the pod's highest end moves only within the
// server's acknowledgement A plus the largest window, A moves only with the
// server's segments at exactly its next sequence number.

package integration

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// f21Send is what a round sends on each of the pod's first 8 connections
// once the server's answer and FIN were read: node is the address and port
// the server saw, snd and rcv the socket's next sequence numbers.
type f21Send func(t *testing.T, x ns.NetNS, x4 net.IP, sport int, c net.Conn, node *net.TCPAddr, snd, rcv uint32)

// f21Round is f20Round with the node's address and port (from the server's
// answer, which starts with what it saw) handed to send.
func f21Round(t *testing.T, lab *masqLab, port int, id string, base int, send f21Send) int {
	got, mu := a20HalfCloseServer(t, lab, port)
	srv := hp(outsideIP, port)
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
			line, _ := f.r.ReadString('\n')
			io.Copy(io.Discard, f.r) // the server's FIN
			conns = append(conns, f.c)
			if first && send != nil {
				node, err := net.ResolveTCPAddr("tcp", strings.Fields(line + " ?")[0])
				if err != nil {
					t.Fatalf("%s: the server's answer %q: %v", id, line, err)
				}
				snd, rcv := a20Seqs(t, f.c)
				send(t, x, x4, base+j, f.c, node, snd, rcv)
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

// f21Line is 100 bytes of data ending a line (the server reads lines).
var f21Line = []byte(strings.Repeat("d", 99) + "\n")

// TestFin21MasqShareFINInFlight: the pod's socket sends 100 bytes (its
// next sequence number then X) and at once, before the server's ack, from
// a raw socket: a FIN at X-1 (pod f21fi: the server takes it for an old
// retransmission of the data's last byte), or attack21's five jumps round
// the sequence space from X and then that FIN (pod f21fj: A still the
// server's ack before the data). Before fin21 the second made 16 of 16
// connections live at a share limit of 8.
func TestFin21MasqShareFINInFlight(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "63000-63063")
	n := f21Round(t, lab, 7501, "f21fi", 59000, func(t *testing.T, x ns.NetNS, x4 net.IP, sport int, c net.Conn, _ *net.TCPAddr, snd, rcv uint32) {
		c.Write(f21Line)
		f20Raw(t, x, x4, sport, 7501, snd+99, rcv, 0x11, nil)
	})
	if n > 8 {
		t.Errorf("pod f21fi holds %d live connections to one server, over its share of 8: a FIN one below the end of data in flight counted", n)
	}
	n = f21Round(t, lab, 7502, "f21fj", 59100, func(t *testing.T, x ns.NetNS, x4 net.IP, sport int, c net.Conn, _ *net.TCPAddr, snd, rcv uint32) {
		c.Write(f21Line)
		must(t, a21WrapThenOldFIN(x, x4, sport, 7502, snd+100, rcv))
	})
	if n > 8 {
		t.Errorf("pod f21fj holds %d live connections to one server, over its share of 8: the jumps round the sequence space with data in flight, then a FIN one below its end, counted", n)
	}
}

// f21ForgedAcks sends, from the outside host as the server (outsideIP:port
// to node), ACKs of the pod's data stepping from A (from) to to, each step
// under the bound (2^30), each with 16 sequence numbers none of which is
// the server's next (rcv): a blind attacker's, who knows the tuple but not
// the server's numbers.
func f21ForgedAcks(lab *masqLab, port int, node *net.TCPAddr, from, to, rcv uint32) error {
	for ack := from; ack != to; {
		step := to - ack
		if step > 1<<30-1 {
			step = 1<<30 - 1
		}
		ack += step
		for k := uint32(1); k <= 16; k++ {
			seq := rcv + k*65537 + 7
			if err := a15SendRaw4(lab.out, node.IP, a20TCP4(outsideIP, port, node.IP, node.Port, seq, ack, 0x10, nil)); err != nil {
				return err
			}
		}
	}
	return nil
}

// f21ForgedWrap: forged ACKs (f21ForgedAcks) carry A half round the
// sequence space from snd, where the pod's highest end would be taken
// behind A (the pod sends a raw old segment, its last 10 bytes again, for
// that), then on to one below snd: the pod's end, taken as A, would be one
// below its FIN at snd-1.
func f21ForgedWrap(t *testing.T, lab *masqLab, port int, x ns.NetNS, x4 net.IP, sport int, node *net.TCPAddr, snd, rcv uint32) {
	must(t, f21ForgedAcks(lab, port, node, snd, snd+1<<31, rcv))
	f20Raw(t, x, x4, sport, port, snd-10, rcv, 0x18, make([]byte, 10))
	must(t, f21ForgedAcks(lab, port, node, snd+1<<31, snd-1, rcv))
}

// TestFin21MasqForgedServerACKs: a blind attacker outside forges the
// server's ACKs (f21ForgedWrap) to carry A round to one below the pod's
// next sequence number, and the pod's highest end with it; the pod then
// sends a FIN one below its next (f21fa), or attack21's jumps and then that
// FIN (f21fb). Red before fin21 only through the jumps; f21fa is red with
// A moved by any ACK (the server's sequence number not checked).
func TestFin21MasqForgedServerACKs(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "63100-63163")
	n := f21Round(t, lab, 7503, "f21fa", 59200, func(t *testing.T, x ns.NetNS, x4 net.IP, sport int, _ net.Conn, node *net.TCPAddr, snd, rcv uint32) {
		f21ForgedWrap(t, lab, 7503, x, x4, sport, node, snd, rcv)
		f20Raw(t, x, x4, sport, 7503, snd-1, rcv, 0x11, nil)
	})
	if n > 8 {
		t.Errorf("pod f21fa holds %d live connections to one server, over its share of 8: blind forged server ACKs moved A", n)
	}
	n = f21Round(t, lab, 7504, "f21fb", 59300, func(t *testing.T, x ns.NetNS, x4 net.IP, sport int, _ net.Conn, node *net.TCPAddr, snd, rcv uint32) {
		f21ForgedWrap(t, lab, 7504, x, x4, sport, node, snd, rcv)
		must(t, a21WrapThenOldFIN(x, x4, sport, 7504, snd, rcv))
	})
	if n > 8 {
		t.Errorf("pod f21fb holds %d live connections to one server, over its share of 8: blind forged server ACKs and the jumps round the sequence space", n)
	}
}

// f21SinkServer serves on outsideIP:port: it reads a client's data to its
// FIN, answers with how many bytes it got, and closes. Each client's
// address (the node's, as the server sees it) goes to seen.
func f21SinkServer(t *testing.T, lab *masqLab, port int, seen chan<- *net.TCPAddr) {
	must(t, lab.out.Do(func(ns.NetNS) error {
		ln, err := net.Listen("tcp", hp(outsideIP, port))
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		acceptEach(ln, func(c net.Conn) {
			defer c.Close()
			seen <- c.RemoteAddr().(*net.TCPAddr)
			c.SetDeadline(time.Now().Add(60 * time.Second))
			n, _ := io.Copy(io.Discard, c)
			fmt.Fprintf(c, "%d\n", n)
		})
		return nil
	}))
}

// TestFin21MasqUploadAcrossWrap: a pod uploads 1.25 GiB on one connection
// (past the bound on its end, 2^30 beyond A: A must follow the server's
// acks) and 8 MiB on each of 7 others, at once, as fast as the link goes,
// from an ISN 1 MiB below 2^32 (its highest end and the server's acks
// cross the wrap), then closes
// each (its FIN after the data, the server's after it): the pod's FINs
// count, its share goes back to 0. Meanwhile a blind attacker outside
// forges server ACKs far ahead (A must not follow them, else the pod's end
// would be taken behind it and its FIN for an old one).
func TestFin21MasqUploadAcrossWrap(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "63200-63231")
	const port, isn, small, big = 7505, 1<<32 - 1<<20, 8 << 20, 1280 << 20
	seen := make(chan *net.TCPAddr, 8)
	f21SinkServer(t, lab, port, seen)
	srv := hp(outsideIP, port)
	w, _ := lab.a.RunPod("f21up")
	_, ifw := lab.a.HostVeth("f21up")
	type res struct {
		j   int
		err error
	}
	done := make(chan res, 8)
	for j := 0; j < 8; j++ {
		f, err := f20Dial(w, 59400+j, srv, isn)
		if err != nil {
			t.Fatalf("dial %d: %v", j, err)
		}
		t.Cleanup(func() { f.c.Close() })
		size := small
		if j == 0 {
			size = big
		}
		go func(j int, f *a14Flow) {
			f.c.SetDeadline(time.Now().Add(40 * time.Second))
			buf := make([]byte, 64<<10)
			for sent := 0; sent < size; sent += len(buf) {
				if _, err := f.c.Write(buf); err != nil {
					done <- res{j, err}
					return
				}
			}
			f.c.(*net.TCPConn).CloseWrite()
			line, err := f.r.ReadString('\n')
			if err == nil && strings.TrimSpace(line) != fmt.Sprint(size) {
				err = fmt.Errorf("the server got %q, want %d bytes", line, size)
			}
			done <- res{j, err}
		}(j, f)
	}
	// The blind attacker: on each flow, ACKs 256 KiB to 768 MiB past the
	// pod's ISN, at sequence numbers that are not the server's.
	for j := 0; j < 8; j++ {
		node := <-seen
		for k := uint32(0); k < 32; k++ {
			i0 := uint32(isn)
			for _, a := range []uint32{i0 + 256<<10, i0 + 1<<28, i0 + 3<<28} {
				must(t, a15SendRaw4(lab.out, node.IP, a20TCP4(outsideIP, port, node.IP, node.Port, 0x5eed0000+k*99991, a+k, 0x10, nil)))
			}
		}
	}
	for j := 0; j < 8; j++ {
		r := <-done
		if r.err != nil {
			t.Errorf("connection %d: %v", r.j, r.err)
		}
	}
	var s int
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if s, _ = a16Share(t, lab.a, ifw, "tcp", srv); s == 0 {
			break
		}
	}
	if s != 0 {
		t.Errorf("the pod closed its 8 uploads across the wrap by FINs after its data: share %d, want 0", s)
	}
}
