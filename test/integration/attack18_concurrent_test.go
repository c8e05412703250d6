package integration

import (
	"context"
	"strings"
	"sync"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack18ConcurrentDels: a pod with eth0, net1 and net2 (lo up); at
// once DEL of eth0, DEL of net1 and ADD of net3, as a runtime tearing down
// and setting up networks in parallel might: each parks and sweeps beside
// the other. net2 and net3 must work, nothing of eth0 or net1 and no
// blackhole may stay, and the last DELs leave the pod empty.
func TestAttack18ConcurrentDels(t *testing.T) {
	for round := 0; round < 3; round++ {
		e := testenv.New(t)
		pod := podWithLoUp(t, e)
		for _, ifn := range []string{"eth0", "net1", "net2", "net3"} {
			ifn := ifn
			t.Cleanup(func() { _ = e.Del(pod, "a18cc", ifn) })
		}
		e.Add(pod, "a18cc")
		a18AddIf(t, e, pod, "a18cc", "net1")
		r2 := a18AddIf(t, e, pod, "a18cc", "net2")
		var wg sync.WaitGroup
		errs := make([]error, 3)
		var r3 *current.Result
		wg.Add(3)
		go func() { defer wg.Done(); errs[0] = e.Del(pod, "a18cc", "eth0") }()
		go func() { defer wg.Done(); errs[1] = e.Del(pod, "a18cc", "net1") }()
		go func() {
			defer wg.Done()
			errs[2] = e.InNode(func() error {
				r, err := e.CNI.AddNetworkList(context.Background(), e.ConfList("1.1.0"), e.RuntimeConf(pod, "a18cc", "net3"))
				if err == nil {
					r3, err = current.NewResultFromResult(r)
				}
				return err
			})
		}()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: verb %d: %v", round, i, err)
			}
		}
		left := strings.Join(podLeftovers(t, pod), "\n  ")
		if strings.Contains(left, "blackhole") || strings.Contains(left, "eth0") || strings.Contains(left, "net1") {
			t.Errorf("round %d: the pod after the concurrent verbs:\n  %s", round, left)
		}
		v4, v6 := testenv.PodIPs(t, r2)
		a18PingAll(t, "node to net2", e.Node, v4, v6)
		v4, v6 = testenv.PodIPs(t, r3)
		a18PingAll(t, "node to net3", e.Node, v4, v6)
		for _, ifn := range []string{"net2", "net3"} {
			if err := e.Del(pod, "a18cc", ifn); err != nil {
				t.Fatalf("DEL %s: %v", ifn, err)
			}
		}
		if l := podLeftovers(t, pod); len(l) > 0 {
			t.Errorf("round %d: the pod after the last DELs:\n  %s", round, strings.Join(l, "\n  "))
		}
		e.AssertClean()
	}
}
