// Attack (round 12 hostile review, attack15) on "a flow the server closed
// first holds its node port for 60 s" (docs/masquerade.md) when the node
// does not see the server's FIN first: the server's FIN is lost on the way
// (the network drops a segment), the pod's FIN passes the node first, and
// the server still ends in TIME_WAIT (its FIN went first; it retransmits).

package integration

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// a15ServeSeen listens on [::]:port in netns; each connection is told the
// address it came from, then closed by the server (first).
func a15ServeSeen(t *testing.T, netns ns.NetNS, port int) {
	t.Helper()
	var ln net.Listener
	must(t, netns.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp6", fmt.Sprintf("[::]:%d", port))
		return err
	}))
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(c.RemoteAddr().String() + "\n"))
			c.Close()
		}
	}()
}

// How a15DialSeen closes: with its FIN at once; with an RST (SO_LINGER 0)
// after the server's FIN; with its FIN after the server's (the server
// closes first whatever the scheduler does: its goroutine may run its
// Close after the pod's FIN went, as CI saw in the control rounds).
const (
	a15CloseNow = iota
	a15CloseRST
	a15CloseAfterFIN
)

// a15DialSeen connects from netns's src:lport (src nil: any; SO_REUSEADDR)
// to addr, reads the server's line (a15ServeSeen) and closes as how says;
// it returns the line and how long connect took.
func a15DialSeen(netns ns.NetNS, src net.IP, lport int, addr string, how int) (seen string, took time.Duration, err error) {
	err = netns.Do(func(ns.NetNS) error {
		d := reuseDialer(src, lport)
		d.Timeout = 5 * time.Second
		start := time.Now()
		c, err := d.Dial("tcp6", addr)
		took = time.Since(start)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		r := bufio.NewReader(c)
		seen, err = r.ReadString('\n')
		seen = strings.TrimSpace(seen)
		if how != a15CloseNow {
			r.ReadByte() // the server's FIN
		}
		if how == a15CloseRST {
			c.(*net.TCPConn).SetLinger(0)
		}
		return err
	})
	return
}

// TestAttack15MasqLostServerFIN: pods p and q of one node connect from the
// same source port (in the masquerade range, so both first try that node
// port) to one server, which answers and closes first. The outside drops the
// server's first FIN of each connection of p's (nft in the outside netns;
// its retransmit passes 200 ms later): p's FIN reaches the node first, the
// server goes FIN_WAIT_1 -> CLOSING -> TIME_WAIT on the node's tuple. A
// second later q connects from the same port (the pods take turns as p and q). q must not be given p's node
// port while the server holds TIME_WAIT on it (PAWS refuses q's SYN in one of
// the two orders: the server's TcpExt PAWSTimewait+PAWSEstab counts it; Linux's client
// answers the server's ACK with an RST that ends the TIME_WAIT and sends
// its SYN again within milliseconds, other stacks a second later), or, if
// it is, its SYN must not be refused: 8 rounds, each on its own port.
// Before fin15, q took p's node port in 8 of 8 rounds, refused by PAWS in
// 3: the datapath took p's FIN, seen first, for p closing first. Now the
// server's ACK of p's FIN, one past the last sequence number the node saw
// of it, tells that its FIN went first (masq.h snat_seq_peer_fin).
func TestAttack15MasqLostServerFIN(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	p, q := a.NewPod(), a.NewPod()
	a.CleanupDel(p, "a15fp")
	a.CleanupDel(q, "a15fq")
	_, p6 := resultIPs(a.Add(p, "a15fp"))
	_, q6 := resultIPs(a.Add(q, "a15fq"))
	const port = 7440
	a15ServeSeen(t, lab.out, port)
	// The first FIN the server sends to a node port is dropped (p's
	// connections are the first on each port); a retransmit within 2 s
	// passes. Dropped on the wire, as a network loses it: by the outside's
	// bridge (its output hook, after the server's TCP sent the FIN). In
	// the inet output hook (attack15's first version) the drop is a send
	// failure the server's TCP sees: the FIN stays unsent in its queue
	// (snd_nxt not past it), its ACK of the pod's FIN carries the FIN's
	// sequence number and the FIN follows at once, on the wire the same as
	// a server closing right after the pod's FIN (CLOSE_WAIT, LAST_ACK, no
	// TIME_WAIT): no datapath can tell them apart (docs/masquerade.md).
	rules := fmt.Sprintf(`table bridge a15fin {
  set seen { type ipv6_addr . inet_service; flags dynamic, timeout; timeout 2s; }
  chain out { type filter hook output priority 0; policy accept;
    tcp sport %d tcp dport 62100-62199 tcp flags & fin == fin ip6 daddr . tcp dport @seen accept
    tcp sport %d tcp dport 62100-62199 tcp flags & fin == fin add @seen { ip6 daddr . tcp dport } counter drop
  }
}`, port, port)
	must(t, lab.out.Do(func(ns.NetNS) error {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft: %v: %s", err, out)
		}
		return nil
	}))
	addr := hp(outsideIP6, port)
	// The control: no FIN lost (ports 62200 on), the server's FIN passes the
	// node first and q must get another node port, never refused.
	cs, csame := a15LostFinRounds(t, lab, p, q, p6, q6, 62200, 4, addr, a15CloseAfterFIN)
	if cs > 0 || csame > 0 {
		t.Errorf("control, no FIN lost: q took p's node port in %d of 4 rounds, refused by PAWS in %d", csame, cs)
	}
	slow, same := a15LostFinRounds(t, lab, p, q, p6, q6, 62100, 8, addr, a15CloseNow)
	var counters string
	lab.out.Do(func(ns.NetNS) error {
		b, _ := exec.Command("nft", "list", "table", "bridge", "a15fin").CombinedOutput()
		counters = string(b)
		b, _ = exec.Command("ss", "-tanoe", "sport", "=", fmt.Sprint(port)).CombinedOutput()
		counters += "\n" + string(b)
		b, _ = exec.Command("sysctl", "net.ipv4.tcp_timestamps").CombinedOutput()
		counters += string(b)
		return nil
	})
	t.Logf("outside's FIN drops:\n%s", counters)
	t.Logf("q took p's node port in %d of 8 rounds, its SYN refused in %d", same, slow)
	if slow > 0 {
		t.Errorf("q's SYN was refused by PAWS (the server's TcpExt PAWSTimewait+PAWSEstab) in %d of 8 rounds: the server held TIME_WAIT on the node port the masquerade gave q (p's; it took p's FIN, seen first at the node, for p closing first)", slow)
	}
}

// a15TimeWait is the server's socket state (ss) towards peer on port.
func a15TimeWait(netns ns.NetNS, port int, peer string) string {
	var st string
	netns.Do(func(ns.NetNS) error {
		b, _ := exec.Command("ss", "-Htan", "state", "all", "sport", "=", fmt.Sprint(port)).CombinedOutput()
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, peer) {
				st = strings.Fields(l)[0]
			}
		}
		return nil
	})
	return st
}

// a15LostFinRounds runs n rounds from ports base on (see
// TestAttack15MasqLostServerFIN) and returns in how many q's SYN was refused
// by PAWS and in how many q got p's node port.
func a15LostFinRounds(t *testing.T, lab *masqLab, p, q ns.NetNS, p6, q6 net.IP, base, n int, addr string, pClose int) (slow, same int) {
	t.Helper()
	const port = 7440
	for i := 0; i < n; i++ {
		lport := base + i
		// The pods take turns first: the kernel's timestamp offset is per
		// address pair, so whichever pod's clock is behind the other's
		// is refused in one of the two orders.
		p, q, p6 := p, q, p6
		if i%2 == 1 {
			p, q, p6 = q, p, q6
		}
		ps, ptook, err := a15DialSeen(p, nil, lport, addr, pClose)
		if err != nil {
			t.Fatalf("round %d: p's connection from %d: %v", i, lport, err)
		}
		if strings.Contains(ps, p6.String()) {
			t.Fatalf("round %d: the server saw p as %s: not masqueraded", i, ps)
		}
		time.Sleep(1200 * time.Millisecond) // the FIN's retransmit, then past half a second quiet
		tw := a15TimeWait(lab.out, port, ps)
		paws0 := a15Paws(t, lab.out)
		qs, qtook, err := a15DialSeen(q, nil, lport, addr, a15CloseNow)
		if err != nil {
			t.Errorf("round %d: q's connection from %d: %v", i, lport, err)
			continue
		}
		paws := a15Paws(t, lab.out) - paws0
		t.Logf("round %d: p from %d seen as %s (connect %v; server's state then %q), q seen as %s (connect %v, server's PAWS refusals %d)", i, lport, ps, ptook.Round(time.Millisecond), tw, qs, qtook.Round(time.Millisecond), paws)
		if qs == ps {
			same++
		}
		if paws > 0 || qtook > 900*time.Millisecond {
			slow++
		}
	}
	return slow, same
}

// TestAttack15MasqReopenAndRST: (1) a pod reopens the same tuple (same
// source port, same server) 50 ms after the server closed it first, 6
// times, with UDP from the same port to the same server port between: each
// TCP reopening must get the same node port (its SYN finds the forward
// entry, the server's TIME_WAIT takes it: same tuple, later timestamps) and
// no SYN may be refused by PAWS; the UDP echo must come back. (2) pods take
// turns: one answers the server's FIN with an RST (SO_LINGER 0), the other
// connects from the same port 600 ms later: no PAWS refusal either way.
func TestAttack15MasqReopenAndRST(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	p, q := a.NewPod(), a.NewPod()
	a.CleanupDel(p, "a15op")
	a.CleanupDel(q, "a15oq")
	a.Add(p, "a15op")
	a.Add(q, "a15oq")
	const port = 7450
	a15ServeSeen(t, lab.out, port)
	serveUDP6EchoOpts(t, lab.out, port, func(int) error { return nil })
	addr := hp(outsideIP6, port)
	paws0 := a15Paws(t, lab.out)
	var first string
	for i := 0; i < 6; i++ {
		seen, took, err := a15DialSeen(p, nil, 62300, addr, a15CloseNow)
		if err != nil {
			t.Fatalf("reopen %d: %v", i, err)
		}
		if i == 0 {
			first = seen
		} else if seen != first {
			t.Errorf("reopen %d of the same tuple: the server saw %s, first %s: another node port", i, seen, first)
		}
		if took > 500*time.Millisecond {
			t.Errorf("reopen %d: connect took %v", i, took)
		}
		err = p.Do(func(ns.NetNS) error {
			d := net.Dialer{LocalAddr: &net.UDPAddr{Port: 62300}}
			c, err := d.Dial("udp6", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			buf := make([]byte, 64)
			for try := 0; try < 3; try++ {
				c.Write([]byte("udp-beside"))
				c.SetReadDeadline(time.Now().Add(time.Second))
				if n, err := c.Read(buf); err == nil && string(buf[:n]) == "udp-beside" {
					return nil
				}
			}
			return fmt.Errorf("no echo")
		})
		if err != nil {
			t.Errorf("reopen %d: UDP from the same port to the same server port: %v", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if d := a15Paws(t, lab.out) - paws0; d > 0 {
		t.Errorf("the same tuple reopened within the server's TIME_WAIT: %d SYNs refused by PAWS", d)
	}
	paws1 := a15Paws(t, lab.out)
	for i := 0; i < 6; i++ {
		x, y := p, q
		if i%2 == 1 {
			x, y = q, p
		}
		lport := 62310 + i
		xs, _, err := a15DialSeen(x, nil, lport, addr, a15CloseRST)
		if err != nil {
			t.Fatalf("RST round %d: %v", i, err)
		}
		time.Sleep(600 * time.Millisecond)
		ys, _, err := a15DialSeen(y, nil, lport, addr, a15CloseNow)
		if err != nil {
			t.Errorf("RST round %d: the other pod from %d: %v", i, lport, err)
		}
		t.Logf("RST round %d: first pod seen as %s, the other as %s", i, xs, ys)
	}
	if d := a15Paws(t, lab.out) - paws1; d > 0 {
		t.Errorf("after a pod's RST answering the server's FIN, another pod from the same port: %d SYNs refused by PAWS", d)
	}
}

// a15Paws is what netns's TCP refused by PAWS: SYNs on a TIME_WAIT
// (PAWSTimewait) and segments of established connections (PAWSEstab).
func a15Paws(t *testing.T, netns ns.NetNS) int64 {
	t.Helper()
	return int64(tcpExt(t, netns, "PAWSTimewait") + tcpExt(t, netns, "PAWSEstab"))
}
