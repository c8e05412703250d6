// GC of what killed ADDs left: its claim held against ADD and DEL, GC killed
// while holding it, GCs and the agent's reconcile at once.

package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestGCKilledWhileHoldingClaim: GC tears down what a killed ADD left while
// holding its claim (state.Store.Hold). While it holds it, a new ADD of the
// attachment is refused with 11 and a DEL waits; GC killed with SIGKILL in
// the middle (here: in its IPAM release) frees the claim with the process,
// so the waiting DEL, or the next GC, finishes the teardown and leaves
// nothing, and the attachment can be made again.
func TestGCKilledWhileHoldingClaim(t *testing.T) {
	for _, then := range []string{"DEL", "GC"} {
		t.Run(then, func(t *testing.T) {
			e := testenv.New(t)
			ipamDir := t.TempDir()
			// host-local, blocking after its DEL while BLOCK_FILE exists
			// (only GC's process has BLOCK_FILE in its environment).
			script := fmt.Sprintf(`#!/bin/sh
out=$(%q); rc=$?
if [ "$CNI_COMMAND" = DEL ] && [ -n "$BLOCK_FILE" ]; then
	touch "$BLOCK_FILE.reached"
	while [ -e "$BLOCK_FILE" ]; do sleep 0.02; done
fi
printf '%%s' "$out"
exit $rc
`, filepath.Join(testenv.BinDir, "host-local"))
			if err := os.WriteFile(filepath.Join(ipamDir, "blockdel-ipam"), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			cniPath := ipamDir + string(os.PathListSeparator) + testenv.BinDir
			e.CNI = libcni.NewCNIConfigWithCacheDir([]string{ipamDir, testenv.BinDir}, e.CacheDir, nil)
			e.IPAM = map[string]any{"type": "blockdel-ipam", "dataDir": e.DataDir,
				"ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}, {{"subnet": testenv.PodSubnet6}}}}
			pod := e.NewPod()
			block := filepath.Join(t.TempDir(), "block")
			if err := os.WriteFile(block, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(block) // lets GC's orphaned IPAM exec end

			// An ADD killed after making the veth, its lease taken.
			envv := pluginEnv("ADD", "held", pod, "eth0")
			envv["CNI_PATH"], envv["EBPF_CNI_CRASH_AT"] = cniPath, "host"
			out, err := e.RunPlugin(crashBinary(t), envv, e.StdinConf(nil))
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("ADD with EBPF_CNI_CRASH_AT=host: %v, want killed by SIGKILL; stdout %s", err, out)
			}
			if len(e.Leftovers()) == 0 {
				t.Fatal("the killed ADD left nothing; the test would prove nothing")
			}

			// GC, held in its IPAM release of the dead claim.
			genv := map[string]string{"CNI_COMMAND": "GC", "CNI_PATH": cniPath, "BLOCK_FILE": block}
			stdin := e.StdinConf(func(c map[string]any) { c["cni.dev/valid-attachments"] = []any{} })
			var gc *exec.Cmd
			if err := e.InNode(func() error {
				gc = exec.Command(filepath.Join(testenv.BinDir, "ebpf-cni"))
				for k, v := range genv {
					gc.Env = append(gc.Env, k+"="+v)
				}
				gc.Stdin = strings.NewReader(string(stdin))
				return gc.Start()
			}); err != nil {
				t.Fatal(err)
			}
			gcDone := make(chan error, 1)
			go func() { gcDone <- gc.Wait() }()
			defer func() {
				gc.Process.Kill()
				<-gcDone
			}()
			deadline := time.Now().Add(15 * time.Second)
			for {
				if _, err := os.Stat(block + ".reached"); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("GC never reached its IPAM release of the killed ADD's claim")
				}
				time.Sleep(10 * time.Millisecond)
			}

			_, err = e.AddV("1.1.0", pod, "held", "eth0")
			libcniErr(t, "ADD while GC holds the dead claim", err, types.ErrTryAgainLater, "did not finish", "being torn down", "try again")

			var delDone chan error
			if then == "DEL" {
				delDone = make(chan error, 1)
				go func() { delDone <- e.Del(pod, "held", "eth0") }()
				select {
				case err := <-delDone:
					t.Fatalf("DEL did not wait for GC's teardown of the held claim: %v", err)
				case <-time.After(500 * time.Millisecond):
				}
			}
			if err := gc.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-gcDone
			gcDone <- nil // for the deferred wait
			killed := time.Now()

			if then == "DEL" {
				select {
				case err := <-delDone:
					if err != nil {
						t.Fatalf("DEL after GC was killed holding the claim: %v", err)
					}
				case <-time.After(20 * time.Second):
					t.Fatal("DEL still waiting 20s after the GC holding the claim was killed")
				}
				t.Logf("DEL ended %s after the GC holding the claim was killed", time.Since(killed).Round(time.Millisecond))
			} else if err := e.GC(); err != nil {
				t.Fatalf("GC after a GC killed holding the claim: %v", err)
			}
			if l := e.Leftovers(); len(l) > 0 {
				t.Fatalf("after %s of what the killed GC left:\n  %s", then, strings.Join(l, "\n  "))
			}
			os.Remove(block)
			e.AddAttachment(pod, "held")
			if err := testenv.Ping(pod, testenv.NodeIP4, 2); err != nil {
				t.Fatal(err)
			}
			if err := e.Del(pod, "held", "eth0"); err != nil {
				t.Fatal(err)
			}
			e.AssertClean()
		})
	}
}

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
