//go:build hookbench

// What detaching the node hooks with their last user would cost the next
// ADD that needs them (docs/uninstall.md, "Node hooks stay"): run with
//
//	go test -tags hookbench -count=1 -v -run TestNodeHooksReattachCost ./test/integration/

package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestNodeHooksReattachCost: without an agent, a hostPort ADD on a node
// whose hooks are attached (idle) against one whose hooks the last DEL
// detached (the alternative to keeping them): rounds interleaved, medians
// logged, and every ADD proven by a hostPort connection from the remote host.
func TestNodeHooksReattachCost(t *testing.T) {
	const rounds = 15
	e := newHPEnv(t)
	cg := filepath.Join("/sys/fs/cgroup/unified", testenv.RandName("ebpf-cni-test-"))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(cg) })
	e.Extra["cgroupRoot"] = cg
	pm := testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}
	pod := e.NewPod()
	serve(t, pod, 80, "web")
	add := func(id string) time.Duration {
		start := time.Now()
		if _, err := e.AddHP(pod, id, pm); err != nil {
			t.Fatalf("ADD %s: %v", id, err)
		}
		d := time.Since(start)
		expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "web")
		e.MustDel(pod, id)
		return d
	}
	add("warm") // loads and pins the datapath and attaches the hooks once
	var kept, reattached, detach []time.Duration
	for i := 0; i < rounds; i++ {
		kept = append(kept, add(fmt.Sprintf("kept%d", i)))
		start := time.Now()
		rs, err := datapath.DetachNodeHooks(e.PinDir)
		detach = append(detach, time.Since(start))
		if err != nil || len(rs) == 0 {
			t.Fatalf("detach node hooks: %v (%d detached)", err, len(rs))
		}
		reattached = append(reattached, add(fmt.Sprintf("re%d", i)))
	}
	med := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	idleCost(t, e)
	t.Logf("hostPort ADD, %d rounds, medians: hooks kept %v, hooks re-attached %v (+%v); detaching them (in the last DEL) %v",
		rounds, med(kept), med(reattached), med(reattached)-med(kept), med(detach))
}

// idleCost is what the idle hooks (no pod left) cost the node's own
// traffic: a TCP transfer from the remote host to a node socket and back
// passes the uplink programs and the socket hooks; the kernel's BPF
// run-time statistics give each program's runs and time.
func idleCost(t *testing.T, e *hpEnv) {
	st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("enable BPF stats: %v", err)
	}
	defer st.Close()
	ids := e.NodeHookProgIDs()
	snap := func() map[string]ebpf.ProgramStats {
		out := map[string]ebpf.ProgramStats{}
		for name, id := range ids {
			p, err := ebpf.NewProgramFromID(id)
			if err != nil {
				t.Fatal(err)
			}
			s, err := p.Stats()
			p.Close()
			if err != nil {
				t.Fatal(err)
			}
			out[name] = *s
		}
		return out
	}
	const bytes = 64 << 20
	before := snap()
	start := time.Now()
	for _, ip := range []net.IP{uplinkIP4, uplinkIP6} {
		if err := testenv.TCPTransfer(e.remote, e.Node, ip, bytes); err != nil {
			t.Fatalf("remote to node %s: %v", ip, err)
		}
	}
	wall := time.Since(start)
	after := snap()
	var names []string
	for n := range after {
		names = append(names, n)
	}
	sort.Strings(names)
	var total time.Duration
	for _, n := range names {
		runs := after[n].RunCount - before[n].RunCount
		rt := after[n].Runtime - before[n].Runtime
		total += rt
		if runs > 0 {
			t.Logf("idle hook %-22s %7d runs, %4.0f ns/run", n, runs, float64(rt)/float64(runs))
		}
	}
	t.Logf("idle hooks: %v of BPF run time for 2 x %d MiB of node traffic through the uplink (%v wall)", total, bytes>>20, wall)
}
