package integration

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack18DelTwiceMore: DEL, then DEL twice more (the runtime's
// retries), after a plain DEL and after one killed with the objects parked:
// each succeeds and the pod and node keep nothing; a new ADD works.
func TestAttack18DelTwiceMore(t *testing.T) {
	for _, crash := range []string{"", "del-parked", "del-veth"} {
		t.Run("crash="+crash, func(t *testing.T) {
			e := testenv.New(t)
			pod := podWithLoUp(t, e)
			e.CleanupDel(pod, "a18tw")
			e.Add(pod, "a18tw")
			if crash != "" {
				envv := pluginEnv("DEL", "a18tw", pod, "eth0")
				envv["EBPF_CNI_CRASH_AT"] = crash
				out, err := e.RunPlugin(crashBinary(t), envv, e.StdinConf(nil))
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Fatalf("DEL at %s: %v, want SIGKILL; %s", crash, err, out)
				}
			}
			for i := 0; i < 3; i++ {
				if err := e.Del(pod, "a18tw", "eth0"); err != nil {
					t.Fatalf("DEL #%d: %v", i+1, err)
				}
				if l := podLeftovers(t, pod); len(l) > 0 {
					t.Errorf("the pod after DEL #%d:\n  %s", i+1, strings.Join(l, "\n  "))
				}
				e.AssertClean()
			}
			a := e.AddAttachment(pod, "a18tw")
			a18PingAll(t, "pod to node after ADD again", pod, testenv.NodeIP4, testenv.NodeIP6)
			if err := e.Del(pod, a.ID, "eth0"); err != nil {
				t.Fatal(err)
			}
			e.AssertClean()
		})
	}
}

// TestAttack18DelNetnsGone: the runtime's DEL after the pod's netns is gone
// (removed after ADD, or after a DEL killed with the objects parked, the
// veth still there or already gone): DEL succeeds, twice, and the node
// keeps nothing of the attachment.
func TestAttack18DelNetnsGone(t *testing.T) {
	for _, crash := range []string{"", "del-parked", "del-veth"} {
		t.Run("crash="+crash, func(t *testing.T) {
			e := testenv.New(t)
			pod := podWithLoUp(t, e)
			e.CleanupDel(pod, "a18ng")
			e.Add(pod, "a18ng")
			if crash != "" {
				envv := pluginEnv("DEL", "a18ng", pod, "eth0")
				envv["EBPF_CNI_CRASH_AT"] = crash
				out, err := e.RunPlugin(crashBinary(t), envv, e.StdinConf(nil))
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Fatalf("DEL at %s: %v, want SIGKILL; %s", crash, err, out)
				}
			}
			must(t, testenv.RemoveNS(pod))
			for i := 0; i < 2; i++ {
				if err := e.Del(pod, "a18ng", "eth0"); err != nil {
					t.Fatalf("DEL #%d with the netns gone: %v", i+1, err)
				}
			}
			e.AssertClean()
			e.AssertNothingOf("a18ng")
		})
	}
}
