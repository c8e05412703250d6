//go:build progcost

package integration

import (
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestProgCost measures what the host-veth programs cost per run (the
// kernel's BPF run-time statistics: run_time_ns / run_cnt) on two paths: a
// TCP stream pod to pod (from_container's redirect with
// bpf_redirect_peer) and node to pod (the stack delivers, to_container
// runs). A measurement, not a test: built only with -tags progcost
// (go test -tags progcost -run TestProgCost -v ./test/), so the suite never
// skips it. Issue 12 used it to price the MAC learning and the router
// message check against e383872.
func TestProgCost(t *testing.T) {
	const rounds, secs = 5, 3
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "cost-a")
	e.CleanupDel(b, "cost-b")
	e.Add(a, "cost-a")
	rb := e.Add(b, "cost-b")
	b4, _ := testenv.PodIPs(t, rb)

	st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("BPF_ENABLE_STATS: %v", err)
	}
	defer st.Close()
	progs := map[string]*ebpf.Program{}
	for _, en := range datapath.ProgramPins(e.PinDir) {
		for _, want := range []string{"cni_from_container", "cni_to_container"} {
			if strings.HasPrefix(en.Name, want) {
				p, err := ebpf.LoadPinnedProgram(en.Path, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				progs[want] = p
			}
		}
	}
	snap := func() map[string]ebpf.ProgramStats {
		out := map[string]ebpf.ProgramStats{}
		for n, p := range progs {
			s, err := p.Stats()
			if err != nil {
				t.Fatal(err)
			}
			out[n] = *s
		}
		return out
	}
	results := map[string][]float64{}
	for _, path := range []struct {
		name     string
		src, dst ns.NetNS
	}{{"pod to pod", a, b}, {"node to pod", e.Node, b}} {
		for r := 0; r < rounds; r++ {
			before := snap()
			if err := stream(path.src, path.dst, b4, secs*time.Second); err != nil {
				t.Fatalf("%s: %v", path.name, err)
			}
			after := snap()
			for n := range progs {
				runs := after[n].RunCount - before[n].RunCount
				if runs == 0 {
					continue
				}
				ns := float64(after[n].Runtime-before[n].Runtime) / float64(runs)
				key := path.name + " / " + n
				results[key] = append(results[key], ns)
			}
		}
	}
	var keys []string
	for k := range results {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := results[k]
		sort.Float64s(v)
		t.Logf("%-40s median %.0f ns/run (min %.0f, max %.0f, %d rounds of %d s)", k, v[len(v)/2], v[0], v[len(v)-1], len(v), secs)
	}
	e.MustDel(a, "cost-a")
	e.MustDel(b, "cost-b")
}

// stream sends TCP data from src to a listener in dst for d.
func stream(src, dst ns.NetNS, ip net.IP, d time.Duration) error {
	var ln net.Listener
	if err := dst.Do(func(ns.NetNS) (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
		return err
	}); err != nil {
		return err
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(io.Discard, c)
		done <- err
	}()
	err := src.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		buf := make([]byte, 64<<10)
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			if _, err := c.Write(buf); err != nil {
				c.Close()
				return err
			}
		}
		return c.Close()
	})
	if err != nil {
		return fmt.Errorf("stream to %s: %w", ip, err)
	}
	return <-done
}

// TestVerbLatency measures ADD and DEL through libcni (the exec included),
// one pod at a time on a node with 10 other pods: what the record
// claim, directory checks, host veth alias, per-interface table and rules
// and the pod-side DEL cost. Medians of n.
func TestVerbLatency(t *testing.T) {
	const n = 30
	e := testenv.New(t)
	for i := 0; i < 10; i++ {
		id := fmt.Sprintf("bystander-%d", i)
		p := e.NewPod()
		e.CleanupDel(p, id)
		e.Add(p, id)
	}
	var adds, dels []float64
	for i := 0; i < n; i++ {
		p := e.NewPod()
		id := fmt.Sprintf("lat-%d", i)
		start := time.Now()
		e.Add(p, id)
		adds = append(adds, float64(time.Since(start).Microseconds())/1000)
		start = time.Now()
		e.MustDel(p, id)
		dels = append(dels, float64(time.Since(start).Microseconds())/1000)
	}
	for _, c := range []struct {
		name string
		v    []float64
	}{{"ADD", adds}, {"DEL", dels}} {
		sort.Float64s(c.v)
		t.Logf("%s: median %.1f ms (p10 %.1f, p90 %.1f, n %d)", c.name, c.v[n/2], c.v[n/10], c.v[n*9/10], n)
	}
}
