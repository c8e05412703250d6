// attack13: the "no per-pod tables" flag against concurrent ADDs and DELs
// on a full pool, with the agent's full pass (SyncNoParts) racing them.

package integration

import (
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestStackFlowNoPartsRace: both pool slots held (b and lo), so every ADD
// makes a table of its own. Four workers ADD and DEL their own pods in a
// loop (DEL of the last table racing another's ADD) while a fifth runs
// SyncNoParts as the agent's full pass does. Whenever the loops stop, the
// flag must say exactly whether cni_stack_flow_parts holds a table; then a
// pod left with a table must get its Service replies through it.
func TestStackFlowNoPartsRace(t *testing.T) {
	t.Parallel()
	l := newFullPoolLab(t)
	stop := make(chan struct{})
	var syncWG sync.WaitGroup
	untilStop(stop, &syncWG, func() bool {
		if err := l.m.StackFlows().SyncNoParts(); err != nil {
			t.Error(err)
			return false
		}
		return true
	})
	churn(t, l, 4, "r").Wait()
	close(stop)
	syncWG.Wait()
	parts := tablesOf(t, l)
	l.wantNoParts(t, len(parts) == 0, fmt.Sprintf("after the race (tables of %v)", parts))

	// One pod left with a table, ADDed while the full pass runs.
	stop2 := make(chan struct{})
	untilStop(stop2, &syncWG, func() bool { l.m.StackFlows().SyncNoParts(); return true })
	a, _ := l.e.RunPod("a")
	close(stop2)
	syncWG.Wait()
	_, aIdx := l.e.HostVeth("a")
	l.wantNoParts(t, false, "with a's own table")
	l.exchangeBoth(t, a)
	l.wantOwnRecords(t, aIdx, "a's Service flows")
}

// newFullPoolLab is a poolLab on a node of 6 attachments whose pool
// slots but b's are all held: every ADD from here makes a table of its own.
func newFullPoolLab(t *testing.T) *poolLab {
	l := newPoolLabN(t, 5)
	fillPool(t, l)
	return l
}

// churn starts workers that each ADD and DEL a pod of their own six
// times (ids prefix<worker>-<i>); wait on the group it returns.
func churn(t *testing.T, l *poolLab, workers int, prefix string) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		p := l.e.NewPod()
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 6; i++ {
				id := fmt.Sprintf("%s%d-%d", prefix, w, i)
				if _, err := l.e.AddV("1.1.0", p, id, "eth0"); err != nil {
					t.Errorf("ADD %s: %v", id, err)
					return
				}
				if err := l.e.Del(p, id, "eth0"); err != nil {
					t.Errorf("DEL %s: %v", id, err)
					return
				}
			}
		}(w)
	}
	return &wg
}

// untilStop runs f in a goroutine of wg again and again until stop is
// closed or f returns false.
func untilStop(stop <-chan struct{}, wg *sync.WaitGroup, f func() bool) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if !f() {
				return
			}
		}
	}()
}

// runPod runs pod name and returns it with its host veth's ifindex.
func (l *poolLab) runPod(name string) (ns.NetNS, int) {
	p, _ := l.e.RunPod(name)
	_, idx := l.e.HostVeth(name)
	return p, idx
}

// wantOwnRecords: the flows of what left one record per family (two at
// least) in the table of the pod of ifindex idx.
func (l *poolLab) wantOwnRecords(t *testing.T, idx int, what string) {
	t.Helper()
	rs, err := mapstest.PartRecords(l.m, idx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) < 2 {
		t.Errorf("%s left %d records in its own table, want one per family", what, len(rs))
	}
}

// fillPool gives every pool slot but b's to a live veth of the
// node: every ADD from here makes a table of its own.
func fillPool(t *testing.T, l *poolLab) {
	t.Helper()
	slots := mapstest.Map(l.m, "cni_sf_slots")
	pool := mapstest.Map(l.m, "cni_sf_pool")
	bSlot := l.slot(t, l.bIdx)
	for s := uint32(1); s <= pool.MaxEntries(); s++ {
		if s == bSlot {
			continue
		}
		var idx int
		err := l.e.Node.Do(func(ns.NetNS) error {
			name := fmt.Sprintf("fill%d", s)
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
				return err
			}
			lk, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			idx = lk.Attrs().Index
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		k, v := uint32(idx), s
		if err := slots.Update(&k, &v, 0); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { slots.Delete(&k) })
	}
}

// tablesOf lists the keys of cni_stack_flow_parts (tables only, no slots).
func tablesOf(t *testing.T, l *poolLab) []uint32 {
	t.Helper()
	var out []uint32
	var k, v uint32
	it := mapstest.Map(l.m, "cni_stack_flow_parts").Iterate()
	for it.Next(&k, &v) {
		out = append(out, k)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestStackFlowNoPartsAgentRestart: with an agent, an ADD on a full pool
// leaves the pod's table to it. Pod a is ADDed, the agent killed (SIGKILL)
// and started again while a's Service flows run; pod c is ADDed with no
// agent (its ADD makes the table), then DELed. Each time the flag must
// match the tables, and a's Service replies must keep reaching it.
func TestStackFlowNoPartsAgentRestart(t *testing.T) {
	t.Parallel()
	l := newFullPoolLab(t)
	conf := l.e.WriteConfDir()
	ag := l.e.StartAgent(conf, "--metrics-addr", "")
	a, aIdx := l.runPod("a")
	l.exchangeBoth(t, a)
	deadline := time.Now().Add(20 * time.Second)
	for !slices.Contains(tablesOf(t, l), uint32(aIdx)) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent gave a (ifindex %d) no table: tables %v", aIdx, tablesOf(t, l))
		}
		time.Sleep(50 * time.Millisecond)
	}
	l.wantNoParts(t, false, "with a's table made by the agent")
	l.exchangeBoth(t, a)
	ag.Cmd.Process.Signal(syscall.SIGKILL)
	ag.Exited(10 * time.Second)
	l.exchangeBoth(t, a)
	c, cIdx := l.runPod("c")
	l.exchangeBoth(t, c)
	ag = l.e.StartAgent(conf, "--metrics-addr", "")
	time.Sleep(2 * time.Second)
	l.wantNoParts(t, false, fmt.Sprintf("after the agent's restart (tables %v, a %d, c %d)", tablesOf(t, l), aIdx, cIdx))
	l.exchangeBoth(t, a)
	if err := l.e.Del(c, "c", "eth0"); err != nil {
		t.Fatal(err)
	}
	l.wantNoParts(t, false, "after c's DEL (a's table stands)")
	l.exchangeBoth(t, a)
	l.wantOwnRecords(t, aIdx, "a's Service flows")
	if err := l.e.Del(a, "a", "eth0"); err != nil {
		t.Fatal(err)
	}
	l.wantNoParts(t, len(tablesOf(t, l)) == 0, fmt.Sprintf("after a's DEL (tables %v)", tablesOf(t, l)))
	ag.Stop()
}

// TestStackFlowNoPartsOlderBuildTable: the window upgrade.md admits: an
// older build's ADD (round 10, per-pod tables, no flag) puts pod a's table
// in while the flag says "no tables". a's Service replies must still reach
// it (its records go to the shared table while the flag stands), through
// the agent's full pass (SyncNoParts) that clears the flag, and after it.
func TestStackFlowNoPartsOlderBuildTable(t *testing.T) {
	t.Parallel()
	l := newFullPoolLab(t)
	a, aIdx := l.runPod("a")
	// As the older build left it: a's own table gone, the flag set, then
	// its table put in without clearing it.
	if err := l.m.StackFlows().SyncNoParts(); err != nil {
		t.Fatal(err)
	}
	outer := mapstest.Map(l.m, "cni_stack_flow_parts")
	k := uint32(aIdx)
	if err := outer.Delete(&k); err != nil {
		t.Fatal(err)
	}
	if err := l.m.StackFlows().SyncNoParts(); err != nil {
		t.Fatal(err)
	}
	l.wantNoParts(t, true, "with a's table taken out")
	inner, err := ebpf.NewMap(&ebpf.MapSpec{Name: "cni_sf_part", Type: ebpf.LRUHash, KeySize: 40, ValueSize: 16, MaxEntries: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	if err := outer.Update(&k, inner, 0); err != nil {
		t.Fatal(err)
	}
	l.wantNoParts(t, true, "the older build's put (the window)")
	l.exchangeBoth(t, a)
	if err := l.m.StackFlows().SyncNoParts(); err != nil {
		t.Fatal(err)
	}
	l.wantNoParts(t, false, "after the agent's full pass")
	l.exchangeBoth(t, a)
	l.wantOwnRecords(t, aIdx, "after the full pass a's Service flows")
	outer.Delete(&k)
}

// TestStackFlowNoPartsKilledAdd: on a full pool, agent-less ADDs killed by
// SIGKILL at each step after the table's making began (its goroutine runs
// beside the ADD: killed before, between or after the clear and the put):
// the flag never says "no tables" while one is there, the runtime's DEL
// leaves it matching the tables, and a pod ADDed after gets its Service
// replies through its own table.
func TestStackFlowNoPartsKilledAdd(t *testing.T) {
	t.Parallel()
	bin := crashBinary(t)
	l := newFullPoolLab(t)
	e := l.e
	for i, step := range []string{"endpoints", "host", "pod", "recorded", "endpoints", "host"} {
		pod := e.NewPod()
		id := fmt.Sprintf("crash%d", i)
		envv := pluginEnv("ADD", id, pod, "eth0")
		envv["EBPF_CNI_CRASH_AT"] = step
		out, err := e.RunPlugin(bin, envv, e.StdinConf(nil))
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("ADD with EBPF_CNI_CRASH_AT=%s: %v, want killed by SIGKILL; stdout %s", step, err, out)
		}
		tabs := tablesOf(t, l)
		t.Logf("killed at %s: tables %v", step, tabs)
		if flag, err := mapstest.NoPartsFlag(l.m); err != nil {
			t.Fatal(err)
		} else if flag && len(tabs) > 0 {
			t.Errorf("killed at %s: HP_CFG_SF_NO_PARTS set with tables %v", step, tabs)
		}
		e.CleanupBy(t, "DEL", id, pod, testenv.BinDir)
		tabs = tablesOf(t, l)
		l.wantNoParts(t, len(tabs) == 0, fmt.Sprintf("after the DEL of the ADD killed at %s (tables %v)", step, tabs))
	}
	a, aIdx := l.runPod("a")
	l.wantNoParts(t, false, "with a's table")
	l.exchangeBoth(t, a)
	l.wantOwnRecords(t, aIdx, "a's Service flows")
}

// TestStackFlowNoPartsStaysClear: pod s keeps a table of its own on a full
// pool while three workers ADD and DEL pods with tables (each DEL drops a
// table and runs SyncNoParts) and the full pass runs beside them: the
// flag must never be seen set (s's table is always there), and s's
// Service flows, run throughout, are answered and recorded in its table.
func TestStackFlowNoPartsStaysClear(t *testing.T) {
	t.Parallel()
	l := newFullPoolLab(t)
	s, sIdx := l.runPod("s")
	stop := make(chan struct{})
	var bg sync.WaitGroup
	seen := 0
	untilStop(stop, &bg, func() bool { l.m.StackFlows().SyncNoParts(); return true })
	untilStop(stop, &bg, func() bool {
		if set, err := mapstest.NoPartsFlag(l.m); err == nil && set {
			seen++
		}
		return true
	})
	wg := churn(t, l, 3, "q")
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	rounds := 0
	for loop := true; loop; {
		select {
		case <-done:
			loop = false
		default:
			l.exchangeBoth(t, s)
			rounds++
		}
	}
	close(stop)
	bg.Wait()
	if seen > 0 {
		t.Errorf("HP_CFG_SF_NO_PARTS seen set %d times while s's table stood", seen)
	}
	t.Logf("%d rounds of s's Service flows during the churn", rounds)
	l.wantOwnRecords(t, sIdx, "s's Service flows")
}
