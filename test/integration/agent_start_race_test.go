// A pod ADDed right after (or while) ebpf-agent starts is moved to tcx
// promptly, not at the minute's full pass (the bench saw one pod of a
// freshly started agent still on cls_bpf 60 s after its ADD).

package integration

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// startMoveBound is how long a new pod may wait for tcx: the agent moves
// it after its ADD in milliseconds; the minute's full pass is far off.
const startMoveBound = 5 * time.Second

// startRaceFor is how long the test starts agents for.
var startRaceFor = 40 * time.Second

// addAll ADDs the pods (IDs ids) at once and fails on any error.
func addAll(t *testing.T, e *testenv.Env, pods []ns.NetNS, ids []string) {
	t.Helper()
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.AddV("1.1.0", pods[i], ids[i], "eth0")
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ADD %s: %v", ids[i], err)
		}
	}
}

// waitAllTCX fails unless each pod's host veth is on tcx within the bound.
func waitAllTCX(t *testing.T, e *testenv.Env, what string, ids []string, a *testenv.AgentProc) {
	t.Helper()
	start := time.Now()
	for _, id := range ids {
		h, _ := e.HostVeth(id)
		for {
			st := e.AttachState(h)
			if st == datapath.StateTCX {
				break
			}
			if time.Since(start) > startMoveBound {
				t.Fatalf("%s: pod %s (%s) is %q %s after its ADD, want %q\nagent log:\n%s", what, id, h, st, startMoveBound, datapath.StateTCX, a.Logs())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// startRaceRound is one node: an agent started (with extra flags), pods
// ADDed as the variant says, each asserted on tcx within the bound.
func startRaceRound(t *testing.T, variant string, extra ...string) {
	var e *testenv.Env
	args := []string{"--metrics-addr", ""}
	if variant == "tunnel" { // the bench's node: VXLAN, hybrid, a peers file
		lab := newTunLab(t)
		e = lab.nodes[0]
		args = append(append(args, lab.agentArgs(e)...), "--tunnel", "vxlan", "--tunnel-hybrid")
	} else {
		e = testenv.New(t)
	}
	confDir := e.WriteConfDir()
	var pods []ns.NetNS
	var ids []string
	for i := range 3 {
		p := e.NewPod()
		id := fmt.Sprintf("%s%d", variant, i)
		e.CleanupDel(p, id)
		pods, ids = append(pods, p), append(ids, id)
	}
	args = append(args, extra...)
	switch variant {
	case "ready": // one pod as soon as the agent says ready
		a := e.StartAgent(confDir, args...)
		addAll(t, e, pods[:1], ids[:1])
		waitAllTCX(t, e, variant, ids[:1], a)
	case "tunnel": // as the bench's cycles: ADD, on tcx, DEL, reaped, again
		a := e.StartAgent(confDir, args...)
		for i := range 3 {
			addAll(t, e, pods[i:i+1], ids[i:i+1])
			waitAllTCX(t, e, variant, ids[i:i+1], a)
			if err := e.Del(pods[i], ids[i], "eth0"); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		}
	case "several": // three at once, right at ready
		a := e.StartAgent(confDir, args...)
		addAll(t, e, pods, ids)
		waitAllTCX(t, e, variant, ids, a)
	case "starting": // ADDs while the agent is still starting
		var a *testenv.AgentProc
		done := make(chan struct{})
		go func() { defer close(done); a = e.StartAgent(confDir, args...) }()
		addAll(t, e, pods[:2], ids[:2])
		<-done
		if a == nil {
			t.FailNow()
		}
		waitAllTCX(t, e, variant, ids[:2], a)
	case "firstpass": // pods for the first full pass, then one ADD during it
		addAll(t, e, pods[:2], ids[:2])
		a := e.StartAgent(confDir, args...)
		addAll(t, e, pods[2:], ids[2:])
		waitAllTCX(t, e, variant, ids, a)
	case "readd": // DEL and ADD of the same container right at ready
		addAll(t, e, pods[:1], ids[:1])
		a := e.StartAgent(confDir, args...)
		if err := e.Del(pods[0], ids[0], "eth0"); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		addAll(t, e, pods[:1], ids[:1])
		waitAllTCX(t, e, variant, ids[:1], a)
		if err := e.Del(pods[0], ids[0], "eth0"); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		addAll(t, e, pods[:1], ids[:1])
		waitAllTCX(t, e, variant+" again", ids[:1], a)
	}
}

// TestAgentStartRaceMovesToTCX: pods ADDed as the agent becomes ready,
// while it starts, during its first full pass, several at once, and a
// DEL+ADD of one container, are each on tcx within a few seconds, over
// many agent starts (two nodes at a time: the -parallel default on
// two CPUs), with the tests' polite wait
// and the default one (the bench's).
func TestAgentStartRaceMovesToTCX(t *testing.T) {
	variants := []string{"ready", "starting", "firstpass", "several", "readd", "tunnel"}
	deadline := time.Now().Add(startRaceFor)
	var mu sync.Mutex
	n := 0
	const streams = 2
	for w := range streams {
		t.Run(fmt.Sprint("stream", w), func(t *testing.T) {
			t.Parallel()
			for i := w; time.Now().Before(deadline) || i < len(variants); i += streams {
				v := variants[i%len(variants)]
				var extra []string
				if i%2 == 1 {
					extra = []string{"--polite-wait", "5s"}
				}
				if !t.Run(fmt.Sprintf("%d-%s", i, v), func(t *testing.T) { startRaceRound(t, v, extra...) }) {
					t.Logf("stopped at round %d", i)
					return
				}
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	t.Cleanup(func() { t.Logf("%d agent starts", n) })
}
