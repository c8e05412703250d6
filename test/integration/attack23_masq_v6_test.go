// attack23, IPv6: the FIN rules of the pod's share (docs/masquerade.md, "No
// pod starves the others") were attacked over IPv4 only (attack16, 20, 21);
// the same cheats on the pods' IPv6 connections.

package integration

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// a23HalfCloseServer is halfCloseServer on ip (either family): it answers
// a client's first line with "<client> <line>", half-closes delay later and
// reads on, recording in got the clients whose "again" lines arrive.
func a23HalfCloseServer(t *testing.T, lab *masqLab, ip net.IP, port int, delay time.Duration) (map[string]bool, *sync.Mutex) {
	var mu sync.Mutex
	got := map[string]bool{}
	must(t, lab.out.Do(func(ns.NetNS) error {
		ln, err := net.Listen("tcp", hp(ip, port))
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
				if strings.Contains(line, "again") {
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

// TestAttack23MasqShareIPv6FINs: over IPv6, pod by pod: the FIN one below
// the pod's next (attack20's FINBelowNext: the server's duplicate ACK names
// its end), the same carrying an old byte (FINOldByte), data never sent far
// past the window then a FIN at its end (attack21's FINPastUnsentData), a
// FIN one past the next then real data over it (FINAheadOfData), a FIN at
// the next acknowledging unsent data (FINUnsentAck).
func TestAttack23MasqShareIPv6FINs(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "64200-64295")
	cases := []struct {
		id, how string
		cheat   a23Cheat
	}{
		{"a23v6b", "a FIN one below its next", func(t *testing.T, a *a23Conn) {
			a.podSeg(t, a.snd-1, a.rcv, 0x11, nil)
		}},
		{"a23v6o", "a FIN carrying an old byte, ending at its next", func(t *testing.T, a *a23Conn) {
			a.podSeg(t, a.snd-2, a.rcv, 0x19, []byte("o"))
		}},
		{"a23v6f", "data never sent far past the window, then a FIN at its end", func(t *testing.T, a *a23Conn) {
			far := a.snd + 100000
			a.podSeg(t, far-10, a.rcv, 0x18, make([]byte, 10))
			a.podSeg(t, far, a.rcv, 0x11, nil)
		}},
		{"a23v6a", "a FIN one past its next, then real data over it", func(t *testing.T, a *a23Conn) {
			a.podSeg(t, a.snd+1, a.rcv, 0x11, nil)
			a.c.Write([]byte("z\n"))
		}},
		{"a23v6u", "a FIN at its next acknowledging data the server never sent", func(t *testing.T, a *a23Conn) {
			a.podSeg(t, a.snd, a.rcv+100000, 0x11, nil)
		}},
	}
	if n := a23RoundAt(t, lab, outsideIP6, 7570, 0, "a23v6y", 48000, 0, false, nil); n > 8 {
		t.Errorf("control: pod y, no cheat, has %d live IPv6 flows to one server, over its share of 8", n)
	}
	for i, c := range cases {
		if n := a23RoundAt(t, lab, outsideIP6, 7571+i, 0, c.id, 48100+100*i, 8, false, c.cheat); n > 8 {
			t.Errorf("attack23: RED pod %s holds %d live IPv6 connections to one server, over its share of 8: %s counted as its close", c.id, n, c.how)
		}
	}
}
