package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// A probe keeps one flow of a path busy during the rollout: a numbered
// message every interval over one socket (UDP: one source port, an
// established flow through every NAT and conntrack table on the way; TCP:
// one connection) to an echo server, which sends it back. The harness owns
// both sockets, opened in the pods' (or the outside namespace's) network
// namespaces through /proc/<pid>/ns/net: nothing runs in the pods but
// pause, so the counts are the network's, not a workload's.
//
// Phases are marked by the number sent when they start: a UDP number
// without an echo was lost in the phase it was sent in; a TCP segment lost
// shows as a retransmission the receiver did not report as a duplicate,
// and a broken connection loses everything after it.
type probe struct {
	name, path string
	tcp        bool
	c          net.Conn
	every      time.Duration

	stop, done chan struct{}
	mu         sync.Mutex
	sent       uint32
	got        map[uint32]time.Time // number -> when its echo arrived
	sentAt     map[uint32]time.Time // number -> when it was sent: a loss is placed in time, beside the agents' logs
	errs       []string             // socket errors (write, read), with the number they hit
	broken     uint32               // TCP: the number after which the connection failed, 0 if it did not
	marks      []mark
}

type mark struct {
	at      uint32 // last number sent before the phase began
	retrans uint32 // TCP: retransmissions less duplicates, so far
}

// inNetns runs f in the network namespace of pid (a pod's process, or a
// namespace holder) on a locked thread: sockets made there stay in it.
func inNetns(pid int, f func() error) error {
	return ns.WithNetNSPath(fmt.Sprintf("/proc/%d/ns/net", pid), func(ns.NetNS) error { return f() })
}

func startProbe(name, path, network string, pid int, dst string, every time.Duration) (*probe, error) {
	p := &probe{name: name, path: path, tcp: network == "tcp", every: every,
		stop: make(chan struct{}), done: make(chan struct{}), got: map[uint32]time.Time{}, sentAt: map[uint32]time.Time{}}
	if err := inNetns(pid, func() error {
		var err error
		p.c, err = net.DialTimeout(network, dst, 5*time.Second)
		return err
	}); err != nil {
		return nil, fmt.Errorf("probe %s: dial %s %s: %w", name, network, dst, err)
	}
	go p.read()
	go p.send()
	return p, nil
}

func (p *probe) read() {
	buf := make([]byte, 32)
	for {
		var (
			n   int
			err error
		)
		if p.tcp {
			n, err = io.ReadFull(p.c, buf)
		} else {
			n, err = p.c.Read(buf)
		}
		now := time.Now()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.mu.Lock()
			p.errs = append(p.errs, fmt.Sprintf("read after #%d: %v", p.sent, err))
			if p.tcp {
				p.broken = p.sent
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			// UDP: an ICMP error reported on the socket; the flow goes on.
			continue
		}
		if n >= 4 {
			p.mu.Lock()
			p.got[binary.BigEndian.Uint32(buf)] = now
			p.mu.Unlock()
		}
	}
}

func (p *probe) send() {
	defer close(p.done)
	tk := time.NewTicker(p.every)
	defer tk.Stop()
	msg := make([]byte, 32)
	for {
		select {
		case <-p.stop:
			return
		case <-tk.C:
		}
		p.mu.Lock()
		if p.broken != 0 {
			p.mu.Unlock()
			return
		}
		p.sent++
		n := p.sent
		p.sentAt[n] = time.Now()
		p.mu.Unlock()
		binary.BigEndian.PutUint32(msg, n)
		if _, err := p.c.Write(msg); err != nil {
			p.mu.Lock()
			p.errs = append(p.errs, fmt.Sprintf("write #%d: %v", n, err))
			p.mu.Unlock()
		}
	}
}

// answered: whether the probe has had an echo yet.
func (p *probe) answered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.got) > 0
}

// retransmitted: TCP retransmissions less those the receiver reported as
// duplicates (DSACK: the spurious ones a stalled, loaded machine fires).
func (p *probe) retransmitted() uint32 {
	var r uint32
	if !p.tcp {
		return 0
	}
	raw, err := p.c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return 0
	}
	raw.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil && info.Total_retrans > info.Dsack_dups {
			r = info.Total_retrans - info.Dsack_dups
		}
	})
	return r
}

// markPhase starts a phase.
func (p *probe) markPhase() {
	r := p.retransmitted()
	p.mu.Lock()
	p.marks = append(p.marks, mark{at: p.sent, retrans: r})
	p.mu.Unlock()
}

// phaseResult: what one phase of one probe saw.
type phaseResult struct {
	sent, lost uint32
	retrans    uint32
	maxGap     time.Duration // longest time between two echoes that arrived in the phase
	broken     bool
	losses     []string // UDP: each run of consecutive lost numbers, with when they were sent (UTC)
}

// lossRun says one run of consecutive lost numbers and when they were sent.
func (p *probe) lossRun(from, to uint32) string {
	const clock = "15:04:05.000"
	return fmt.Sprintf("#%d-#%d (%d) sent %s-%s", from, to, to-from+1, p.sentAt[from].UTC().Format(clock), p.sentAt[to].UTC().Format(clock))
}

// stopSending ends the last phase: no number is sent after it.
func (p *probe) stopSending() {
	close(p.stop)
	<-p.done
}

// finish splits the outcome by phase (marked with markPhase; the first
// phase must be marked after the probe was answered). Call it after
// stopSending and a wait for the last echoes.
func (p *probe) finish() []phaseResult {
	end := mark{retrans: p.retransmitted()}
	p.c.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	end.at = p.sent
	marks := append(append([]mark{}, p.marks...), end)
	var out []phaseResult
	for i := 0; i+1 < len(marks); i++ {
		from, to := marks[i].at+1, marks[i+1].at
		r := phaseResult{retrans: marks[i+1].retrans - marks[i].retrans}
		var last time.Time
		var runFrom uint32 // first number of the current run of losses, 0: none
		for n := from; n <= to; n++ {
			r.sent++
			at, ok := p.got[n]
			if !ok {
				r.lost++
				if runFrom == 0 {
					runFrom = n
				}
				continue
			}
			if runFrom != 0 {
				r.losses = append(r.losses, p.lossRun(runFrom, n-1))
				runFrom = 0
			}
			if !last.IsZero() && at.Sub(last) > r.maxGap {
				r.maxGap = at.Sub(last)
			}
			if at.After(last) {
				last = at
			}
		}
		if runFrom != 0 {
			r.losses = append(r.losses, p.lossRun(runFrom, to))
		}
		if p.tcp {
			r.losses = nil // a TCP number without echo is the broken connection's, not a loss
		}
		r.broken = p.broken != 0 && p.broken >= from-1 && p.broken <= to
		out = append(out, r)
	}
	return out
}

// echoServers answers every UDP datagram and TCP connection to port on all
// addresses of pid's network namespace with itself, until closed.
type echoServers struct {
	mu      sync.Mutex
	closers []io.Closer
	sources map[int]map[string]bool // pid of the namespace -> client addresses seen
}

func (e *echoServers) saw(pid int, a net.Addr) {
	host, _, _ := net.SplitHostPort(a.String())
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sources == nil {
		e.sources = map[int]map[string]bool{}
	}
	if e.sources[pid] == nil {
		e.sources[pid] = map[string]bool{}
	}
	e.sources[pid][host] = true
}

// sourcesOf: the client addresses the servers in pid's namespace saw.
func (e *echoServers) sourcesOf(pid int) map[string]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]bool{}
	for s := range e.sources[pid] {
		out[s] = true
	}
	return out
}

func (e *echoServers) add(c io.Closer) {
	e.mu.Lock()
	e.closers = append(e.closers, c)
	e.mu.Unlock()
}

func (e *echoServers) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.closers {
		c.Close()
	}
}

func (e *echoServers) listen(pid int, port int, v6 bool) error {
	fams := []string{"4"}
	if v6 {
		fams = append(fams, "6")
	}
	for _, fam := range fams {
		var (
			uc *net.UDPConn
			ln net.Listener
		)
		if err := inNetns(pid, func() error {
			var err error
			if uc, err = net.ListenUDP("udp"+fam, &net.UDPAddr{Port: port}); err != nil {
				return err
			}
			ln, err = net.Listen("tcp"+fam, fmt.Sprintf(":%d", port))
			return err
		}); err != nil {
			if uc != nil {
				uc.Close()
			}
			return fmt.Errorf("echo servers on port %d in the netns of pid %d: %w", port, pid, err)
		}
		e.add(uc)
		e.add(ln)
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := uc.ReadFromUDP(buf)
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				e.saw(pid, from)
				uc.WriteToUDP(buf[:n], from)
			}
		}()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				e.add(c)
				e.saw(pid, c.RemoteAddr())
				go io.Copy(c, c)
			}
		}()
	}
	return nil
}
