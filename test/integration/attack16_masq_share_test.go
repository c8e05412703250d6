// Attack (round 13 hostile review, attack16) on "the share of a pod's ports
// towards one destination is released only when a FIN went each way; a
// pod's own RST no longer releases it" (docs/masquerade.md, "No pod starves
// the others"; ipMasqPodPortLimit).

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a16Server runs, in the outside netns on outsideIP:port (TCP), a server
// that answers each line with "<peer> <line>"; on "bye" it closes first
// (FIN), on "rst" it resets (SO_LINGER 0), after "rsteof" it resets when
// the client's FIN comes; lines starting with '#' get no answer. The
// connections it holds are counted in live.
func a16Server(t *testing.T, out ns.NetNS, ip net.IP, port int) *sync.Map {
	t.Helper()
	live := &sync.Map{}
	must(t, out.Do(func(ns.NetNS) error {
		ln, err := net.Listen("tcp", hp(ip, port))
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		acceptEach(ln, func(c net.Conn) {
			live.Store(c.RemoteAddr().String(), true)
			defer live.Delete(c.RemoteAddr().String())
			c.SetDeadline(time.Now().Add(50 * time.Second))
			r := bufio.NewReader(c)
			rstEOF := false
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					if rstEOF {
						c.(*net.TCPConn).SetLinger(0)
					}
					return
				}
				if strings.HasPrefix(line, "#") {
					continue // a quiet upload: no answer
				}
				switch strings.TrimSpace(line) {
				case "rsteof":
					rstEOF = true
					continue
				case "bye":
					return
				case "rst":
					c.(*net.TCPConn).SetLinger(0)
					return
				}
				fmt.Fprintf(c, "%s %s", c.RemoteAddr(), line)
			}
		})
		return nil
	}))
	return live
}

// a16ServedPod starts a16Server on outsideIP:port and runs pod id; it
// returns the pod, its host veth's ifindex and the server's address.
func a16ServedPod(t *testing.T, lab *masqLab, port int, id string) (ns.NetNS, int, string) {
	t.Helper()
	a16Server(t, lab.out, outsideIP, port)
	x, _ := lab.a.RunPod(id)
	_, ifx := lab.a.HostVeth(id)
	return x, ifx, hp(outsideIP, port)
}

// a16Share is the share column of dump nat for the pod on host interface
// ifindex towards dest (protocol proto), and the counters.
func a16Share(t *testing.T, e *testenv.Env, ifindex int, proto, dest string) (int, map[string]uint64) {
	t.Helper()
	js, err := e.MasqAgent("dump", "nat", "-o", "json")
	if err != nil {
		t.Errorf("dump nat: %v", err)
		return -1, nil
	}
	var d inspect.NATDump
	if err := json.Unmarshal(js, &d); err != nil {
		t.Errorf("dump nat: %v", err)
		return -1, nil
	}
	n := 0
	for _, s := range d.Shares {
		if s.Ifindex == ifindex && s.Protocol == proto && s.Destination == dest {
			n += s.Ports
		}
	}
	return n, d.Counters
}

// a16Open dials n connections from pod (local ports base on) and asks once
// on each; it returns the flows (nil where the dial failed) and logs dials
// that took more than 900 ms (a SYN lost and retransmitted).
func a16Open(t *testing.T, pod ns.NetNS, srv string, ports []int) []*a14Flow {
	t.Helper()
	var flows []*a14Flow
	for _, p := range ports {
		t0 := time.Now()
		f, err := a14Dial(pod, "tcp", p, srv)
		if err != nil {
			t.Logf("dial from port %d: %v", p, err)
			flows = append(flows, nil)
			continue
		}
		if d := time.Since(t0); d > 900*time.Millisecond {
			t.Logf("dial from port %d took %v (a SYN lost)", p, d)
		}
		t.Cleanup(func() { f.c.Close() })
		flows = append(flows, f)
	}
	return flows
}

// a16Alive asks on every flow (at once) and returns the node ports (as the
// server saw them) that answered.
func a16Alive(flows []*a14Flow, tag string) map[string]bool {
	alive := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for j, f := range flows {
		if f == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := fmt.Sprint(tag, j)
			if p, e, err := f.ask(msg); err == nil && e == msg {
				mu.Lock()
				alive[p] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return alive
}

func a16Ports(base, n int) []int {
	var ps []int
	for j := 0; j < n; j++ {
		ps = append(ps, base+j)
	}
	return ps
}

// a16Close ends each flow: "bye" (the server's FIN first, the pod's after
// it: a FIN each way) or "rst" (the server resets).
func a16Close(t *testing.T, flows []*a14Flow, how string) {
	t.Helper()
	for _, f := range flows {
		if f == nil {
			continue
		}
		f.c.SetDeadline(time.Now().Add(3 * time.Second))
		f.c.Write([]byte(how + "\n"))
		io.Copy(io.Discard, f.r)
		f.c.Close()
	}
}

// TestAttack16MasqShareReopenAfterFIN: ipMasqPodPortLimit 8 on a 32-port
// range. Pod x opens 8 TCP connections to one server, the server closes
// each first and x closes after it (a FIN each way: their share released,
// as documented). x then opens its 8 tuples again (a SYN reopening a tuple
// closed by FIN: "counts it again") and 8 connections from new ports. A
// pod must never hold more than 8 live ports towards one server; dump nat's
// share must say what is open.
func TestAttack16MasqShareReopenAfterFIN(t *testing.T) {
	t.Parallel()
	lab := newShareLab(t, "62400-62431")
	x, ifx, srv := a16ServedPod(t, lab, 7481, "a16fx")
	first := a16Open(t, x, srv, a16Ports(41000, 8))
	if n := len(a16Alive(first, "a")); n != 8 {
		t.Fatalf("control: %d of 8 first connections answered", n)
	}
	if s, _ := a16Share(t, lab.a, ifx, "tcp", srv); s != 8 {
		t.Errorf("8 connections open: dump nat's share is %d, want 8", s)
	}
	a16Close(t, first, "bye")
	time.Sleep(700 * time.Millisecond)
	if s, _ := a16Share(t, lab.a, ifx, "tcp", srv); s != 0 {
		t.Errorf("8 connections closed by a FIN each way: share %d, want 0", s)
	}
	again := a16Open(t, x, srv, a16Ports(41000, 8))
	more := a16Open(t, x, srv, a16Ports(41100, 8))
	alive := a16Alive(append(again, more...), "b")
	s, c := a16Share(t, lab.a, ifx, "tcp", srv)
	t.Logf("after reopening 8 tuples closed by FIN and opening 8 more: %d live on distinct node ports, share %d, recycled %d, drop_pod_limit %d", len(alive), s, c["recycled"], c["drop_pod_limit"])
	if len(alive) > 8 {
		t.Errorf("pod x holds %d live masqueraded connections to one server, over its share of 8: the tuples reopened after a FIN each way were not counted again", len(alive))
	}
	if s != len(alive) {
		t.Errorf("dump nat's share %d, but %d connections are open", s, len(alive))
	}
}

// TestAttack16MasqShareRSTReopen: limit 8. Pod x opens 8 connections, resets
// 4 of them itself (SO_LINGER 0: a genuine RST, the server drops them too)
// and at once reopens the same 4 tuples. The share counts an RST-closed
// flow "until its entry goes", and a SYN reopening a tuple "counts it
// again": counted twice, the pod would be at 12 with 8 open, and its next
// flows refused or recycled off its live ones. All 8 must answer, the
// share must say 8; a 9th takes back one of its own (documented) and the
// share still says what is open.
func TestAttack16MasqShareRSTReopen(t *testing.T) {
	t.Parallel()
	lab := newShareLab(t, "62500-62531")
	x, ifx, srv := a16ServedPod(t, lab, 7482, "a16rx")
	flows := a16Open(t, x, srv, a16Ports(42000, 8))
	if n := len(a16Alive(flows, "a")); n != 8 {
		t.Fatalf("control: %d of 8 connections answered", n)
	}
	for _, f := range flows[:4] {
		f.c.(*net.TCPConn).SetLinger(0)
		f.c.Close()
	}
	time.Sleep(100 * time.Millisecond)
	copy(flows, a16Open(t, x, srv, a16Ports(42000, 4)))
	alive := a16Alive(flows, "b")
	s, c := a16Share(t, lab.a, ifx, "tcp", srv)
	t.Logf("4 reset by the pod and reopened: %d of 8 answer, share %d, counters recycled %d drop_pod_limit %d", len(alive), s, c["recycled"], c["drop_pod_limit"])
	if len(alive) != 8 {
		t.Errorf("%d of 8 connections answer after 4 were reset and reopened on their tuples, want 8", len(alive))
	}
	if s != 8 {
		t.Errorf("dump nat's share %d with 8 connections open (4 reopened after the pod's RST), want 8", s)
	}
	// At the limit a 9th flow takes back the quietest of x's own ports
	// (documented): one of the 8 may go, but never more than 8 live, and
	// the share says what is open.
	all := append(flows, a16Open(t, x, srv, []int{42100})...)
	after := a16Alive(all, "c")
	s, c = a16Share(t, lab.a, ifx, "tcp", srv)
	t.Logf("after a 9th connection: %d of 9 answer, share %d, recycled %d, drop_pod_limit %d", len(after), s, c["recycled"], c["drop_pod_limit"])
	if len(after) > 8 || len(after) < 7 {
		t.Errorf("a 9th connection at the share limit: %d of 9 answer, want 8 (one of its own taken back) or 7", len(after))
	}
	if s != len(after) {
		t.Errorf("dump nat's share %d, but %d connections answer", s, len(after))
	}
}

// TestAttack16MasqShareServerRSTChurn: limit 8. Pod x, 5 rounds: opens 8
// connections to one server, the server resets each (a genuine RST from
// outside), and x at once opens the next 8 from new ports. Its flows closed
// by the server's RST count until their entries go, so each round x is at
// its limit and must take back its own ports: every dial must connect
// without a lost SYN. Pod y holds 8 connections to the same server
// throughout: none may be taken, and y's share must stay 8.
func TestAttack16MasqShareServerRSTChurn(t *testing.T) {
	t.Parallel()
	a16Churn(t, "62600-62631", 7483, "a16c", 43000, func(flows []*a14Flow) { a16Close(t, flows, "rst") })
}

// TestAttack16MasqSharePodRSTChurn: TestAttack16MasqShareServerRSTChurn with
// x resetting its own connections (SO_LINGER 0): a pod's own RST keeps the
// flow counted until its entry goes, so x is at its limit each round.
func TestAttack16MasqSharePodRSTChurn(t *testing.T) {
	t.Parallel()
	a16Churn(t, "62000-62031", 7488, "a16p", 51000, func(flows []*a14Flow) {
		for _, f := range flows {
			if f != nil {
				f.c.(*net.TCPConn).SetLinger(0)
				f.c.Close()
			}
		}
	})
}

func a16Churn(t *testing.T, ports string, sport int, id string, base int, closeAll func([]*a14Flow)) {
	lab := newShareLab(t, ports)
	a16Server(t, lab.out, outsideIP, sport)
	srv := hp(outsideIP, sport)
	y, _ := lab.a.RunPod(id + "y")
	_, ify := lab.a.HostVeth(id + "y")
	yflows := a16Open(t, y, srv, a16Ports(base+500, 8))
	yports := a16Alive(yflows, "y")
	if len(yports) != 8 {
		t.Fatalf("control: %d of y's 8 connections answered", len(yports))
	}
	x, _ := lab.a.RunPod(id + "x")
	_, ifx := lab.a.HostVeth(id + "x")
	failed := 0
	for round := 0; round < 5; round++ {
		flows := a16Open(t, x, srv, a16Ports(base+round*10, 8))
		got := a16Alive(flows, fmt.Sprint("r", round, "-"))
		for p := range got {
			if yports[p] {
				t.Errorf("round %d: x's flow answered on node port %s, y's", round, p)
			}
		}
		failed += 8 - len(got)
		closeAll(flows)
	}
	s, c := a16Share(t, lab.a, ifx, "tcp", srv)
	sy, _ := a16Share(t, lab.a, ify, "tcp", srv)
	yafter := a16Alive(yflows, "y2")
	t.Logf("5 rounds of 8 reset: %d failed, share x %d, y %d, y answers %d of 8, recycled %d, drop_pod_limit %d", failed, s, sy, len(yafter), c["recycled"], c["drop_pod_limit"])
	if failed > 0 {
		t.Errorf("pod x at its limit, its flows reset: %d of 40 connections failed (locked up instead of taking back its own ports)", failed)
	}
	if s > 8 {
		t.Errorf("x's share %d, over its limit 8", s)
	}
	if len(yafter) != 8 || sy != 8 {
		t.Errorf("pod y: %d of its 8 connections answer, share %d: x's churn took y's", len(yafter), sy)
	}
}

// TestAttack16MasqHalfClosedKept: a TCP flow closed one way only keeps its
// translation ("half-closed ones keep theirs") past the 10 s a closed flow
// lives. Pod x half-closes (its FIN) one connection, the server half-closes
// another (its FIN); both stay quiet 12 s, then the open direction carries
// data: the server's to x, x's to the server. Both must arrive, and x's
// share must count both all along.
func TestAttack16MasqHalfClosedKept(t *testing.T) {
	t.Parallel()
	lab := newShareLab(t, "62700-62731")
	got := make(chan string, 4)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	var srvConns sync.Map
	must(t, lab.out.Do(func(ns.NetNS) error {
		ln, err := net.Listen("tcp", hp(outsideIP, 7484))
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		acceptEach(ln, func(c net.Conn) {
			c.SetDeadline(time.Now().Add(40 * time.Second))
			r := bufio.NewReader(c)
			hello, err := r.ReadString('\n')
			if err != nil {
				return
			}
			srvConns.Store(strings.TrimSpace(hello), c)
			if strings.TrimSpace(hello) == "serverfin" {
				c.(*net.TCPConn).CloseWrite()
			}
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					<-done // the pod's FIN: keep our half open
					return
				}
				got <- strings.TrimSpace(line)
			}
		})
		return nil
	}))
	srv := hp(outsideIP, 7484)
	x, _ := lab.a.RunPod("a16hx")
	_, ifx := lab.a.HostVeth("a16hx")
	fs := a16Open(t, x, srv, []int{44000, 44001})
	if fs[0] == nil || fs[1] == nil {
		t.Fatal("control: dial failed")
	}
	fs[0].c.Write([]byte("podfin\n"))
	fs[1].c.Write([]byte("serverfin\n"))
	time.Sleep(300 * time.Millisecond)
	fs[0].c.(*net.TCPConn).CloseWrite()
	time.Sleep(300 * time.Millisecond)
	if s, _ := a16Share(t, lab.a, ifx, "tcp", srv); s != 2 {
		t.Errorf("two half-closed connections: share %d, want 2", s)
	}
	time.Sleep(12 * time.Second)
	if s, _ := a16Share(t, lab.a, ifx, "tcp", srv); s != 2 {
		t.Errorf("two half-closed connections 12 s quiet: share %d, want 2", s)
	}
	if c, ok := srvConns.Load("podfin"); ok {
		c.(net.Conn).Write([]byte("to the pod\n"))
	}
	fs[0].c.SetDeadline(time.Now().Add(4 * time.Second))
	if line, err := fs[0].r.ReadString('\n'); err != nil || line != "to the pod\n" {
		t.Errorf("the pod half-closed, 12 s quiet: the server's data did not reach it: %q, %v", line, err)
	}
	fs[1].c.SetDeadline(time.Now().Add(4 * time.Second))
	fs[1].c.Write([]byte("to the server\n"))
	select {
	case line := <-got:
		if line != "to the server" {
			t.Errorf("server got %q", line)
		}
	case <-time.After(4 * time.Second):
		t.Errorf("the server half-closed, 12 s quiet: the pod's data did not reach it")
	}
}

// TestAttack16MasqShareMixedCloses: limit 8. Pod x closes 8 connections to
// one server in four ways, two each: its own RST; the server's RST; its FIN
// then the server's RST; the server's FIN then its RST. Every one saw an
// RST, so each counts until its entry goes (10 s): 12 s later the share
// must be 0 (nothing held forever), and 8 new connections must then all
// connect without a lost SYN, while pod y's UDP flow to the same server
// address and port (another protocol, its own share) answers throughout.
func TestAttack16MasqShareMixedCloses(t *testing.T) {
	t.Parallel()
	lab := newShareLab(t, "62300-62331")
	udpPeerEcho(t, lab.out, outsideIP, 7485)
	x, ifx, srv := a16ServedPod(t, lab, 7485, "a16mx")
	y, _ := lab.a.RunPod("a16my")
	u, err := a14Dial(y, "udp", 46000, srv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.c.Close() })
	udpOK := func(tag string) {
		if _, e, err := u.ask(tag); err != nil || e != tag {
			t.Errorf("pod y's UDP flow to %s (%s): %q %v", srv, tag, e, err)
		}
	}
	udpOK("u0")
	fs := a16Open(t, x, srv, a16Ports(47000, 8))
	if n := len(a16Alive(fs, "a")); n != 8 {
		t.Fatalf("control: %d of 8 answered", n)
	}
	rst := func(f *a14Flow) { f.c.(*net.TCPConn).SetLinger(0); f.c.Close() }
	rst(fs[0])
	rst(fs[1])
	a16Close(t, fs[2:4], "rst")
	for _, f := range fs[4:6] { // x's FIN, the server's RST
		f.c.Write([]byte("rsteof\n"))
		f.c.(*net.TCPConn).CloseWrite()
		f.c.SetDeadline(time.Now().Add(3 * time.Second))
		io.Copy(io.Discard, f.r)
		f.c.Close()
	}
	for _, f := range fs[6:8] { // the server's FIN, x's RST
		f.c.Write([]byte("bye\n"))
		f.c.SetDeadline(time.Now().Add(3 * time.Second))
		io.Copy(io.Discard, f.r)
		rst(f)
	}
	time.Sleep(300 * time.Millisecond)
	s0, _ := a16Share(t, lab.a, ifx, "tcp", srv)
	_, ify := lab.a.HostVeth("a16my")
	su, _ := a16Share(t, lab.a, ify, "udp", srv)
	t.Logf("right after the closes: x's tcp share %d, y's udp share %d", s0, su)
	for i := 0; i < 6; i++ {
		time.Sleep(2 * time.Second)
		udpOK(fmt.Sprint("u", i+1))
	}
	s, c := a16Share(t, lab.a, ifx, "tcp", srv)
	t.Logf("12 s after: x's tcp share %d (recycled %d, drop_pod_limit %d)", s, c["recycled"], c["drop_pod_limit"])
	if s != 0 {
		t.Errorf("12 s after 8 connections each closed with an RST, x's share towards %s is still %d, want 0", srv, s)
	}
	t0 := time.Now()
	nf := a16Open(t, x, srv, a16Ports(47100, 8))
	if n := len(a16Alive(nf, "n")); n != 8 || time.Since(t0) > 8*time.Second {
		t.Errorf("8 new connections after: %d answer, %v", n, time.Since(t0))
	}
	udpOK("u9")
}

// a16TCP4 is an IPv4 TCP segment src:sport -> dst:dport with sequence seq
// and flags (no payload, no ack number).
func a16TCP4(src net.IP, sport int, dst net.IP, dport int, seq uint32, flags byte) []byte {
	p := a15RST4(src, sport, dst, dport, seq)
	tcp := p[20:]
	tcp[13] = flags
	tcp[16], tcp[17] = 0, 0
	ph := make([]byte, 12)
	copy(ph[0:], src.To4())
	copy(ph[4:], dst.To4())
	ph[9] = 6
	ph[11] = 20
	sum := csum16(append(ph, tcp...))
	tcp[16], tcp[17] = byte(sum>>8), byte(sum)
	return p
}

// TestAttack16MasqShareServerRSTReopen: limit 8. Pod x opens 8 connections;
// the server resets 4 (a genuine RST from outside: the flow counts until
// its entry goes) and x at once reopens those 4 tuples (a SYN reopening a
// tuple closed by RST counts it again). Counted twice, x would stand at 12
// with 8 open. The share must say 8 and all 8 answer; a 9th takes back one
// of x's own and the share still says what is open.
func TestAttack16MasqShareServerRSTReopen(t *testing.T) {
	t.Parallel()
	lab := newShareLab(t, "62100-62131")
	x, ifx, srv := a16ServedPod(t, lab, 7487, "a16sx")
	flows := a16Open(t, x, srv, a16Ports(50000, 8))
	if n := len(a16Alive(flows, "a")); n != 8 {
		t.Fatalf("control: %d of 8 connections answered", n)
	}
	a16Close(t, flows[:4], "rst")
	time.Sleep(100 * time.Millisecond)
	copy(flows, a16Open(t, x, srv, a16Ports(50000, 4)))
	alive := a16Alive(flows, "b")
	s, c := a16Share(t, lab.a, ifx, "tcp", srv)
	t.Logf("4 reset by the server and reopened: %d of 8 answer, share %d, recycled %d, drop_pod_limit %d", len(alive), s, c["recycled"], c["drop_pod_limit"])
	if len(alive) != 8 || s != 8 {
		t.Errorf("4 connections reset by the server and reopened on their tuples: %d of 8 answer, share %d; want 8 and 8", len(alive), s)
	}
	all := append(flows, a16Open(t, x, srv, []int{50100})...)
	after := a16Alive(all, "c")
	s, _ = a16Share(t, lab.a, ifx, "tcp", srv)
	t.Logf("after a 9th: %d of 9 answer, share %d", len(after), s)
	if len(after) > 8 || len(after) < 7 || s != len(after) {
		t.Errorf("a 9th connection at the limit: %d of 9 answer, share %d; want 8 (or 7) and the share equal", len(after), s)
	}
}

// TestAttack16MasqShareUDPBesideTCP: limit 8. Pod x holds 8 TCP connections
// to the server's address and port, then opens 8 UDP flows to the same
// address and port (the share is per protocol): all 16 must answer, on
// distinct node ports, the shares 8 and 8; then 8 more UDP flows take back
// x's own UDP ports, never its TCP ones: the 8 TCP connections still answer.
func TestAttack16MasqShareUDPBesideTCP(t *testing.T) {
	t.Parallel()
	lab := newShareLab(t, "61900-61931")
	udpPeerEcho(t, lab.out, outsideIP, 7489)
	x, ifx, srv := a16ServedPod(t, lab, 7489, "a16ux")
	tcp := a16Open(t, x, srv, a16Ports(52000, 8))
	var udp []*a14Flow
	for _, p := range a16Ports(52000, 8) {
		f, err := a14Dial(x, "udp", p, srv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.c.Close() })
		udp = append(udp, f)
	}
	at, au := a16Alive(tcp, "t"), a16Alive(udp, "u")
	st, _ := a16Share(t, lab.a, ifx, "tcp", srv)
	su, _ := a16Share(t, lab.a, ifx, "udp", srv)
	t.Logf("8 TCP and 8 UDP: %d and %d answer, shares %d and %d", len(at), len(au), st, su)
	if len(at) != 8 || len(au) != 8 || st != 8 || su != 8 {
		t.Errorf("8 TCP and 8 UDP flows to one address and port: %d and %d answer, shares %d and %d; want 8 each", len(at), len(au), st, su)
	}
	var more []*a14Flow
	for _, p := range a16Ports(52100, 8) {
		f, err := a14Dial(x, "udp", p, srv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.c.Close() })
		more = append(more, f)
	}
	// One after the other: asked at once, two CPUs can race for one
	// recycled port (one wins, the other's datagram is dropped and its
	// retry takes back the port of one of the flows that just answered),
	// and a16Alive, which counts node ports, would count them once.
	var am []int
	for j, f := range more {
		msg := fmt.Sprint("m", j)
		if _, e, err := f.ask(msg); err == nil && e == msg {
			am = append(am, j)
		}
	}
	at2 := a16Alive(tcp, "t2")
	t.Logf("8 more UDP: %d answer; TCP still %d", len(am), len(at2))
	if len(at2) != 8 {
		t.Errorf("8 more UDP flows at the UDP limit broke %d of x's TCP connections", 8-len(at2))
	}
	if len(am) != 8 {
		t.Errorf("8 more UDP flows at the limit: %d answer, want 8 (taking back x's own UDP ports)", len(am))
	}
}

// a16Flow is dump nat's row of the pod's flow from podAddr.
func a16Flow(t *testing.T, e *testenv.Env, podAddr string) (inspect.NATRow, bool) {
	t.Helper()
	js, err := e.MasqAgent("dump", "nat", "-o", "json")
	if err != nil {
		t.Errorf("dump nat: %v", err)
		return inspect.NATRow{}, false
	}
	var d inspect.NATDump
	if err := json.Unmarshal(js, &d); err != nil {
		t.Errorf("dump nat: %v", err)
		return inspect.NATRow{}, false
	}
	for _, f := range d.Flows {
		if f.Pod == podAddr && !f.ReverseOnly {
			return f, true
		}
	}
	return inspect.NATRow{}, false
}

// TestAttack16MasqServerHalfClosedKept: the server half-closes a connection
// first (its FIN) and reads on; the pod keeps sending. The flow is not
// closed (a FIN one way): it must live as an established one (1 h idle),
// not the 60 s of a flow the server closed first. dump nat's expiry is
// read; if it says a minute or less, the test waits it out and the pod's
// next line must still reach the server.
func TestAttack16MasqServerHalfClosedKept(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	got := make(chan string, 4)
	must(t, lab.out.Do(func(ns.NetNS) error {
		ln, err := net.Listen("tcp", hp(outsideIP, 7479))
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		acceptEach(ln, func(c net.Conn) {
			c.SetDeadline(time.Now().Add(90 * time.Second))
			c.(*net.TCPConn).CloseWrite()
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				got <- strings.TrimSpace(line)
			}
		})
		return nil
	}))
	x, r := lab.a.RunPod("a16hsx")
	x4, _ := testenv.PodIPs(t, r)
	f, err := a14Dial(x, "tcp", 44100, hp(outsideIP, 7479))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.c.Close() })
	f.c.SetDeadline(time.Now().Add(90 * time.Second))
	io.Copy(io.Discard, f.r) // the server's FIN
	f.c.Write([]byte("first\n"))
	if l := <-got; l != "first" {
		t.Fatalf("server got %q", l)
	}
	time.Sleep(700 * time.Millisecond)
	row, ok := a16Flow(t, lab.a, hp(x4, 44100))
	t.Logf("the server half-closed: flow %+v", row)
	if !ok {
		t.Fatalf("no flow of %s in dump nat", hp(x4, 44100))
	}
	if row.ExpiresSecs > 120 {
		return
	}
	t.Errorf("a connection the server half-closed (the pod still sending) expires in %.0f s, as a closed one", row.ExpiresSecs)
	time.Sleep(time.Duration(row.ExpiresSecs+2) * time.Second)
	f.c.Write([]byte("later\n"))
	select {
	case l := <-got:
		t.Logf("after %.0f s idle the server got %q", row.ExpiresSecs+2, l)
	case <-time.After(4 * time.Second):
		t.Errorf("after %.0f s idle the pod's line did not reach the server (the flow's translation gone)", row.ExpiresSecs+2)
	}
}

// TestAttack16MasqForgedServerFIN: pod x half-closes a connection (its FIN)
// from its port 62010, in the masquerade range (so the node port is 62010),
// and the server keeps sending. A host outside forges the server's FIN
// with a sequence number far from the server's ("a FIN from the peer counts
// only in order"). Counted, the flow would be closed by a FIN each way:
// its port anyone's after half a second. Pod y then connects from its port
// 62010 to the same server: it must connect, and x must keep receiving the
// server's data.
func TestAttack16MasqForgedServerFIN(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	lab.a.Extra["ipMasqPortRange"] = "62000-62031"
	must(t, lab.out.Do(func(ns.NetNS) error {
		ln, err := net.Listen("tcp", hp(outsideIP, 7478))
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		acceptEach(ln, func(c net.Conn) {
			for i := 0; i < 40; i++ {
				c.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := fmt.Fprintf(c, "tick %d\n", i); err != nil {
					return
				}
				time.Sleep(250 * time.Millisecond)
			}
		})
		return nil
	}))
	srv := hp(outsideIP, 7478)
	x, rx := lab.a.RunPod("a16ffx")
	x4, _ := testenv.PodIPs(t, rx)
	f, err := a14Dial(x, "tcp", 62010, srv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.c.Close() })
	f.c.(*net.TCPConn).CloseWrite()
	f.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := f.r.ReadString('\n'); err != nil {
		t.Fatalf("control: x got no tick: %v", err)
	}
	for k := 0; k < 4; k++ {
		must(t, a15SendRaw4(lab.out, labNodeA, a16TCP4(outsideIP, 7478, labNodeA, 62010, 0x5a5a5a5a+uint32(k)<<24, 0x11)))
	}
	time.Sleep(700 * time.Millisecond)
	if row, ok := a16Flow(t, lab.a, hp(x4, 62010)); ok {
		t.Logf("x's flow after the forged FINs: node %s, state %s, expires in %.0f s", row.Node, row.State, row.ExpiresSecs)
	}
	y, ry := lab.a.RunPod("a16ffy")
	y4, _ := testenv.PodIPs(t, ry)
	g, err := a14Dial(y, "tcp", 62010, srv)
	if err != nil {
		t.Errorf("pod y from its port 62010 to the server: %v", err)
	} else {
		t.Cleanup(func() { g.c.Close() })
		g.c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := g.r.ReadString('\n'); err != nil {
			t.Errorf("pod y's connection got no tick: %v", err)
		}
	}
	if row, ok := a16Flow(t, lab.a, hp(y4, 62010)); ok {
		t.Logf("y's flow: node %s", row.Node)
	}
	f.c.SetReadDeadline(time.Now().Add(3 * time.Second))
	for n := 0; n < 4; n++ {
		if _, err := f.r.ReadString('\n'); err != nil {
			break
		}
	}
	f.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = f.r.ReadString('\n')
	t.Logf("after the forged FINs and y's connection: x reads on: %v", err)
	if err != nil {
		t.Errorf("x's half-closed connection stopped receiving the server's data after forged FINs and y's connection from the same port: %v", err)
	}
}

// TestAttack16MasqShareBogusFIN: limit 8 on a 32-port range. The server
// answers a client's first line and then half-closes (its FIN), reading on
// (a server that sends its answer and shuts down writing, as HTTP/1.0 or a
// streaming sink does). Pod x opens 8 connections, reads each answer and
// the server's FIN, then sends on each, from a raw socket, a FIN whose
// sequence number is far outside the server's window: the server ignores
// it, the connections stay open x -> server. A second later x opens 8
// more the same way, then sends a line on all 16: more than 8 node ports
// delivering it means x holds more live flows towards one destination than
// its share, by a FIN the server never took. Before fin15 the datapath
// counted any FIN of the pod's (a FIN each way: the share released; 16 of
// 16 delivered); now the pod's FIN counts once the server acknowledged it
// (masq.h snat_fin_pod, snat_seq_peer_fin).
func TestAttack16MasqShareBogusFIN(t *testing.T) {
	t.Parallel()
	lab := newShareLab(t, "62200-62231")
	got, mu := a20HalfCloseServer(t, lab, 7486)
	srv := hp(outsideIP, 7486)
	run := func(id string, base int, fin bool) int {
		x, r := lab.a.RunPod(id)
		x4, _ := testenv.PodIPs(t, r)
		var conns []net.Conn
		open := func(from int) {
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
				if fin {
					must(t, a15SendRaw4(x, outsideIP, a16TCP4(x4, base+j, outsideIP, 7486, 0x5a5a5a5a+uint32(j)<<20, 0x01)))
				}
			}
		}
		open(0)
		time.Sleep(1200 * time.Millisecond)
		open(8)
		mu.Lock()
		clear(got)
		mu.Unlock()
		for _, c := range conns {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			c.Write([]byte("again\n"))
		}
		time.Sleep(1500 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		_, ifx := lab.a.HostVeth(id)
		s, c := a16Share(t, lab.a, ifx, "tcp", srv)
		t.Logf("%s (bogus FINs %v): %d of %d connections delivered at the end, share %d, recycled %d", id, fin, len(got), len(conns), s, c["recycled"])
		return len(got)
	}
	if n := run("a16ny", 48000, false); n > 8 {
		t.Errorf("control: pod y, no bogus FIN, has %d live flows to one server, over its share of 8", n)
	}
	if n := run("a16nx", 49000, true); n > 8 {
		t.Errorf("pod x holds %d live masqueraded connections to one server, over its share of 8: its FINs out of the server's window (ignored by the server) counted as its close, releasing the share of flows it still uses", n)
	}
}
