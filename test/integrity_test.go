package test

// Hostile review: what a runtime, a second network, a chained plugin or a
// local user can do to a node, and what the plugin must still guarantee (one
// owner for every address, interface and file; nothing left behind by a
// killed ADD; errors with the spec's codes). Every test here failed on the
// code before issue 12.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
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
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/cni"
)

// ---- helpers of this file --------------------------------------------------

// stdinConf is the plugin config a runtime would pipe to the plugin.
func (e *env) stdinConf(edit func(c map[string]any)) []byte {
	e.t.Helper()
	c := e.pluginConf()
	c["cniVersion"], c["name"] = "1.1.0", e.name
	if edit != nil {
		edit(c)
	}
	b, err := json.Marshal(c)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// pluginEnv is the environment a runtime sets for one verb.
func pluginEnv(cmd, containerID string, pod ns.NetNS, ifname string) map[string]string {
	m := map[string]string{
		"CNI_COMMAND": cmd, "CNI_CONTAINERID": containerID, "CNI_IFNAME": ifname, "CNI_PATH": binDir,
	}
	if pod != nil {
		m["CNI_NETNS"] = pod.Path()
	}
	return m
}

// runPlugin runs a plugin binary in the node netns and returns its stdout and
// exit error (an *exec.ExitError for a failure or a signal).
func (e *env) runPlugin(bin string, envv map[string]string, stdin []byte) ([]byte, error) {
	var out []byte
	err := e.inNode(func() error {
		cmd := exec.Command(bin)
		for k, v := range envv {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stdin = bytes.NewReader(stdin)
		var b bytes.Buffer
		cmd.Stdout = &b
		err := cmd.Run()
		out = b.Bytes()
		return err
	})
	return out, err
}

// wantPluginError fails unless the plugin exited non-zero with a CNI error of
// the given code whose message contains every substring.
func wantPluginError(t *testing.T, what string, out []byte, err error, code uint, subs ...string) *types.Error {
	t.Helper()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("%s: exit %v, want a failure; stdout: %s", what, err, out)
	}
	perr := pluginError(t, out)
	if perr.Code != code {
		t.Errorf("%s: error code %d (%q), want %d", what, perr.Code, perr.Msg, code)
	}
	for _, s := range subs {
		if !strings.Contains(perr.Msg+" "+perr.Details, s) {
			t.Errorf("%s: error %q does not mention %q", what, perr.Msg, s)
		}
	}
	return perr
}

// libcniErr checks an error libcni returned for a CNI code and substrings.
func libcniErr(t *testing.T, what string, err error, code uint, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: succeeded, want error %d", what, code)
	}
	if got := errCode(err); got != code {
		t.Errorf("%s: error code %d (%v), want %d", what, got, err, code)
	}
	wantErrContains(t, what, err, subs...)
}

// podReachable proves a pod still works both ways over both families.
func (e *env) podReachable(t *testing.T, pod ns.NetNS, ips []net.IP) {
	t.Helper()
	for _, ip := range ips {
		if err := ping(e.node, ip, 2); err != nil {
			t.Fatalf("node to pod %s: %v", ip, err)
		}
	}
	if err := ping(pod, nodeIP4, 1); err != nil {
		t.Fatalf("pod to node: %v", err)
	}
	if err := ping(pod, nodeIP6, 1); err != nil {
		t.Fatalf("pod to node: %v", err)
	}
}

// ---- 1. Retried ADD --------------------------------------------------------

// TestIntegrityRetriedAdd: a second ADD of a live (container ID, ifname) is
// refused with code 4 naming it, and the live pod keeps everything: its
// veth, map entries and, above all, its IPAM reservation (before, the failed
// ADD's undo released it and the next pod got the live pod's address).
func TestIntegrityRetriedAdd(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pod := e.newPod()
	e.cleanupDel(pod, "retried")
	live := e.addAttachment(pod, "retried")

	for i := 0; i < 2; i++ {
		_, err := e.addV("1.1.0", pod, "retried", "eth0")
		libcniErr(t, "second ADD of a live attachment", err, codeInvalidEnv,
			"CNI_CONTAINERID", "retried", "eth0", e.name, "exists already", live.hostIf)
	}
	if got := e.reservationsOf("retried"); len(got) != 2 {
		t.Fatalf("the live pod's reservations after the refused ADDs: %v, want its 2", got)
	}
	if err := e.check(pod, "retried", "eth0"); err != nil {
		t.Fatalf("CHECK of the live pod after the refused ADDs: %v", err)
	}
	e.podReachable(t, pod, live.ips)

	// The next pod does not get the live pod's address.
	next := e.newPod()
	e.cleanupDel(next, "next")
	n := e.addAttachment(next, "next")
	for _, a := range n.ips {
		for _, b := range live.ips {
			if a.Equal(b) {
				t.Fatalf("the next pod got the live pod's address %s", a)
			}
		}
	}
	e.podReachable(t, pod, live.ips)
	e.podReachable(t, next, n.ips)

	// The record was lost (state directory wiped), the veth is still there:
	// refused as well, naming the veth.
	if err := os.Remove(e.recordPath("retried", "eth0")); err != nil {
		t.Fatal(err)
	}
	_, err := e.addV("1.1.0", pod, "retried", "eth0")
	libcniErr(t, "ADD of a live attachment whose record is gone", err, codeInvalidEnv, live.hostIf, "exists already")
	if got := e.reservationsOf("retried"); len(got) != 2 {
		t.Fatalf("the live pod's reservations after the refused record-less ADD: %v", got)
	}
	e.podReachable(t, pod, live.ips)

	e.mustDel(pod, "retried")
	e.mustDel(next, "next")
	e.assertClean()
}

// TestIntegrityRacingAdds: ADDs of one attachment racing each other: exactly
// one wins, the others are refused (4, or 11 while the winner still works)
// and take nothing from the winner.
func TestIntegrityRacingAdds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pod := e.newPod()
	e.cleanupDel(pod, "race")
	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			_, errs[i] = e.addV("1.1.0", pod, "race", "eth0")
		}(i)
	}
	close(start)
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case errCode(err) == codeInvalidEnv || errCode(err) == types.ErrTryAgainLater:
		default:
			t.Errorf("racing ADD failed with %v (code %d), want code 4 or 11", err, errCode(err))
		}
	}
	if wins != 1 {
		t.Fatalf("%d racing ADDs of one attachment succeeded, want exactly 1: %v", wins, errs)
	}
	if got := e.reservationsOf("race"); len(got) != 2 {
		t.Fatalf("reservations after the race: %v, want the winner's 2", got)
	}
	if err := e.check(pod, "race", "eth0"); err != nil {
		t.Fatalf("CHECK of the winner: %v", err)
	}
	if err := ping(pod, nodeIP4, 1); err != nil {
		t.Fatal(err)
	}
	e.mustDel(pod, "race")
	e.assertClean()
}

// ---- 6. Killed ADD ---------------------------------------------------------

var (
	crashOnce sync.Once
	crashBin  string
	crashErr  error
)

// crashBinary builds the plugin with -tags crashpoint: EBPF_CNI_CRASH_AT=<step>
// makes it SIGKILL itself at that step of ADD.
func crashBinary(t *testing.T) string {
	t.Helper()
	crashOnce.Do(func() {
		dir := filepath.Join(binDir, "crash")
		cmd := exec.Command("go", "build", "-tags", "crashpoint", "-o", dir+"/", "github.com/ebpf-cni/ebpf-cni/cmd/ebpf-cni")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			crashErr = fmt.Errorf("build crashpoint plugin: %v\n%s", err, out)
			return
		}
		crashBin = filepath.Join(dir, "ebpf-cni")
	})
	if crashErr != nil {
		t.Fatal(crashErr)
	}
	return crashBin
}

// blockingIPAM writes an IPAM plugin that delegates to host-local and then,
// for an ADD, waits while the file named by $BLOCK_FILE exists (after
// touching $BLOCK_FILE.reserved), so a test can kill ebpf-cni while its IPAM
// exec is in flight. Returns the directory to put first in CNI_PATH.
func blockingIPAM(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
out=$(%q); rc=$?
if [ "$CNI_COMMAND" = ADD ] && [ -n "$BLOCK_FILE" ]; then
	touch "$BLOCK_FILE.reserved"
	while [ -e "$BLOCK_FILE" ]; do sleep 0.02; done
fi
printf '%%s' "$out"
exit $rc
`, filepath.Join(binDir, "host-local"))
	if err := os.WriteFile(filepath.Join(dir, "blocking-ipam"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// cleanupBy removes a half-made attachment the way a node would: the
// runtime's DEL (no prevResult: the ADD failed), GC with no valid
// attachments, or `ebpf-agent reconcile`.
func (e *env) cleanupBy(t *testing.T, how, id string, pod ns.NetNS, cniPath string) {
	t.Helper()
	switch how {
	case "DEL":
		if err := e.del(pod, id, "eth0"); err != nil {
			t.Fatalf("DEL after the killed ADD: %v", err)
		}
	case "GC":
		if err := e.gc(); err != nil {
			t.Fatalf("GC after the killed ADD: %v", err)
		}
	case "reconcile":
		out, err := e.agentCmd("reconcile", "--pin-dir", e.pinDir, "--state-dir", e.stateDir,
			"--cni-conf-dir", e.writeConfDir(), "--cni-bin-dir", cniPath)
		if err != nil {
			t.Fatalf("ebpf-agent reconcile after the killed ADD: %v\n%s", err, out)
		}
	}
}

// TestIntegrityKilledAdd: an ADD killed with SIGKILL at any step, and never
// completed, is torn down completely by the runtime's DEL, by GC, and by
// `ebpf-agent reconcile`. Before, an ADD killed before writing its record
// kept its veth, link pins and lease through GC and reconcile.
func TestIntegrityKilledAdd(t *testing.T) {
	cleanups := []string{"DEL", "GC", "reconcile"}

	// Killed while its IPAM exec was in flight: veth and programs attached,
	// the address reserved, nothing else. Deterministic without a special
	// build: the IPAM plugin blocks until the test has killed ebpf-cni.
	t.Run("during IPAM", func(t *testing.T) {
		for _, how := range cleanups {
			t.Run(how, func(t *testing.T) {
				e := newEnv(t)
				ipamDir := blockingIPAM(t)
				cniPath := ipamDir + string(os.PathListSeparator) + binDir
				e.cni = libcni.NewCNIConfigWithCacheDir([]string{ipamDir, binDir}, e.cacheDir, nil)
				e.ipam = map[string]any{"type": "blocking-ipam", "dataDir": e.dataDir,
					"ranges": [][]map[string]string{{{"subnet": podSubnet4}}, {{"subnet": podSubnet6}}}}
				pod := e.newPod()
				block := filepath.Join(t.TempDir(), "block")
				if err := os.WriteFile(block, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				envv := pluginEnv("ADD", "killed", pod, "eth0")
				envv["CNI_PATH"], envv["BLOCK_FILE"] = cniPath, block
				stdin := e.stdinConf(nil)
				var cmd *exec.Cmd
				err := e.inNode(func() error {
					cmd = exec.Command(filepath.Join(binDir, "ebpf-cni"))
					for k, v := range envv {
						cmd.Env = append(cmd.Env, k+"="+v)
					}
					cmd.Stdin = bytes.NewReader(stdin)
					return cmd.Start()
				})
				if err != nil {
					t.Fatal(err)
				}
				hostIf := cni.HostIfName("killed", "eth0")
				deadline := time.Now().Add(10 * time.Second)
				for {
					_, rerr := os.Stat(block + ".reserved")
					if rerr == nil && e.nodeLinkExists(hostIf) {
						break
					}
					if time.Now().After(deadline) {
						cmd.Process.Kill()
						cmd.Wait()
						os.Remove(block)
						t.Fatal("the ADD never got to its IPAM exec with the veth made")
					}
					time.Sleep(10 * time.Millisecond)
				}
				cmd.Process.Signal(syscall.SIGKILL)
				cmd.Wait()
				os.Remove(block) // lets the orphaned IPAM exec end
				if len(e.leftovers()) == 0 {
					t.Fatal("the killed ADD left nothing; the test would prove nothing")
				}
				_, err = e.addV("1.1.0", pod, "killed", "eth0")
				libcniErr(t, "ADD again over the killed one's remains", err, codeInvalidEnv, "did not finish", "DEL it first")

				e.cleanupBy(t, how, "killed", pod, cniPath)
				if l := e.leftovers(); len(l) > 0 {
					t.Fatalf("after %s of the killed ADD:\n  %s", how, strings.Join(l, "\n  "))
				}
				// The attachment can be made again.
				p := e.addAttachment(pod, "killed")
				if err := ping(pod, nodeIP4, 1); err != nil {
					t.Fatal(err)
				}
				if err := e.del(pod, p.id, "eth0"); err != nil {
					t.Fatal(err)
				}
				e.assertClean()
			})
		}
	})

	// Killed at every later step with the crashpoint build.
	for _, step := range []string{"claimed", "ipam", "endpoints", "host", "pod", "recorded"} {
		t.Run(step, func(t *testing.T) {
			bin := crashBinary(t)
			for _, how := range cleanups {
				t.Run(how, func(t *testing.T) {
					e := newEnv(t)
					pod := e.newPod()
					envv := pluginEnv("ADD", "crash", pod, "eth0")
					envv["EBPF_CNI_CRASH_AT"] = step
					out, err := e.runPlugin(bin, envv, e.stdinConf(nil))
					var ee *exec.ExitError
					if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
						t.Fatalf("ADD with EBPF_CNI_CRASH_AT=%s: %v, want killed by SIGKILL; stdout %s", step, err, out)
					}
					if len(e.leftovers()) == 0 {
						t.Fatal("the killed ADD left nothing; the test would prove nothing")
					}
					if step == "recorded" && how == "reconcile" {
						// Complete and live, only the result was never
						// printed: reconcile keeps it, DEL and GC remove it.
						e.cleanupBy(t, how, "crash", pod, binDir)
						if err := ping(pod, nodeIP4, 1); err != nil {
							t.Fatalf("reconcile broke a complete attachment: %v", err)
						}
						how = "DEL"
					}
					e.cleanupBy(t, how, "crash", pod, binDir)
					if l := e.leftovers(); len(l) > 0 {
						t.Fatalf("after %s of the ADD killed at %q:\n  %s", how, step, strings.Join(l, "\n  "))
					}
					pod.Do(func(ns.NetNS) error {
						if _, err := netlink.LinkByName("eth0"); err == nil {
							t.Errorf("eth0 left in the pod after %s", how)
						}
						return nil
					})
				})
			}
		})
	}
}

// TestIntegrityInFlightAdd: GC and reconcile leave an ADD that is still at
// work alone, and a DEL racing it waits for it instead of tearing down half.
func TestIntegrityInFlightAdd(t *testing.T) {
	e := newEnv(t)
	ipamDir := blockingIPAM(t)
	cniPath := ipamDir + string(os.PathListSeparator) + binDir
	e.cni = libcni.NewCNIConfigWithCacheDir([]string{ipamDir, binDir}, e.cacheDir, nil)
	e.ipam = map[string]any{"type": "blocking-ipam", "dataDir": e.dataDir,
		"ranges": [][]map[string]string{{{"subnet": podSubnet4}}, {{"subnet": podSubnet6}}}}
	pod := e.newPod()
	block := filepath.Join(t.TempDir(), "block")
	os.WriteFile(block, nil, 0o600)
	t.Cleanup(func() { os.Remove(block) })
	envv := pluginEnv("ADD", "inflight", pod, "eth0")
	envv["CNI_PATH"], envv["BLOCK_FILE"] = cniPath, block
	done := make(chan error, 1)
	var out []byte
	go func() {
		var err error
		out, err = e.runPlugin(filepath.Join(binDir, "ebpf-cni"), envv, e.stdinConf(nil))
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(block + ".reserved"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ADD never reached its IPAM exec")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := e.gc(); err != nil {
		t.Fatalf("GC during an ADD: %v", err)
	}
	e.cleanupBy(t, "reconcile", "inflight", pod, cniPath)
	os.Remove(block)
	if err := <-done; err != nil {
		t.Fatalf("the ADD that GC and reconcile ran beside: %v\n%s", err, out)
	}
	if err := ping(pod, nodeIP4, 2); err != nil {
		t.Fatalf("pod added while GC and reconcile ran: %v", err)
	}
	if err := e.del(pod, "inflight", "eth0"); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}
