// hostPort flows that end: closed connections leave cni_ct within seconds,
// so a busy hostPort never pushes a quiet live connection out of the table.

package integration

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// lineServer serves port in netns: a client saying "long" gets every later
// line echoed; any other first line gets "ok" and the connection closed
// (the server closes first, as an HTTP server does).
func lineServer(t *testing.T, netns ns.NetNS, port int) {
	t.Helper()
	var ln net.Listener
	err := netns.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	acceptEach(ln, func(c net.Conn) {
		r := bufio.NewReader(c)
		first, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if first != "long\n" {
			c.Write([]byte("ok\n"))
			return
		}
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			c.Write([]byte(line))
		}
	})
}

// TestHostPortFlowLifeCycle: 100000 short connections through a hostPort
// (from four client addresses, so well over cni_ct's 65536 distinct flows;
// one in ten aborted with a RST) leave no entries behind once closed flows
// have expired, dump ct shows each flow's state, and a long-lived
// connection opened first keeps working throughout, quiet for most of it.
func TestHostPortFlowLifeCycle(t *testing.T) {
	t.Parallel()
	const total = 100000
	const maxCT = 65536 // MAX_CT, bpf/lib/maps.h
	e := newHPEnv(t)
	clients := []net.IP{net.ParseIP("198.51.100.10").To4(), net.ParseIP("198.51.100.11").To4(),
		net.ParseIP("198.51.100.12").To4(), net.ParseIP("198.51.100.13").To4()}
	err := e.remote.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, ip := range clients {
			a := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(24, 32)}, Flags: unix.IFA_F_NODAD}
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p := e.NewPod()
	e.MustAddHP(p, "web", testenv.PM{HostPort: 8100, ContainerPort: 80, Protocol: "tcp"})
	_, idx := e.HostVeth("web")
	lineServer(t, p, 80)
	addr := hp(uplinkIP4, 8100)
	m := e.Maps()

	// The long-lived connection, first.
	var long net.Conn
	err = e.remote.Do(func(ns.NetNS) error {
		var err error
		long, err = net.DialTimeout("tcp4", addr, 3*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	longR := bufio.NewReader(long)
	echo := func(when string) {
		t.Helper()
		long.SetDeadline(time.Now().Add(3 * time.Second))
		msg := fmt.Sprintf("still there %s\n", strings.ReplaceAll(when, " ", "-"))
		if _, err := long.Write([]byte(msg)); err != nil {
			t.Fatalf("long-lived connection %s: write: %v", when, err)
		}
		if got, err := longR.ReadString('\n'); err != nil || got != msg {
			t.Fatalf("long-lived connection %s: read %q, %v", when, got, err)
		}
	}
	if _, err := long.Write([]byte("long\n")); err != nil {
		t.Fatal(err)
	}
	echo("at the start")

	// The churn, sampled: the most entries the pod had at once.
	var done, failed atomic.Int64
	var maxEntries atomic.Int64
	stopSampling := make(chan struct{})
	var sawClosing atomic.Bool
	go func() {
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(500 * time.Millisecond):
			}
			n := 0
			fl, _ := m.HostPorts().ListCT()
			for _, f := range fl {
				if f.Ifindex == idx {
					n++
					sawClosing.Store(sawClosing.Load() || f.State == "closing")
				}
			}
			if int64(n) > maxEntries.Load() {
				maxEntries.Store(int64(n))
			}
		}
	}()
	churn := func(from, to int) {
		var wg sync.WaitGroup
		next := atomic.Int64{}
		next.Store(int64(from))
		start := time.Now()
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e.remote.Do(func(ns.NetNS) error {
					for {
						i := int(next.Add(1) - 1)
						if i >= to {
							return nil
						}
						if err := shortConn(clients[i%len(clients)], addr, i%10 == 0); err != nil {
							failed.Add(1)
						}
						done.Add(1)
					}
				})
			}()
		}
		wg.Wait()
		t.Logf("connections %d-%d: %v (%.0f/s)", from, to, time.Since(start).Round(time.Millisecond), float64(to-from)/time.Since(start).Seconds())
	}
	churn(0, 30000)
	echo("after 30000 connections")
	// The longest quiet stretch: 70000 connections, more flows than cni_ct holds.
	churn(30000, total)
	close(stopSampling)
	echo(fmt.Sprintf("after %d connections", total))
	if f := failed.Load(); f > total/1000 {
		t.Errorf("%d of %d short connections failed", f, total)
	}

	// Closed flows expire 10 s after their last packet; their timers delete
	// them, and the agent's sweep (ExpireCT, every 10 s) those whose timer
	// the kernel could not allocate.
	var left []maps.Flow
	swept := 0
	deadline := time.Now().Add(maps.FlowTimeoutClosing + 5*time.Second)
	for {
		left = left[:0]
		fl, err := m.HostPorts().ListCT()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fl {
			if f.Ifindex == idx {
				left = append(left, f)
			}
		}
		if len(left) <= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
		n, err := m.HostPorts().ExpireCT()
		if err != nil {
			t.Fatal(err)
		}
		swept += n
	}
	if len(left) != 1 || left[0].State != "established" || left[0].Client.Port() != uint16(long.LocalAddr().(*net.TCPAddr).Port) {
		n := min(len(left), 5)
		t.Errorf("%d cni_ct entries of the pod %v after the closed flows' timeout, want the long-lived connection's alone, established: %+v",
			len(left), maps.FlowTimeoutClosing, left[:n])
	}
	if !sawClosing.Load() {
		t.Errorf("no flow was ever in state closing")
	}
	if n := maxEntries.Load(); n >= maxCT {
		t.Errorf("the pod had %d cni_ct entries at once: the table (%d) filled", n, maxCT)
	}
	st, _ := m.HostPorts().Stats()
	switch {
	case forced(datapath.FeatTimer) && st["expired"] != 0:
		// The compat build (make test-fallback) arms no timer: the sweep alone.
		t.Errorf("%d flows deleted by timers, but the compat build arms none", st["expired"])
	case !forced(datapath.FeatTimer) && st["expired"] == 0:
		t.Errorf("no flow deleted by its timer")
	}
	t.Logf("deleted by their timers %d, by the sweep %d", st["expired"], swept)
	echo("at the end")
	t.Logf("most cni_ct entries of the pod at once: %d; counters %v", maxEntries.Load(), st)
	e.MustDel(p, "web")
	e.AssertNoHostPorts()
}

// shortConn connects from ip to addr, says hello, reads the answer and the
// server's close, then closes (with a RST when abort).
func shortConn(ip net.IP, addr string, abort bool) error {
	d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: ip}}
	c, err := d.Dial("tcp4", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("short\n")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "ok\n" {
		return fmt.Errorf("answer %q: %v", buf[:n], err)
	}
	if abort {
		c.(*net.TCPConn).SetLinger(0)
		return nil
	}
	if _, err := c.Read(buf); err == nil {
		return fmt.Errorf("no close from the server")
	}
	return nil
}
