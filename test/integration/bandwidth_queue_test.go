// Bandwidth limits for senders the node cannot pace: the ingress queue on
// the host veth and the pod's receive window (docs/bandwidth.md).

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// withRemote gives a node a "remote host": a netns routed to it over an uplink
// veth (hostport_test.go's plugUplink), whose TCP the node cannot pace.
func withRemote(t *testing.T, e *testenv.Env) ns.NetNS {
	t.Helper()
	r := testenv.NewNS(t)
	if err := (&hpEnv{Env: e, remote: r}).plugUplink(); err != nil {
		t.Fatal(err)
	}
	return r
}

// streamStats is what the receiver of a stream saw, per 1 s from its first byte.
type streamStats struct {
	intervals []float64 // bits per second of each full second
	mean      float64   // bits per second over the whole stream
	retrans   uint32    // the sender's retransmitted segments (TCP_INFO)
}

// tcpStream streams from src to a listener in dst for d and returns what the
// receiver got, second by second.
func tcpStream(t *testing.T, src, dst ns.NetNS, ip net.IP, d time.Duration) streamStats {
	t.Helper()
	return tcpStreamVia(t, src, dst, net.JoinHostPort(ip.String(), "0"), "", d)
}

// tcpStreamVia is tcpStream to a listener on listen in dst, dialled at dial
// ("": the listener's address; a hostPort, a Service).
func tcpStreamVia(t *testing.T, src, dst ns.NetNS, listen, dial string, d time.Duration) streamStats {
	t.Helper()
	var ln net.Listener
	if err := dst.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", listen)
		return err
	}); err != nil {
		t.Fatalf("listen on %s: %v", listen, err)
	}
	defer ln.Close()
	if dial == "" {
		dial = ln.Addr().String()
	}
	ip := dial
	type result struct {
		perSec []int64
		total  int64
		dur    time.Duration
		err    error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(d + 20*time.Second))
		var r result
		buf := make([]byte, 256<<10)
		var start time.Time
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if start.IsZero() {
					start = time.Now()
				}
				sec := int(time.Since(start) / time.Second)
				for len(r.perSec) <= sec {
					r.perSec = append(r.perSec, 0)
				}
				r.perSec[sec] += int64(n)
				r.total += int64(n)
			}
			if err != nil {
				if err != io.EOF {
					r.err = err
				}
				break
			}
		}
		r.dur = time.Since(start)
		done <- r
	}()
	var retrans uint32
	err := src.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", dial, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64<<10)
		end := time.Now().Add(d)
		c.SetDeadline(end.Add(20 * time.Second))
		for time.Now().Before(end) {
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			return err
		}
		return raw.Control(func(fd uintptr) {
			if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				retrans = info.Total_retrans
			}
		})
	})
	if err != nil {
		t.Fatalf("stream to %s: %v", ip, err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("receive the stream to %s: %v", ip, r.err)
	}
	s := streamStats{mean: float64(r.total*8) / r.dur.Seconds(), retrans: retrans}
	// The last second is partial (the stream ends inside it).
	for i := 0; i < len(r.perSec)-1; i++ {
		s.intervals = append(s.intervals, float64(r.perSec[i]*8))
	}
	return s
}

// pingRTTs pings ip from a netns and returns the replies' round trips, sorted.
func pingRTTs(netns ns.NetNS, ip net.IP, count int) ([]float64, error) {
	var out []byte
	err := netns.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("ping", "-n", "-c", fmt.Sprint(count), "-i", "0.2", "-W", "2", ip.String()).Output()
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 {
			err = nil // some replies missing: still a result
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	var rtts []float64
	for _, line := range strings.Split(string(out), "\n") {
		if i := strings.Index(line, "time="); i >= 0 {
			var v float64
			if _, err := fmt.Sscanf(line[i+len("time="):], "%g", &v); err == nil {
				rtts = append(rtts, v)
			}
		}
	}
	sort.Float64s(rtts)
	return rtts, nil
}

// TestBandwidthRemoteTCP: one TCP stream from another host into a pod with a
// 20 Mbit/s ingress limit and containerd's burst gets its limit: the bucket
// alone gave it 0.29x. Each full second stays under 1.10x, the first one too.
func TestBandwidthRemoteTCP(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	remote := withRemote(t, e)
	a := e.NewPod()
	e.CleanupDel(a, "remote-tcp")
	const rate = 20e6
	ra, err := e.AddBW(a, "remote-tcp", bandwidthArgs(rate, 0))
	if err != nil {
		t.Fatalf("ADD with bandwidth: %v", err)
	}
	a4, _ := testenv.PodIPs(t, ra)

	pings := make(chan []float64, 1)
	go func() {
		time.Sleep(time.Second) // past slow start
		rtts, err := pingRTTs(remote, a4, 20)
		if err != nil {
			t.Errorf("ping under load: %v", err)
		}
		pings <- rtts
	}()
	s := tcpStream(t, remote, a, a4, 6*time.Second)
	rtts := <-pings

	var worst float64
	for _, bps := range s.intervals {
		worst = max(worst, bps)
	}
	var p90 float64
	if len(rtts) > 0 {
		p90 = rtts[len(rtts)*9/10]
	}
	t.Logf("remote TCP at a %.0f Mbit/s limit: mean %.3fx, 1 s intervals %s, %d retransmitted segments, ping under load p90 %.2f ms (%d of 20 replies)",
		rate/1e6, s.mean/rate, ratios(s.intervals, rate), s.retrans, p90, len(rtts))
	if s.mean < 0.85*rate || s.mean > 1.05*rate {
		t.Errorf("mean %.1f Mbit/s, want %.1f-%.1f (0.85x-1.05x of the limit)", s.mean/1e6, 0.85*rate/1e6, 1.05*rate/1e6)
	}
	if worst > 1.10*rate {
		t.Errorf("a 1 s interval carried %.1f Mbit/s, over 1.10x of the limit", worst/1e6)
	}
	if len(s.intervals) < 4 {
		t.Errorf("only %d full seconds received", len(s.intervals))
	}
	// A queue that only a timeout drains is seconds deep: the window the pod
	// advertises must keep it at milliseconds.
	if len(rtts) < 15 || p90 > 20 {
		t.Errorf("ping under load: p90 %.2f ms with %d of 20 replies, want under 20 ms with 15 or more", p90, len(rtts))
	}
	e.MustDel(a, "remote-tcp")
	e.AssertClean()
}

// TestBandwidthOtherNodeTCP: the same for a pod on a second ebpf-cni node
// over host-gw routes: that node does not pace towards a pod it does not
// hold, so its stream meets the ingress queue as a remote host's does.
func TestBandwidthOtherNodeTCP(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a, b := lab.a, lab.b
	peers := filepath.Join(t.TempDir(), "peers.json")
	pj, _ := json.Marshal([]agent.Peer{
		{NodeIP: labNodeA.String(), PodCIDRs: []string{labPodsA}},
		{NodeIP: labNodeB.String(), PodCIDRs: []string{labPodsB}},
	})
	if err := os.WriteFile(peers, pj, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*testenv.Env{a, b} {
		if _, err := e.MasqAgent("peers", "--peers", peers); err != nil {
			t.Fatal(err)
		}
	}
	pa, pb := a.NewPod(), b.NewPod()
	a.CleanupDel(pa, "limited")
	b.CleanupDel(pb, "sender")
	const rate = 20e6
	ra, err := a.AddBW(pa, "limited", bandwidthArgs(rate, 0))
	if err != nil {
		t.Fatalf("ADD with bandwidth on node A: %v", err)
	}
	// The sender is limited too (its egress well above), so node B's pacing
	// hook is attached and sees the stream's socket.
	if _, err := b.AddBW(pb, "sender", bandwidthArgs(0, 10*rate)); err != nil {
		t.Fatalf("ADD on node B: %v", err)
	}
	a4 := v4Of(t, ra)
	s := tcpStream(t, pb, pa, a4, 5*time.Second)
	var worst float64
	for _, bps := range s.intervals {
		worst = max(worst, bps)
	}
	t.Logf("pod on another node at a %.0f Mbit/s limit: mean %.3fx, 1 s intervals %s, %d retransmitted segments",
		rate/1e6, s.mean/rate, ratios(s.intervals, rate), s.retrans)
	if s.mean < 0.85*rate || s.mean > 1.05*rate {
		t.Errorf("mean %.1f Mbit/s, want %.1f-%.1f (0.85x-1.05x of the limit)", s.mean/1e6, 0.85*rate/1e6, 1.05*rate/1e6)
	}
	if worst > 1.10*rate {
		t.Errorf("a 1 s interval carried %.1f Mbit/s, over 1.10x of the limit", worst/1e6)
	}
	a.MustDel(pa, "limited")
	b.MustDel(pb, "sender")
	// The host-gw routes are the agent's: an empty peers file removes them.
	if err := os.WriteFile(peers, []byte("[]"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*testenv.Env{a, b} {
		if _, err := e.MasqAgent("peers", "--peers", peers); err != nil {
			t.Fatal(err)
		}
		e.AssertClean()
	}
}

func ratios(bps []float64, rate float64) string {
	var parts []string
	for _, v := range bps {
		parts = append(parts, fmt.Sprintf("%.2f", v/rate))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// TestBandwidthRemoteUDPIsPoliced: UDP from another host, sent at three times
// a pod's ingress limit, reaches the pod at the limit: the queue holds at most
// its capacity, the bucket drops the rest and counts it.
func TestBandwidthRemoteUDPIsPoliced(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	remote := withRemote(t, e)
	a := e.NewPod()
	e.CleanupDel(a, "remote-udp")
	const rate = 20e6
	ra, err := e.AddBW(a, "remote-udp", bandwidthArgs(rate, 0))
	if err != nil {
		t.Fatal(err)
	}
	a4, _ := testenv.PodIPs(t, ra)
	// Three times the rate, spread out: a burst the sender's own buffers
	// dropped would prove nothing about the pod's limit.
	const sendFor = 2 * time.Second
	sent, got := udpBlast(t, remote, a, a4, sendFor, 4*time.Second, 3*rate)
	// The rate, plus what the queue held when the sender stopped (its
	// capacity is at most 10 ms and the class's burst; 50 ms is generous).
	limit := rate/8*sendFor.Seconds() + rate/8*0.05
	t.Logf("sent %.2f MB, received %.2f MB, limit %.2f MB", float64(sent)/1e6, float64(got)/1e6, limit/1e6)
	if float64(sent) < 2*limit {
		t.Fatalf("the sender managed only %.2f MB: not enough to test the limit", float64(sent)/1e6)
	}
	if float64(got) > 1.05*limit {
		t.Errorf("received %d bytes in %v at %v bit/s: the limit did not hold", got, sendFor, rate)
	}
	if float64(got) < 0.8*rate/8*sendFor.Seconds() {
		t.Errorf("received only %d bytes of the %d the rate allows", got, int64(rate/8*sendFor.Seconds()))
	}
	_, idx := e.HostVeth("remote-udp")
	if c := counter(t, e.Maps(), idx, maps.DirIngress, maps.ReasonDropBandwidth); c.Packets == 0 {
		t.Errorf("drop_bandwidth counter did not move")
	}
	e.MustDel(a, "remote-udp")
	e.AssertClean()
}

// sockOpt returns an integer socket option of a connection.
func sockOpt(t *testing.T, c net.Conn, level, opt int) int {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

// acceptedFrom: a listener in dst on ip, a connection to it from src; returns
// the accepted end and the dialling end.
func acceptedFrom(t *testing.T, src, dst ns.NetNS, ip net.IP) (net.Conn, net.Conn) {
	t.Helper()
	var ln net.Listener
	if err := dst.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var c net.Conn
	if err := src.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, c
}

// sndWnd: the send window of c, in bytes: the last window its peer
// advertised.
func sndWnd(t *testing.T, c net.Conn) uint32 {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	var gerr error
	if err := raw.Control(func(fd uintptr) { info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return info.Snd_wnd
}

// TestBandwidthPodReceiveWindow: the TCP sockets of a pod with an ingress
// limit get their receive window clamped to about 2 ms of the rate towards
// peers the node does not pace (here the node's address stands for them),
// whether they accept or connect, and keep it through a transfer (the kernel
// lifts the clamp, the hook puts it back); the receive buffer is left to the
// kernel. Loopback connections inside the pod, connections with pods of the
// same node (paced, and outside the ingress queue) and pods without an
// ingress limit are not clamped.
func TestBandwidthPodReceiveWindow(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "rcvwnd")
	e.CleanupDel(b, "free")
	const rate = 100e6
	ra, err := e.AddBW(a, "rcvwnd", bandwidthArgs(rate, 0))
	if err != nil {
		t.Fatal(err)
	}
	rb, err := e.AddBW(b, "free", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	a4, _ := testenv.PodIPs(t, ra)
	b4, _ := testenv.PodIPs(t, rb)
	if err := a.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		t.Fatal(err)
	}
	clamp := func(c net.Conn) int { return sockOpt(t, c, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP) }
	const wnd = 100_000_000 / 8 * 2 / 1000 // 2 ms at 100 Mbit/s
	fromNode, nodeEnd := acceptedFrom(t, e.Node, a, a4)
	nodeAccepted, toNode := acceptedFrom(t, a, e.Node, testenv.NodeIP4)
	for what, c := range map[string]net.Conn{"accepted from the node": fromNode, "connected to the node": toNode} {
		if got := clamp(c); got != wnd {
			t.Errorf("limited pod, %s: TCP_WINDOW_CLAMP %d, want %d", what, got, wnd)
		}
	}
	// The window of the pod's SYN-ACK or SYN, as the node's end saw it
	// before any data: no larger than the clamp either (rounded up to the
	// window scale's unit, at most 1 KiB here).
	for what, c := range map[string]net.Conn{"SYN-ACK to the node": nodeEnd, "SYN to the node": nodeAccepted} {
		if got := sndWnd(t, c); got == 0 || got > wnd+1024 {
			t.Errorf("limited pod, window of its %s: %d, want at most %d", what, got, wnd+1024)
		}
	}
	// 4 MB through the accepted connection: the kernel lifts the clamp on
	// the first full segment and, in the reader's recvmsg, as it grows the
	// buffer; the hook puts it back before the window of each segment the
	// pod sends is filled in. So what holds is the window advertised, not
	// the socket's clamp between two segments (CI once read it right after
	// the last read had lifted it: 204965).
	go func() {
		buf := make([]byte, 64<<10)
		for i := 0; i < 64; i++ {
			if _, err := nodeEnd.Write(buf); err != nil {
				return
			}
		}
		nodeEnd.(*net.TCPConn).CloseWrite()
	}()
	fromNode.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := io.Copy(io.Discard, fromNode); err != nil || n != 4<<20 {
		t.Fatalf("transfer into the limited pod: %d bytes, %v", n, err)
	}
	if got := sndWnd(t, nodeEnd); got == 0 || got > wnd+1024 {
		t.Errorf("limited pod, last window advertised after 4 MB from the node: %d, want at most %d", got, wnd+1024)
	}
	// One segment from the pod after its last read: the clamp is back.
	nodeEnd.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := fromNode.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(nodeEnd, make([]byte, 1)); err != nil {
		t.Fatalf("a byte from the limited pod to the node: %v", err)
	}
	if got := clamp(fromNode); got != wnd {
		t.Errorf("limited pod, after 4 MB from the node and a segment of its own: TCP_WINDOW_CLAMP %d, want %d", got, wnd)
	}
	if got := sockOpt(t, fromNode, unix.SOL_SOCKET, unix.SO_RCVBUF); got < 64<<10 {
		t.Errorf("limited pod, after 4 MB from the node: SO_RCVBUF %d: the buffer is the kernel's to size", got)
	}
	fromPod, _ := acceptedFrom(t, b, a, a4)
	_, toPod := acceptedFrom(t, a, b, b4)
	loopS, loopC := acceptedFrom(t, a, a, net.ParseIP("127.0.0.1"))
	free, _ := acceptedFrom(t, a, b, b4)
	for what, c := range map[string]net.Conn{
		"limited pod, accepted from a pod of the node": fromPod, "limited pod, connected to a pod of the node": toPod,
		"limited pod, loopback accepted": loopS, "limited pod, loopback connected": loopC,
		"unlimited pod, accepted from the limited one": free,
	} {
		// A fresh connection's own clamp is about 64 KiB, the initial window.
		if got := clamp(c); got <= 2*wnd {
			t.Errorf("%s: TCP_WINDOW_CLAMP %d, want the kernel's (over %d)", what, got, 2*wnd)
		}
	}
	e.MustDel(a, "rcvwnd")
	e.MustDel(b, "free")
	e.AssertClean()
}

// TestBandwidthCheckQueue: CHECK sees an ingress queue that lost its rate or
// vanished, and a queue where no ingress limit is configured.
func TestBandwidthCheckQueue(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a := e.NewPod()
	e.CleanupDel(a, "chkq")
	bw := bandwidthArgs(10e6, 0)
	if _, err := e.AddBW(a, "chkq", bw); err != nil {
		t.Fatal(err)
	}
	if err := e.CheckBW(a, "chkq", bw); err != nil {
		t.Fatalf("CHECK right after ADD: %v", err)
	}
	hostIf, idx := e.HostVeth("chkq")
	class := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: idx, Parent: netlink.MakeHandle(1, 0), Handle: netlink.MakeHandle(1, 0x10)},
		netlink.HtbClassAttrs{Rate: 5e6, Ceil: 5e6, Quantum: 60000})
	if err := e.InNode(func() error { return netlink.ClassChange(class) }); err != nil {
		t.Fatalf("change the class of %s: %v", hostIf, err)
	}
	if err := e.CheckBW(a, "chkq", bw); err == nil || !strings.Contains(err.Error(), "htb class 1:10") {
		t.Errorf("CHECK with the queue at another rate: %v", err)
	}
	// The limit without the queue is refused too: the bucket expects it.
	err := e.InNode(func() error {
		return netlink.QdiscDel(&netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(1, 0)}, QdiscType: "htb"})
	})
	if err != nil {
		t.Fatalf("delete the queue of %s: %v", hostIf, err)
	}
	if err := e.CheckBW(a, "chkq", bw); err == nil || !strings.Contains(err.Error(), "lost its ingress queue") {
		t.Errorf("CHECK with the queue gone: %v", err)
	}
	e.MustDel(a, "chkq")
	e.AssertClean()
}
