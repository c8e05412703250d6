// Bandwidth limits: TCP and UDP held to the rate, CHECK and the dump, bad values.

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// containerdBurst is what containerd 1.6 passes as burst whatever the rate.
const containerdBurst = 4294967295

// bandwidthArgs is the runtime's bandwidth capability in bits/s and bits.
func bandwidthArgs(ingressRate, egressRate uint64) map[string]any {
	bw := map[string]any{}
	if ingressRate > 0 {
		bw["ingressRate"], bw["ingressBurst"] = ingressRate, containerdBurst
	}
	if egressRate > 0 {
		bw["egressRate"], bw["egressBurst"] = egressRate, containerdBurst
	}
	return bw
}

// tcpRate streams from src to a listener in dst for about d and returns the
// goodput in bits per second as the receiver saw it.
func tcpRate(t *testing.T, src, dst ns.NetNS, ip net.IP, d time.Duration) float64 {
	t.Helper()
	var ln net.Listener
	if err := dst.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
		return err
	}); err != nil {
		t.Fatalf("listen on %s: %v", ip, err)
	}
	defer ln.Close()
	type result struct {
		n        int64
		duration time.Duration
		err      error
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
		start := time.Now()
		n, err := io.Copy(io.Discard, c)
		done <- result{n, time.Since(start), err}
	}()
	err := src.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
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
		return nil
	})
	if err != nil {
		t.Fatalf("stream to %s: %v", ip, err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("receive from stream to %s: %v", ip, r.err)
	}
	return float64(r.n*8) / r.duration.Seconds()
}

func assertRate(t *testing.T, what string, got, want float64) {
	t.Helper()
	// Tight enough that a missing limiter (gigabits) or a starving one fails.
	if got < 0.85*want || got > 1.10*want {
		t.Errorf("%s: %.1f Mbit/s, want %.1f Mbit/s (-15%%/+10%%)", what, got/1e6, want/1e6)
	} else {
		t.Logf("%s: %.1f Mbit/s (limit %.1f)", what, got/1e6, want/1e6)
	}
}

// TestBandwidthTCP: one TCP stream in each direction, through every path a
// pod's traffic takes (pod to pod by redirect, node to pod, pod to node), gets
// its limit, with the absurd burst containerd sends.
func TestBandwidthTCP(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "limited")
	e.CleanupDel(b, "free")
	const egress, ingress = 40e6, 20e6
	ra, err := e.AddBW(a, "limited", bandwidthArgs(ingress, egress))
	if err != nil {
		t.Fatalf("ADD with bandwidth: %v", err)
	}
	rb, err := e.AddBW(b, "free", map[string]any{})
	if err != nil {
		t.Fatalf("ADD without limits: %v", err)
	}
	a4, a6 := testenv.PodIPs(t, ra)
	b4, _ := testenv.PodIPs(t, rb)

	d := 2 * time.Second
	assertRate(t, "pod to pod, egress limit", tcpRate(t, a, b, b4, d), egress)
	assertRate(t, "pod to pod, ingress limit", tcpRate(t, b, a, a4, d), ingress)
	assertRate(t, "node to pod, ingress limit", tcpRate(t, e.Node, a, a4, d), ingress)
	assertRate(t, "node to pod over IPv6, ingress limit", tcpRate(t, e.Node, a, a6, d), ingress)
	assertRate(t, "pod to node, egress limit", tcpRate(t, a, e.Node, testenv.NodeIP4, d), egress)
	// The unlimited pod is not held back by its neighbour's limits.
	if got := tcpRate(t, e.Node, b, b4, time.Second); got < 4*egress {
		t.Errorf("unlimited pod got only %.1f Mbit/s", got/1e6)
	}

	e.MustDel(a, "limited")
	e.MustDel(b, "free")
	e.AssertClean()
}

// TestBandwidthUDPIsPoliced: UDP has no pacing; the token bucket drops what
// exceeds the rate and counts it.
func TestBandwidthUDPIsPoliced(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a := e.NewPod()
	e.CleanupDel(a, "udp")
	const rate = 20e6
	if _, err := e.AddBW(a, "udp", bandwidthArgs(0, rate)); err != nil {
		t.Fatal(err)
	}
	const sendFor = time.Second
	sent, got := udpBlast(t, a, e.Node, testenv.NodeIP4, sendFor, 3*time.Second, 0)
	limit := rate/8*sendFor.Seconds() + rate/8*0.05 // the rate plus the 50 ms bucket
	t.Logf("sent %.1f MB, received %.2f MB, limit %.2f MB", float64(sent)/1e6, float64(got)/1e6, limit/1e6)
	if float64(sent) < 2*limit {
		t.Fatalf("the sender managed only %.2f MB: not enough to test the limit", float64(sent)/1e6)
	}
	if float64(got) > 1.1*limit {
		t.Errorf("received %d bytes in %v at %v bit/s: the limit did not hold", got, sendFor, rate)
	}
	if float64(got) < 0.5*limit {
		t.Errorf("received only %d bytes of %d allowed", got, int64(limit))
	}
	_, idx := e.HostVeth("udp")
	if c := counter(t, e.Maps(), idx, maps.DirEgress, maps.ReasonDropBandwidth); c.Packets == 0 {
		t.Errorf("drop_bandwidth counter did not move")
	}
	e.MustDel(a, "udp")
	e.AssertClean()
}

// TestBandwidthCheckAndDump: CHECK sees a changed or missing limit; the agent
// shows the limits with the burst capped at 50 ms of the rate.
func TestBandwidthCheckAndDump(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a := e.NewPod()
	e.CleanupDel(a, "chk")
	bw := bandwidthArgs(10e6, 30e6)
	if _, err := e.AddBW(a, "chk", bw); err != nil {
		t.Fatal(err)
	}
	if err := e.CheckBW(a, "chk", bw); err != nil {
		t.Fatalf("CHECK right after ADD: %v", err)
	}

	var rows []inspect.BandwidthRow
	err := e.InNode(func() error {
		out, err := exec.Command(filepath.Join(testenv.BinDir, "ebpf-agent"), "dump", "bandwidth",
			"--pin-dir", e.PinDir, "--state-dir", e.StateDir, "-o", "json").Output()
		if err != nil {
			return err
		}
		return json.Unmarshal(out, &rows)
	})
	if err != nil {
		t.Fatalf("dump bandwidth: %v", err)
	}
	// The burst capped at 50 ms of the rate. Ingress also has a queue: its
	// capacity is 10 ms of the rate plus the class's burst, CE marks over 2
	// ms of backlog; the burst and the mark at least two full frames.
	want := map[string]inspect.BandwidthRow{
		"ingress": {RateBps: 10e6, BurstBits: 10e6 / 20, Queue: "htb", QueueNs: 10e6 + 2*1514*8*1e9/10e6, MarkNs: 2 * 1514 * 8 * 1e9 / 10e6},
		"egress":  {RateBps: 30e6, BurstBits: 30e6 / 20},
	}
	if len(rows) != 2 {
		t.Fatalf("dump has %d rows, want 2: %+v", len(rows), rows)
	}
	for _, r := range rows {
		w := want[r.Direction]
		if r.RateBps != w.RateBps || r.BurstBits != w.BurstBits || r.Queue != w.Queue || r.QueueNs != w.QueueNs || r.MarkNs != w.MarkNs || r.Container != "chk" {
			t.Errorf("dump row %+v, want rate %d burst %d queue %q %d ns mark %d ns", r, w.RateBps, w.BurstBits, w.Queue, w.QueueNs, w.MarkNs)
		}
	}

	m := e.Maps()
	_, idx := e.HostVeth("chk")
	if err := m.Bandwidth().PutLimit(idx, maps.DirEgress, maps.Limit{RateBps: 1e6, BurstBits: 5e4}); err != nil {
		t.Fatal(err)
	}
	if err := e.CheckBW(a, "chk", bw); err == nil || !strings.Contains(err.Error(), "cni_bandwidth") {
		t.Errorf("CHECK with a changed limit: %v", err)
	}
	if err := m.Bandwidth().DeleteLimits(idx); err != nil {
		t.Fatal(err)
	}
	if err := e.CheckBW(a, "chk", bw); err == nil || !strings.Contains(err.Error(), "no egress limit") {
		t.Errorf("CHECK with the limits gone: %v", err)
	}
	e.MustDel(a, "chk")
	e.AssertClean()
}

// TestBandwidthBadValues: every bad value is error 7 naming the field, and
// nothing is left behind.
func TestBandwidthBadValues(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	cases := []struct {
		name, bw, field string
	}{
		{"negative rate", `{"ingressRate":-1,"ingressBurst":100}`, "ingressRate"},
		{"burst without rate", `{"egressBurst":1000}`, "egressBurst"},
		{"beyond 64 bits", `{"egressRate":18446744073709551616,"egressBurst":1}`, "egressRate"},
		{"fraction", `{"egressRate":1.5,"egressBurst":1}`, "egressRate"},
		{"below minimum", `{"ingressRate":10,"ingressBurst":10}`, "ingressRate"},
		{"above maximum", `{"ingressRate":2000000000000,"ingressBurst":10}`, "ingressRate"},
		{"negative burst", `{"egressRate":1000000,"egressBurst":-5}`, "egressBurst"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pod := e.NewPod()
			conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"type":"ebpf-cni","pinDir":%q,"stateDir":%q,
				"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":%q}]]},
				"runtimeConfig":{"bandwidth":%s}}`, e.Name, e.PinDir, e.StateDir, e.DataDir, testenv.PodSubnet4, c.bw)
			out, err := e.ExecPlugin(map[string]string{
				"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "bad", "CNI_NETNS": pod.Path(),
				"CNI_IFNAME": "eth0", "CNI_PATH": testenv.BinDir,
			}, []byte(conf))
			if err == nil {
				t.Fatalf("ADD succeeded: %s", out)
			}
			te := testenv.PluginError(t, out)
			if te.Code != types.ErrInvalidNetworkConfig || !strings.Contains(te.Msg, c.field) {
				t.Fatalf("got code %d %q, want code 7 naming %s", te.Code, te.Msg, c.field)
			}
			e.AssertClean()
		})
	}
}

// TestReviewBandwidthBoundaries: the least and the greatest rates the plugin
// accepts, at the least and the greatest MTU, with the runtime's absurd
// burst: ADD installs them (queue included), CHECK passes, and the pod
// answers; DEL leaves nothing.
func TestReviewBandwidthBoundaries(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		rate uint64
		mtu  int
	}{{1_000, 1500}, {1_000, 9000}, {1_000, 65535}, {1_000_000_000_000, 1500}, {1_000_000_000_000, 65535}, {34_359_738_368, 1500}} {
		e := testenv.New(t)
		e.Extra = map[string]any{"mtu": c.mtu}
		pod := e.NewPod()
		id := testenv.RandName("bw")
		e.CleanupDel(pod, id)
		bw := map[string]any{"ingressRate": c.rate, "ingressBurst": uint64(4294967295), "egressRate": c.rate, "egressBurst": uint64(4294967295)}
		r, err := e.AddBW(pod, id, bw)
		if err != nil {
			t.Errorf("rate %d, mtu %d: ADD: %v", c.rate, c.mtu, err)
			continue
		}
		if err := e.CheckBW(pod, id, bw); err != nil {
			t.Errorf("rate %d, mtu %d: CHECK: %v", c.rate, c.mtu, err)
		}
		if c.rate > 1_000_000 {
			v4, _ := testenv.PodIPs(t, r)
			if err := testenv.Ping(e.Node, v4, 2); err != nil {
				t.Errorf("rate %d, mtu %d: ping: %v", c.rate, c.mtu, err)
			}
		}
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Errorf("rate %d, mtu %d: DEL: %v", c.rate, c.mtu, err)
		}
		e.AssertClean()
	}
}
