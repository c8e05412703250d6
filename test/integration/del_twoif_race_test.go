// Two interfaces of one pod DELed at the same time: the pod's netns entry
// (cni_netns, keyed by the netns cookie) is the pod's, not an interface's;
// the last DEL removes it, even when the two DELs run side by side.

package integration

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestDelTwoIfConcurrentNetnsEntry: a pod with eth0 and net1 (two ADDs of
// one network, one netns), both DELed at once, no agent: each DEL
// succeeds, and no cni_netns entry of the pod's netns cookie is left.
// Thirty rounds: the two DELs' looks at the pod's interfaces must both
// come before either veth goes, which 4 of 30 rounds did before the
// netns lock (each DEL saw the other interface and kept the entry).
func TestDelTwoIfConcurrentNetnsEntry(t *testing.T) {
	e := testenv.New(t)
	const rounds = 30
	left := 0
	var took []time.Duration // of each round's two DELs
	for round := 0; round < rounds; round++ {
		pod := podWithLoUp(t, e) // DEL parks the pod's nexthops between its look and its veth's deletion
		id := testenv.RandName("twoif")
		ifs := []string{"eth0", "net1"}
		for _, ifn := range ifs {
			t.Cleanup(func() { _ = e.Del(pod, id, ifn) })
			if _, err := a22Add(e, pod, id, ifn); err != nil {
				t.Fatalf("round %d: ADD %s: %v", round, ifn, err)
			}
		}
		cookie := e.NetnsCookieOf(pod)
		m := e.Maps()
		if _, err := testenv.LookupNetns(m, cookie); err != nil {
			t.Fatalf("round %d: the pod's netns (cookie %d) has no cni_netns entry after both ADDs: %v", round, cookie, err)
		}
		errs := make([]error, len(ifs))
		start := time.Now()
		var wg sync.WaitGroup
		for i, ifn := range ifs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = e.Del(pod, id, ifn) }()
		}
		wg.Wait()
		took = append(took, time.Since(start))
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d: DEL %s: %v", round, ifs[i], err)
			}
		}
		if v, err := testenv.LookupNetns(m, cookie); err == nil {
			left++
			t.Errorf("round %d: the cni_netns entry of the pod's netns (cookie %d) is left after both DELs: %+v", round, cookie, v)
			_ = m.Bandwidth().DeleteNetns(cookie) // the next round starts clean
		}
	}
	slices.Sort(took)
	t.Logf("%d of %d rounds left the entry; the two DELs took %v (median), %v (max)", left, rounds, took[len(took)/2], took[len(took)-1])
	e.AssertClean()
}
