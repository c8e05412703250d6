package integration

import (
	"errors"
	"os/exec"
	"syscall"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack22RetryAfterKill: an ADD SIGKILLed with its kept sockets open,
// after the node side (host) or inside the pod side (pod), then the
// runtime's DEL, then its retried ADD with the same container ID and
// ifname: the retry succeeds and eth0 is whole; DEL leaves nothing.
func TestAttack22RetryAfterKill(t *testing.T) {
	for _, step := range []string{"host", "pod"} {
		t.Run(step, func(t *testing.T) {
			bin := crashBinary(t)
			e := testenv.New(t)
			pod := podWithLoUp(t, e)
			id := testenv.RandName("a22k")
			e.CleanupDel(pod, id)
			envv := pluginEnv("ADD", id, pod, "eth0")
			envv["EBPF_CNI_CRASH_AT"] = step
			out, err := e.RunPlugin(bin, envv, e.StdinConf(nil))
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("ADD at %s: %v, want SIGKILL; %s", step, err, out)
			}
			if err := e.Del(pod, id, "eth0"); err != nil {
				t.Fatalf("DEL of the killed ADD: %v", err)
			}
			res, err := a22Add(e, pod, id, "eth0")
			if err != nil {
				t.Fatalf("retried ADD: %v", err)
			}
			a22Whole(t, e, "retry after kill at "+step, pod, "eth0", res)
			if err := e.Del(pod, id, "eth0"); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			a22Gone(t, pod)
			e.AssertClean()
		})
	}
}
