package integration

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack18LoDownAfterPark: a DEL killed with the objects parked, then
// the pod brings lo down (the kernel keeps the blackholes and their routes),
// then the runtime's retry: it must succeed and leave nothing; ADD again
// works. RED at del-parked (veth still there): the retry succeeds but leaves
// both parked blackholes with their routes in table 10002 and main, and the
// next ADD's eth0 gets no default route in main (the parked blackhole
// default holds it): the pod's unbound traffic is dropped (ping: connect:
// Invalid argument).
func TestAttack18LoDownAfterPark(t *testing.T) {
	for _, crash := range []string{"del-parked", "del-veth"} {
		t.Run(crash, func(t *testing.T) {
			e := testenv.New(t)
			pod := podWithLoUp(t, e)
			e.CleanupDel(pod, "a18lp")
			e.Add(pod, "a18lp")
			envv := pluginEnv("DEL", "a18lp", pod, "eth0")
			envv["EBPF_CNI_CRASH_AT"] = crash
			out, err := e.RunPlugin(crashBinary(t), envv, e.StdinConf(nil))
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("DEL at %s: %v, want SIGKILL; %s", crash, err, out)
			}
			ipInPod(t, pod, "link", "set", "lo", "down")
			t.Logf("after lo down:\n%s", strings.Join(a18Nexthops(t, pod), "\n"))
			if err := e.Del(pod, "a18lp", "eth0"); err != nil {
				t.Fatalf("DEL retry with lo down: %v", err)
			}
			if l := podLeftovers(t, pod); len(l) > 0 {
				t.Errorf("the pod after the retry:\n  %s", strings.Join(l, "\n  "))
			}
			e.AssertClean()
			ipInPod(t, pod, "link", "set", "lo", "up")
			a := e.AddAttachment(pod, "a18lp")
			t.Logf("after ADD again:\n%s\n%s", strings.Join(a18Nexthops(t, pod), "\n"), ipInPod(t, pod, "route", "show", "table", "all"))
			a18PingAll(t, "pod to node after ADD again", pod, testenv.NodeIP4, testenv.NodeIP6)
			if err := e.Del(pod, a.ID, "eth0"); err != nil {
				t.Fatal(err)
			}
			e.AssertClean()
		})
	}
}
