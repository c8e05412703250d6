package integration

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestGCsAndReconcileAtOnce: two GCs and the agent's reconcile running at
// once over what killed ADDs left: each claim is torn down by one of them
// (the others find it held or gone), none fails, nothing is left.
func TestGCsAndReconcileAtOnce(t *testing.T) {
	e := testenv.New(t)
	bin := crashBinary(t)
	confDir := e.WriteConfDir()
	for round := 0; round < 3; round++ {
		for i, step := range []string{"ipam", "endpoints", "host", "pod"} {
			pod := e.NewPod()
			id := fmt.Sprintf("killed%d-%d", round, i)
			envv := pluginEnv("ADD", id, pod, "eth0")
			envv["EBPF_CNI_CRASH_AT"] = step
			out, err := e.RunPlugin(bin, envv, e.StdinConf(nil))
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("ADD with EBPF_CNI_CRASH_AT=%s: %v, want killed by SIGKILL; stdout %s", step, err, out)
			}
		}
		if len(e.Leftovers()) == 0 {
			t.Fatal("the killed ADDs left nothing; the test would prove nothing")
		}
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i < 2 {
					errs[i] = e.GC()
					return
				}
				out, err := e.AgentCmd("reconcile", "--pin-dir", e.PinDir, "--state-dir", e.StateDir,
					"--cni-conf-dir", confDir, "--cni-bin-dir", testenv.BinDir)
				if err != nil {
					errs[i] = fmt.Errorf("%v: %s", err, out)
				}
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d: %s: %v", round, []string{"GC", "GC", "reconcile"}[i], err)
			}
		}
		if l := e.Leftovers(); len(l) > 0 {
			t.Fatalf("round %d: after two GCs and reconcile at once:\n  %s", round, strings.Join(l, "\n  "))
		}
	}
	e.AssertClean()
}
