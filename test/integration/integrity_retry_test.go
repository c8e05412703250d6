// Retries and crashes: a repeated ADD, ADDs racing, an ADD killed at every
// step and cleaned by DEL, GC or the agent, an ADD in flight during GC.

package integration

import (
	"bytes"
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
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
	"github.com/vishvananda/netlink"
)

// TestIntegrityRetriedAdd: a second ADD of a live (container ID, ifname) is
// refused with code 4 naming it, and the live pod keeps everything: its
// veth, map entries and, above all, its IPAM reservation (before, the failed
// ADD's undo released it and the next pod got the live pod's address).
func TestIntegrityRetriedAdd(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "retried")
	live := e.AddAttachment(pod, "retried")

	for i := 0; i < 2; i++ {
		_, err := e.AddV("1.1.0", pod, "retried", "eth0")
		libcniErr(t, "second ADD of a live attachment", err, codeInvalidEnv,
			"CNI_CONTAINERID", "retried", "eth0", e.Name, "exists already", live.HostIf)
	}
	if got := e.ReservationsOf("retried"); len(got) != 2 {
		t.Fatalf("the live pod's reservations after the refused ADDs: %v, want its 2", got)
	}
	if err := e.Check(pod, "retried", "eth0"); err != nil {
		t.Fatalf("CHECK of the live pod after the refused ADDs: %v", err)
	}
	e.PodReachable(t, pod, live.IPs)

	// The next pod does not get the live pod's address.
	next := e.NewPod()
	e.CleanupDel(next, "next")
	n := e.AddAttachment(next, "next")
	for _, a := range n.IPs {
		for _, b := range live.IPs {
			if a.Equal(b) {
				t.Fatalf("the next pod got the live pod's address %s", a)
			}
		}
	}
	e.PodReachable(t, pod, live.IPs)
	e.PodReachable(t, next, n.IPs)

	// The record was lost (state directory wiped), the veth is still there:
	// refused as well, naming the veth.
	if err := os.Remove(e.RecordPath("retried", "eth0")); err != nil {
		t.Fatal(err)
	}
	_, err := e.AddV("1.1.0", pod, "retried", "eth0")
	libcniErr(t, "ADD of a live attachment whose record is gone", err, codeInvalidEnv, live.HostIf, "exists already")
	if got := e.ReservationsOf("retried"); len(got) != 2 {
		t.Fatalf("the live pod's reservations after the refused record-less ADD: %v", got)
	}
	e.PodReachable(t, pod, live.IPs)

	// Another network attaching the same container ID and interface name:
	// refused, naming the network that has it.
	netB := e.NetList(testenv.RandName("netb"), map[string]any{"type": "ebpf-cni", "pinDir": e.PinDir, "stateDir": t.TempDir(),
		"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{{{"subnet": "10.251.0.0/24"}}}}})
	_, err = e.AddList(netB, e.RuntimeConf(pod, "retried", "eth0"))
	libcniErr(t, "another network's ADD of the same container and interface", err, codeInvalidEnv,
		"exists already", "network "+fmt.Sprintf("%q", e.Name), live.HostIf)
	e.PodReachable(t, pod, live.IPs)

	e.MustDel(pod, "retried")
	e.MustDel(next, "next")
	e.AssertClean()
}

// TestIntegrityRacingAdds: ADDs of one attachment racing each other: exactly
// one wins, the others are refused (4, or 11 while the winner still works)
// and take nothing from the winner.
func TestIntegrityRacingAdds(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "race")
	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			_, errs[i] = e.AddV("1.1.0", pod, "race", "eth0")
		}(i)
	}
	close(start)
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case testenv.ErrCode(err) == codeInvalidEnv || testenv.ErrCode(err) == types.ErrTryAgainLater:
		default:
			t.Errorf("racing ADD failed with %v (code %d), want code 4 or 11", err, testenv.ErrCode(err))
		}
	}
	if wins != 1 {
		t.Fatalf("%d racing ADDs of one attachment succeeded, want exactly 1: %v", wins, errs)
	}
	if got := e.ReservationsOf("race"); len(got) != 2 {
		t.Fatalf("reservations after the race: %v, want the winner's 2", got)
	}
	if err := e.Check(pod, "race", "eth0"); err != nil {
		t.Fatalf("CHECK of the winner: %v", err)
	}
	if err := testenv.Ping(pod, testenv.NodeIP4, 2); err != nil {
		t.Fatal(err)
	}
	e.MustDel(pod, "race")
	e.AssertClean()
}

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
		dir := filepath.Join(testenv.BinDir, "crash")
		cmd := exec.Command("go", "build", "-tags", "crashpoint", "-o", dir+"/", "github.com/ebpf-cni/ebpf-cni/cmd/ebpf-cni")
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
`, filepath.Join(testenv.BinDir, "host-local"))
	if err := os.WriteFile(filepath.Join(dir, "blocking-ipam"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
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
				e := testenv.New(t)
				ipamDir := blockingIPAM(t)
				cniPath := ipamDir + string(os.PathListSeparator) + testenv.BinDir
				e.CNI = libcni.NewCNIConfigWithCacheDir([]string{ipamDir, testenv.BinDir}, e.CacheDir, nil)
				e.IPAM = map[string]any{"type": "blocking-ipam", "dataDir": e.DataDir,
					"ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}, {{"subnet": testenv.PodSubnet6}}}}
				pod := e.NewPod()
				block := filepath.Join(t.TempDir(), "block")
				if err := os.WriteFile(block, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				envv := pluginEnv("ADD", "killed", pod, "eth0")
				envv["CNI_PATH"], envv["BLOCK_FILE"] = cniPath, block
				stdin := e.StdinConf(nil)
				var cmd *exec.Cmd
				err := e.InNode(func() error {
					cmd = exec.Command(filepath.Join(testenv.BinDir, "ebpf-cni"))
					for k, v := range envv {
						cmd.Env = append(cmd.Env, k+"="+v)
					}
					cmd.Stdin = bytes.NewReader(stdin)
					return cmd.Start()
				})
				if err != nil {
					t.Fatal(err)
				}
				hostIf := state.HostIfName("killed", "eth0")
				deadline := time.Now().Add(10 * time.Second)
				for {
					_, rerr := os.Stat(block + ".reserved")
					if rerr == nil && e.NodeLinkExists(hostIf) {
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
				if len(e.Leftovers()) == 0 {
					t.Fatal("the killed ADD left nothing; the test would prove nothing")
				}
				_, err = e.AddV("1.1.0", pod, "killed", "eth0")
				libcniErr(t, "ADD again over the killed one's remains", err, codeInvalidEnv, "did not finish", "DEL it first")

				e.CleanupBy(t, how, "killed", pod, cniPath)
				if l := e.Leftovers(); len(l) > 0 {
					t.Fatalf("after %s of the killed ADD:\n  %s", how, strings.Join(l, "\n  "))
				}
				// The attachment can be made again.
				p := e.AddAttachment(pod, "killed")
				if err := testenv.Ping(pod, testenv.NodeIP4, 2); err != nil {
					t.Fatal(err)
				}
				if err := e.Del(pod, p.ID, "eth0"); err != nil {
					t.Fatal(err)
				}
				e.AssertClean()
			})
		}
	})

	// Killed at every later step with the crashpoint build.
	for _, step := range []string{"claimed", "ipam", "endpoints", "host", "pod", "recorded"} {
		t.Run(step, func(t *testing.T) {
			bin := crashBinary(t)
			for _, how := range cleanups {
				t.Run(how, func(t *testing.T) {
					e := testenv.New(t)
					pod := e.NewPod()
					envv := pluginEnv("ADD", "crash", pod, "eth0")
					envv["EBPF_CNI_CRASH_AT"] = step
					out, err := e.RunPlugin(bin, envv, e.StdinConf(nil))
					var ee *exec.ExitError
					if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
						t.Fatalf("ADD with EBPF_CNI_CRASH_AT=%s: %v, want killed by SIGKILL; stdout %s", step, err, out)
					}
					if len(e.Leftovers()) == 0 {
						t.Fatal("the killed ADD left nothing; the test would prove nothing")
					}
					if step == "recorded" && how == "reconcile" {
						// Complete and live, only the result was never
						// printed: reconcile keeps it, DEL and GC remove it.
						e.CleanupBy(t, how, "crash", pod, testenv.BinDir)
						if err := testenv.Ping(pod, testenv.NodeIP4, 2); err != nil {
							t.Fatalf("reconcile broke a complete attachment: %v", err)
						}
						how = "DEL"
					}
					e.CleanupBy(t, how, "crash", pod, testenv.BinDir)
					if l := e.Leftovers(); len(l) > 0 {
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
	e := testenv.New(t)
	ipamDir := blockingIPAM(t)
	cniPath := ipamDir + string(os.PathListSeparator) + testenv.BinDir
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{ipamDir, testenv.BinDir}, e.CacheDir, nil)
	e.IPAM = map[string]any{"type": "blocking-ipam", "dataDir": e.DataDir,
		"ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}, {{"subnet": testenv.PodSubnet6}}}}
	pod := e.NewPod()
	block := filepath.Join(t.TempDir(), "block")
	os.WriteFile(block, nil, 0o600)
	t.Cleanup(func() { os.Remove(block) })
	envv := pluginEnv("ADD", "inflight", pod, "eth0")
	envv["CNI_PATH"], envv["BLOCK_FILE"] = cniPath, block
	done := make(chan error, 1)
	var out []byte
	go func() {
		var err error
		out, err = e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), envv, e.StdinConf(nil))
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
	if err := e.GC(); err != nil {
		t.Fatalf("GC during an ADD: %v", err)
	}
	e.CleanupBy(t, "reconcile", "inflight", pod, cniPath)
	os.Remove(block)
	if err := <-done; err != nil {
		t.Fatalf("the ADD that GC and reconcile ran beside: %v\n%s", err, out)
	}
	if err := testenv.Ping(pod, testenv.NodeIP4, 2); err != nil {
		t.Fatalf("pod added while GC and reconcile ran: %v", err)
	}
	if err := e.Del(pod, "inflight", "eth0"); err != nil {
		t.Fatal(err)
	}
	e.AssertClean()
}

// TestReviewKilledFirstAdd: the first ADD on a node (it sets up the pinned
// maps and programs) killed with SIGKILL after a varying delay, anywhere in
// that setup or later. The runtime's DEL cleans up whatever it left, and the
// next ADD sets the node up and works.
func TestReviewKilledFirstAdd(t *testing.T) {
	t.Parallel()
	killed := 0
	for _, d := range []time.Duration{5, 40, 70, 90, 110, 130, 150, 170, 200, 250, 300} {
		d *= time.Millisecond
		e := testenv.New(t)
		pod := e.NewPod()
		e.CleanupDel(pod, "killed")
		werr := e.KillPluginAfter(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("ADD", "killed", pod, "eth0"), e.StdinConf(nil), d)
		if testenv.Killed(werr) {
			killed++
		}
		pins, _ := os.ReadDir(e.PinDir)
		t.Logf("killed after %s: %v; left %d things, pin dir %d entries", d, werr, len(e.Leftovers()), len(pins))
		if err := e.Del(pod, "killed", "eth0"); err != nil {
			t.Errorf("killed after %s: DEL: %v", d, err)
		}
		if l := e.Leftovers(); len(l) > 0 {
			t.Errorf("killed after %s: left after DEL:\n  %s", d, strings.Join(l, "\n  "))
		}
		p := e.AddAttachment(pod, "again")
		e.PodReachable(t, pod, p.IPs)
		if err := e.Check(pod, "again", "eth0"); err != nil {
			t.Errorf("killed after %s: CHECK of the next ADD: %v", d, err)
		}
		e.MustDel(pod, "again")
		e.AssertClean()
	}
	if killed == 0 {
		t.Error("no SIGKILL landed before the ADD finished: nothing was interrupted")
	}
}

// TestReviewKilledDel: a DEL killed with SIGKILL after a varying delay; the
// runtime retries it. The retry succeeds and leaves nothing, and a pod added
// meanwhile never shares the half-deleted pod's address.
func TestReviewKilledDel(t *testing.T) {
	t.Parallel()
	killed := 0
	for _, d := range []time.Duration{2, 8, 15, 25, 40, 60, 90} {
		d *= time.Millisecond
		e := testenv.New(t)
		pod, next := e.NewPod(), e.NewPod()
		e.CleanupDel(pod, "victim")
		e.CleanupDel(next, "next")
		v := e.AddAttachment(pod, "victim")
		werr := e.KillPluginAfter(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("DEL", "victim", pod, "eth0"), e.StdinConf(nil), d)
		if testenv.Killed(werr) {
			killed++
		}
		left := e.Traces(v)
		t.Logf("DEL killed after %s: %v; left %d traces", d, werr, len(left))
		// A pod added meanwhile gets an address of its own, or is refused.
		if r, err := e.AddV("1.1.0", next, "next", "eth0"); err == nil {
			n, _ := current.NewResultFromResult(r)
			for _, ipc := range n.IPs {
				for _, ip := range v.IPs {
					if ipc.Address.IP.Equal(ip) {
						t.Errorf("DEL killed after %s: the next pod got the half-deleted pod's %s", d, ip)
					}
				}
			}
		}
		if err := e.Del(pod, "victim", "eth0"); err != nil {
			t.Errorf("DEL killed after %s: retried DEL: %v", d, err)
		}
		e.AssertGone(v)
		if err := e.Del(next, "next", "eth0"); err != nil {
			t.Errorf("DEL of the next pod: %v", err)
		}
		e.AssertClean()
	}
	if killed == 0 {
		t.Error("no SIGKILL landed before the DEL finished: nothing was interrupted")
	}
}
