package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// tcpExt reads one TcpExt counter of a network namespace.
func tcpExt(t *testing.T, n ns.NetNS, name string) uint64 {
	t.Helper()
	var data []byte
	err := n.Do(func(ns.NetNS) error {
		var err error
		data, err = os.ReadFile("/proc/thread-self/net/netstat") // this thread's netns, not the process's
		return err
	})
	if err != nil {
		t.Fatalf("netstat: %v", err)
	}
	lines := strings.Split(string(data), "\n")
	for i := 0; i+1 < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "TcpExt:") || !strings.HasPrefix(lines[i+1], "TcpExt:") {
			continue
		}
		names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		for j := 1; j < len(names) && j < len(vals); j++ {
			if names[j] == name {
				v, err := strconv.ParseUint(vals[j], 10, 64)
				if err != nil {
					t.Fatalf("netstat %s: %v", name, err)
				}
				return v
			}
		}
	}
	t.Fatalf("netstat: no TcpExt %s", name)
	return 0
}

// listenTCPIn listens on addr in netns, closed at the test's end.
func listenTCPIn(t *testing.T, netns ns.NetNS, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	must(t, netns.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	}))
	t.Cleanup(func() { ln.Close() })
	return ln
}

// serveCloseFirst accepts on ln until it is closed, reports each peer to
// seen (when not nil), writes one byte and closes first (the server holds
// TIME_WAIT).
func serveCloseFirst(ln net.Listener, seen chan<- string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if seen != nil {
			seen <- c.RemoteAddr().String()
		}
		c.Write([]byte{'x'})
		c.Close() // the server closes first: TIME_WAIT is its
	}
}

// readCloseFirst reads on c, within 5 s, the one byte of serveCloseFirst
// and then its close (EOF); buf holds two bytes.
func readCloseFirst(c net.Conn, buf []byte) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	n, err := io.ReadFull(c, buf[:1])
	if err == nil {
		_, err = c.Read(buf)
	}
	if n != 1 || !errors.Is(err, io.EOF) {
		return fmt.Errorf("answer: %d bytes, %v; want one byte, then the server's close", n, err)
	}
	return nil
}

// TestMasqServerTimeWait: a masquerading pod opens 6000 short TCP
// connections to one outside server that closes first, so the server holds
// TIME_WAIT for every translated tuple, and takes a new SYN on one only if
// its timestamps follow the last ones there (PAWS; Linux's timestamp offset
// is per tuple). Every SYN must be taken at once: no PAWS refusal at the
// server, no SYN retransmitted by the pod. Before issue 30's fix two of the
// pod's ports hashed to one node port, and past the pod's 4189 ports towards
// the server (closed flows counted for 10 s) each new flow took back a port
// another of its tuples had used: hundreds of SYNs refused, each costing a
// second (new connections/s fell to a tenth of plain routing's).
func TestMasqServerTimeWait(t *testing.T) {
	masqTimeWait(t, 0)
}

// TestMasqServerTimeWaitAtQuota: the same on a node sized for 40 pods,
// where the pod's quota of flows (3743: its reserve and half the pool) is
// below the 6000 flows it opens, closed ones included (their entries live
// 10 s), so its last flows each take back one of its own ports. The port
// given back was another of its tuples'; the new flow must go to the node
// port its own tuple maps to, when free (before: PAWS refusals again). No PAWS
// refusal; a SYN lost here must be one the quota dropped and counted
// (drop_pod_limit: none of the pod's own flows among the candidates tried,
// docs/masquerade.md), and such a dial may time out, the same tuple finding
// the same candidates at each retransmit (about half the runs of round 12).
func TestMasqServerTimeWaitAtQuota(t *testing.T) {
	masqTimeWait(t, 40)
}

// masqTimeWait runs the connections of TestMasqServerTimeWait on a node
// whose maxPods is maxPods (0: the default).
func masqTimeWait(t *testing.T, maxPods int) {
	lab := newMasqLab(t)
	if maxPods > 0 {
		lab.a.Extra["maxPods"] = maxPods
	}
	pod, _ := lab.a.RunPod("timewait")

	const port = 7300
	go serveCloseFirst(listenTCPIn(t, lab.out, "tcp4", net.JoinHostPort(outsideIP.String(), fmt.Sprint(port))), nil)

	paws, synRetrans := tcpExt(t, lab.out, "PAWSTimewait"), tcpExt(t, pod, "TCPSynRetrans")
	listenDrops := tcpExt(t, lab.out, "ListenDrops")
	st0, err := lab.a.Maps().Masq().Stats()
	if err != nil {
		t.Fatal(err)
	}
	const workers, total = 4, 6000
	var next, slow, timedOut atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- pod.Do(func(ns.NetNS) error {
				buf := make([]byte, 2)
				for next.Add(1) <= total {
					t0 := time.Now()
					c, err := net.DialTimeout("tcp4", net.JoinHostPort(outsideIP.String(), fmt.Sprint(port)), 5*time.Second)
					var ne net.Error
					if err != nil && maxPods > 0 && errors.As(err, &ne) && ne.Timeout() {
						timedOut.Add(1) // judged below against drop_pod_limit
						continue
					}
					if err != nil {
						return err
					}
					err = readCloseFirst(c, buf)
					c.Close()
					if err != nil {
						return err
					}
					if time.Since(t0) > 500*time.Millisecond {
						slow.Add(1)
					}
				}
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	st1, serr := lab.a.Maps().Masq().Stats()
	if serr != nil {
		t.Fatal(serr)
	}
	for k, v := range st1 {
		if v != st0[k] {
			t.Logf("masquerade counter %s: +%d", k, v-st0[k])
		}
	}
	for err := range errs {
		if err != nil {
			t.Fatalf("connection: %v", err)
		}
	}
	el := time.Since(start)
	dPAWS, dSyn := tcpExt(t, lab.out, "PAWSTimewait")-paws, tcpExt(t, pod, "TCPSynRetrans")-synRetrans
	dListen := tcpExt(t, lab.out, "ListenDrops") - listenDrops
	t.Logf("%d connections in %v (%.0f/s): %d over 500 ms, %d SYNs refused by PAWS, %d SYNs retransmitted, %d dropped by the server's listener",
		total, el.Round(time.Millisecond), total/el.Seconds(), slow.Load(), dPAWS, dSyn, dListen)
	limit := st1["drop_pod_limit"] - st0["drop_pod_limit"]
	if dPAWS != 0 {
		t.Errorf("the server refused %d of the pod's SYNs in TIME_WAIT (PAWS): a node port went to another of the pod's tuples while the server still held the last one's", dPAWS)
	}
	switch {
	case maxPods == 0 && (dSyn != 0 || limit != 0):
		t.Errorf("the pod retransmitted %d SYNs (%d dropped at its limit) under no quota", dSyn, limit)
	case (dSyn != 0 || timedOut.Load() != 0) && limit == 0:
		t.Errorf("the pod retransmitted %d SYNs and %d connections timed out, none dropped at its quota (drop_pod_limit): lost elsewhere", dSyn, timedOut.Load())
	case dSyn != 0:
		// docs/masquerade.md: at its quota a pod takes back one of its own
		// flows among the candidates tried, else its SYN is dropped and
		// counted; not PAWS.
		t.Logf("at its quota: %d SYNs dropped and counted (drop_pod_limit), %d connections timed out", limit, timedOut.Load())
	}
}
