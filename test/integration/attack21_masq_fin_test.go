// attack21: hostile review of "a FIN counts only when its end is past the
// pod's highest end" (docs/masquerade.md, "No pod starves the others"): the
// highest end is the pod's own claim, moved by its data segments, so a pod
// may move it where it likes: far ahead (data it never sent), or all the
// way round the sequence space, back to just below its next sequence number,
// where a FIN the server takes for an old retransmission is "past" it again.

package integration

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a21Cheat sends, on pod x's live connection from x4:sport whose next
// sequence numbers are snd (x's) and rcv (the server's), the raw segments of
// one attack.
type a21Cheat func(x ns.NetNS, x4 net.IP, sport, dport int, snd, rcv uint32) error

// a21WrapThenOldFIN moves x's highest end round the sequence space in five
// data segments (each 858993459 past the last, well under any window bound;
// five make 2^32-1), so that it ends one below snd, then sends a FIN one
// below snd: the server drops it as an old retransmission and acknowledges
// snd, exactly the FIN's end.
func a21WrapThenOldFIN(x ns.NetNS, x4 net.IP, sport, dport int, snd, rcv uint32) error {
	end := snd
	for i := 0; i < 5; i++ {
		end += 858993459
		if err := a15SendRaw4(x, outsideIP, a20TCP4(x4, sport, outsideIP, dport, end-10, rcv, 0x18, make([]byte, 10))); err != nil {
			return err
		}
	}
	return a15SendRaw4(x, outsideIP, a20TCP4(x4, sport, outsideIP, dport, snd-1, rcv, 0x11, nil))
}

// a21FarDataThenFIN sends data x never sent, ending 100000 past snd (past
// the server's window: dropped), then a FIN at that end.
func a21FarDataThenFIN(x ns.NetNS, x4 net.IP, sport, dport int, snd, rcv uint32) error {
	far := snd + 100000
	if err := a15SendRaw4(x, outsideIP, a20TCP4(x4, sport, outsideIP, dport, far-10, rcv, 0x18, make([]byte, 10))); err != nil {
		return err
	}
	return a15SendRaw4(x, outsideIP, a20TCP4(x4, sport, outsideIP, dport, far, rcv, 0x11, nil))
}

// a21FINThenRST sends a FIN one below snd (an old retransmission to the
// server) and then an RST out of the server's window (ignored by it).
func a21FINThenRST(x ns.NetNS, x4 net.IP, sport, dport int, snd, rcv uint32) error {
	if err := a15SendRaw4(x, outsideIP, a20TCP4(x4, sport, outsideIP, dport, snd-1, rcv, 0x11, nil)); err != nil {
		return err
	}
	return a15SendRaw4(x, outsideIP, a20TCP4(x4, sport, outsideIP, dport, snd+1<<30, 0, 0x04, nil))
}

// a21Case is one cheating pod: its name, the cheat, what the failure says.
type a21Case struct {
	id, how string
	cheat   a21Cheat
}

// a21ShareRun: limit 8 on portRange, the server of
// TestAttack20MasqShareFINBelowNext (answers, half-closes, reads on), port
// srvPort. A control pod and then each case's pod open 8 connections, read
// each answer and the server's FIN, cheat on each from a raw socket, open 8
// more and send a line on all 16: more than 8 delivered means a FIN the
// server never took released the pod's share.
func a21ShareRun(t *testing.T, portRange string, srvPort int, cases []a21Case) {
	lab := newMasqLab(t)
	lab.a.Extra["ipMasqPortRange"] = portRange
	lab.a.Extra["ipMasqPodPortLimit"] = 8
	got, mu := a20HalfCloseServer(t, lab, srvPort)
	srv := hp(outsideIP, srvPort)
	run := func(id string, base int, cheat a21Cheat) int {
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
					snd, rcv := a20Seqs(t, f.c)
					if cheat != nil {
						must(t, cheat(x, x4, base+j, srvPort, snd, rcv))
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
		t.Logf("%s: share after the first 8: %d; at the end %d of %d connections delivered, share %d, recycled %d", id, s0, n, len(conns), s, c["recycled"])
		return n
	}
	if n := run(cases[0].id+"y", 50000, nil); n > 8 {
		t.Errorf("control: pod y, no cheat, has %d live flows to one server, over its share of 8", n)
	}
	for i, c := range cases {
		if n := run(c.id, 51000+1000*i, c.cheat); n > 8 {
			t.Errorf("pod %s holds %d live masqueraded connections to one server, over its share of 8: %s", c.id, n, c.how)
		}
	}
}

// TestAttack21MasqShareFINAfterWrappedEnd: the pod moves its highest end
// round the sequence space to one below its next sequence number (five data
// segments it never sent), then sends the FIN one below its next of
// TestAttack20MasqShareFINBelowNext: ignored by the server, acknowledged by
// a duplicate ACK of exactly its end.
func TestAttack21MasqShareFINAfterWrappedEnd(t *testing.T) {
	t.Parallel()
	a21ShareRun(t, "62500-62563", 7492, []a21Case{
		{"a21fw", "its highest end moved round the sequence space to one below its next, then a FIN one below its next", a21WrapThenOldFIN},
	})
}

// TestAttack21MasqShareFINPastUnsentData: data the pod never sent, far past
// the server's window, then a FIN at that end; and a FIN one below its next
// followed by an RST the server ignores.
func TestAttack21MasqShareFINPastUnsentData(t *testing.T) {
	t.Parallel()
	a21ShareRun(t, "62600-62695", 7493, []a21Case{
		{"a21ff", "data it never sent, far past the server's window, then a FIN at that end", a21FarDataThenFIN},
		{"a21fr", "a FIN one below its next, then an RST the server ignores", a21FINThenRST},
	})
}
