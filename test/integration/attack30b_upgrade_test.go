//go:build review_repro

// attack30b: attack30 moved the pod's netns lock from an flock on the
// pod's nsfs file to a directory of the node's (<pinDir>/locks/netns/<stripe>).
// A verb of the previous release (fdebe56) still running while the node's
// binary is replaced takes the old lock, a verb of this build the new one:
// they no longer exclude each other.
//
// Red (a working attack, not fixed: see the report of attack30b):
//
//	go test -tags review_repro -count=1 -run TestAttack30bUpgradeOldDelBesideNewAdd -v ./test/integration/
//
// the ADD of net1 by this build is done while the old DEL of eth0 is
// stopped after its look (it did not wait), and the old DEL, which saw no
// other interface, then deletes the pod's cni_netns entry: net1 live
// without it.

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a30bPrevRelease is main before this session's changes (ident30, attack30).
const a30bPrevRelease = "fdebe56928bf8f4d34e93eb8063c52317c91bb71"

var (
	a30bOldCrashOnce sync.Once
	a30bOldCrashBin  string
	a30bOldCrashErr  error
)

// a30bOldCrashBinary builds the plugin of a30bPrevRelease with -tags
// crashpoint (EBPF_CNI_STOP_AT), -trimpath so that the build cache serves
// it again.
func a30bOldCrashBinary(t *testing.T) string {
	t.Helper()
	a30bOldCrashOnce.Do(func() {
		top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
		if err != nil {
			a30bOldCrashErr = err
			return
		}
		src, err := os.MkdirTemp("", "ebpf-cni-src-")
		if err != nil {
			a30bOldCrashErr = err
			return
		}
		defer os.RemoveAll(src)
		arch := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive --format=tar %s | tar -x -C %q", strings.TrimSpace(string(top)), a30bPrevRelease, src))
		if out, err := arch.CombinedOutput(); err != nil {
			a30bOldCrashErr = fmt.Errorf("extract %s: %v\n%s", a30bPrevRelease, err, out)
			return
		}
		dir := filepath.Join(testenv.BinDir, "crash-"+a30bPrevRelease[:12])
		build := exec.Command("go", "build", "-trimpath", "-tags", "crashpoint", "-o", dir+"/", "./cmd/ebpf-cni")
		build.Dir = src
		if out, err := build.CombinedOutput(); err != nil {
			a30bOldCrashErr = fmt.Errorf("build %s: %v\n%s", a30bPrevRelease, err, out)
			return
		}
		a30bOldCrashBin = filepath.Join(dir, "ebpf-cni")
	})
	if a30bOldCrashErr != nil {
		t.Fatal(a30bOldCrashErr)
	}
	return a30bOldCrashBin
}

// TestAttack30bUpgradeOldDelBesideNewAdd: TestAddBesideDelNetnsEntry across
// the upgrade. The previous release's DEL of eth0 stops after its look (no
// other interface: it will delete the entry), this build's ADD of net1
// runs: it must wait for the DEL (the entry then made again), or the DEL
// must see net1. net1 must keep the pod's cni_netns entry.
func TestAttack30bUpgradeOldDelBesideNewAdd(t *testing.T) {
	t.Parallel()
	old := a30bOldCrashBinary(t)
	e := testenv.New(t)
	id := "a30bupg"
	pod, cookie := podWithEth0Entry(t, e, id)

	del, out := stoppedVerb(t, e, old, "DEL", pod, id, "eth0", "del-look")

	added := make(chan error, 1)
	var res1 *current.Result
	start := time.Now()
	go func() { var err error; res1, err = a22Add(e, pod, id, "net1"); added <- err }()
	var addErr error
	select {
	case addErr = <-added:
		t.Logf("this build's ADD net1 done while the old DEL was stopped holding the old lock (%v): %v", time.Since(start).Round(time.Millisecond), addErr)
		del.Process.Signal(syscall.SIGCONT)
	case <-time.After(2 * time.Second):
		t.Logf("this build's ADD net1 waits for the old DEL")
		del.Process.Signal(syscall.SIGCONT)
		addErr = <-added
	}
	if err := del.Wait(); err != nil {
		t.Errorf("old DEL eth0: %v\n%s", err, out)
	}
	if addErr != nil {
		t.Fatalf("ADD net1: %v", addErr)
	}
	v4, v6 := testenv.PodIPs(t, res1)
	a18PingAll(t, "net1 added beside the old DEL of eth0: node to net1", e.Node, v4, v6)
	if _, err := testenv.LookupNetns(e.Maps(), cookie); err != nil {
		t.Errorf("net1 live and the pod's netns (cookie %d) has no cni_netns entry: the previous release's DEL deleted it beside this build's ADD (%v)", cookie, err)
	}
}
