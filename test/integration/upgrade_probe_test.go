// Probes of the upgrade-under-traffic tests: UDP and TCP echo servers and a
// numbered probe over one flow that counts what was lost on the way.

package integration

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// echoUDP answers every datagram to port on all addresses of netns with
// itself, until the test ends.
func echoUDP(t *testing.T, netns ns.NetNS, port int) {
	t.Helper()
	for _, fam := range []string{"4", "6"} {
		var c *net.UDPConn
		must(t, netns.Do(func(ns.NetNS) error {
			var err error
			c, err = net.ListenUDP("udp"+fam, &net.UDPAddr{Port: port})
			return err
		}))
		t.Cleanup(func() { c.Close() })
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := c.ReadFromUDP(buf)
				if err != nil {
					return
				}
				if n >= 4 {
					echoSeen.note(port, from.String(), binary.BigEndian.Uint32(buf))
				}
				if _, err := c.WriteToUDP(buf[:n], from); err != nil && n >= 4 {
					echoSeen.failed(port, from.String(), binary.BigEndian.Uint32(buf), err)
				}
			}
		}()
	}
}

// echoSeen records which numbered datagrams each echo server received, by
// its port and the sender's address as it saw it: a lost number that
// reached the server was lost on the way back.
var echoSeen = &echoRecord{m: map[string]map[uint32]bool{}}

type echoRecord struct {
	mu   sync.Mutex
	m    map[string]map[uint32]bool
	errs map[string]error // the echo of a number could not be sent
}

func (r *echoRecord) note(port int, from string, n uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := fmt.Sprintf("%d|%s", port, from)
	if r.m[k] == nil {
		r.m[k] = map[uint32]bool{}
	}
	r.m[k][n] = true
}

func (r *echoRecord) failed(port int, from string, n uint32, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.errs == nil {
		r.errs = map[string]error{}
	}
	r.errs[fmt.Sprintf("%d|%s|%d", port, from, n)] = err
}

// reached says whether the server on port saw number n from from: "yes",
// "no", or "unknown" when it saw nothing from that address (a translated
// source).
func (r *echoRecord) reached(port int, from string, n uint32) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := r.m[fmt.Sprintf("%d|%s", port, from)]
	switch {
	case seen == nil:
		return "unknown"
	case seen[n] && r.errs[fmt.Sprintf("%d|%s|%d", port, from, n)] != nil:
		return fmt.Sprintf("yes, but its echo was not sent: %v", r.errs[fmt.Sprintf("%d|%s|%d", port, from, n)])
	case seen[n]:
		return "yes"
	}
	return "no"
}

// seqProbe sends a numbered datagram every interval over one UDP flow
// (one socket, one source port: an established flow) and counts the
// echoes: every number without one was lost on the way there or back.
type seqProbe struct {
	name string
	c    net.Conn
	tcp  bool // a TCP stream: the echoes come back as a stream
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	sent uint32
	got  map[uint32]bool
	// When each number was sent, to place a loss among the test's steps.
	sentAt map[uint32]time.Time
	// TCP, once stopped: retransmitted segments, and duplicates the
	// receiver reported (DSACK).
	rawRetrans, dsack uint32
	// Errors of the probe's own socket, with the number they hit: a
	// datagram that never left (ENOBUFS, an ICMP error reported on the next
	// send) is told apart from one the path lost.
	errs []string
}

func startProbe(t *testing.T, name string, from ns.NetNS, dst string, interval time.Duration) *seqProbe {
	t.Helper()
	return startProbeOver(t, "udp", name, from, dst, interval)
}

// startProbeOver is startProbe over network "udp" or "tcp" (one
// connection, to an echo server; a lost segment shows as a retransmission).
func startProbeOver(t *testing.T, network, name string, from ns.NetNS, dst string, interval time.Duration) *seqProbe {
	t.Helper()
	p := &seqProbe{name: name, tcp: network == "tcp", stop: make(chan struct{}), done: make(chan struct{}), got: map[uint32]bool{}, sentAt: map[uint32]time.Time{}}
	must(t, from.Do(func(ns.NetNS) error {
		var err error
		p.c, err = net.DialTimeout(network, dst, 3*time.Second)
		return err
	}))
	t.Cleanup(func() { p.c.Close() })
	go func() {
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
			if err != nil {
				if ne, ok := err.(net.Error); ok && !p.tcp && !ne.Timeout() && !strings.Contains(err.Error(), "closed") {
					// UDP: an ICMP error reported on a read; the flow goes on.
					p.mu.Lock()
					p.errs = append(p.errs, fmt.Sprintf("read after #%d: %v", p.sent, err))
					p.mu.Unlock()
					continue
				}
				return
			}
			if n >= 4 {
				p.mu.Lock()
				p.got[binary.BigEndian.Uint32(buf)] = true
				p.mu.Unlock()
			}
		}
	}()
	go func() {
		defer close(p.done)
		tk := time.NewTicker(interval)
		defer tk.Stop()
		msg := make([]byte, 32)
		for {
			select {
			case <-p.stop:
				return
			case <-tk.C:
			}
			p.mu.Lock()
			p.sent++
			p.sentAt[p.sent] = time.Now()
			binary.BigEndian.PutUint32(msg, p.sent)
			p.mu.Unlock()
			if _, err := p.c.Write(msg); err != nil {
				p.mu.Lock()
				p.errs = append(p.errs, fmt.Sprintf("write #%d: %v", binary.BigEndian.Uint32(msg), err))
				p.mu.Unlock()
			}
		}
	}()
	return p
}

// waitAnswered waits until the probe got its first echo.
func (p *seqProbe) waitAnswered(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		p.mu.Lock()
		n := len(p.got)
		p.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe %s: no echo in 5 s", p.name)
		}
	}
}

// finish stops sending, waits a second for the last echoes and returns how
// many were sent, which numbers were lost, and (TCP) how many segments the
// sender retransmitted because one was lost: its retransmissions less those
// the receiver reported as duplicates (DSACK), the tail loss probes and
// timeouts a stalled, loaded machine fires although nothing was lost.
func (p *seqProbe) finish() (sent uint32, lost []uint32, retrans uint32) {
	close(p.stop)
	<-p.done
	time.Sleep(time.Second)
	if p.tcp {
		if raw, err := p.c.(*net.TCPConn).SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) {
				if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
					p.rawRetrans, p.dsack = info.Total_retrans, info.Dsack_dups
					if info.Total_retrans > info.Dsack_dups {
						retrans = info.Total_retrans - info.Dsack_dups
					}
				}
			})
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Numbers before the first echo went out while the path was still
	// being resolved (neighbour discovery), before the upgrade began
	// (waitAnswered): not counted.
	first := p.sent + 1
	for i := range p.got {
		first = min(first, i)
	}
	for i := first; i <= p.sent; i++ {
		if !p.got[i] {
			lost = append(lost, i)
		}
	}
	return p.sent - (first - 1), lost, retrans
}

// echoTCP echoes every connection to port on all addresses of netns.
func echoTCP(t *testing.T, netns ns.NetNS, port int) {
	t.Helper()
	for _, fam := range []string{"4", "6"} {
		var ln net.Listener
		must(t, netns.Do(func(ns.NetNS) error {
			var err error
			ln, err = net.Listen("tcp"+fam, fmt.Sprintf(":%d", port))
			return err
		}))
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() })
				go io.Copy(c, c)
			}
		}()
	}
}

// where places the first lost numbers among the test's steps (the step
// number their sending time falls at) and says whether the echo server
// got them: lost on the way there, or on the way back.
func (p *seqProbe) where(lost []uint32, start time.Time, every time.Duration) string {
	if len(lost) == 0 || p.tcp {
		return ""
	}
	_, port, _ := net.SplitHostPort(p.c.RemoteAddr().String())
	pn, _ := strconv.Atoi(port)
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for i, n := range lost {
		if i == 5 {
			fmt.Fprintf(&b, "; ...")
			break
		}
		// The server listens on the pod's port, not the hostPort or the
		// Service's: known by the sender's address only.
		seen := "unknown"
		for _, sp := range []int{pn, 81, 7} {
			if r := echoSeen.reached(sp, p.c.LocalAddr().String(), n); r != "unknown" {
				seen = r
				break
			}
		}
		fmt.Fprintf(&b, "; #%d sent at step #%d, reached the server: %s", n, p.sentAt[n].Sub(start)/every, seen)
	}
	return b.String()
}
