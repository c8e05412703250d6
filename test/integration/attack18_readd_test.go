package integration

import (
	"errors"
	current "github.com/containernetworking/cni/pkg/types/100"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack18DelThenAdd: DEL then ADD at once of the same container and
// ifname in the same netns (lo up): the new interface's routes must work,
// no parked blackhole shadowing them. Also after a DEL killed with its
// objects parked (before and after the veth's deletion) followed by the
// runtime's retried DEL and the ADD at once.
func TestAttack18DelThenAdd(t *testing.T) {
	for _, crash := range []string{"", "del-parked", "del-veth"} {
		t.Run("crash="+crash, func(t *testing.T) {
			e := testenv.New(t)
			pod := podWithLoUp(t, e)
			e.CleanupDel(pod, "a18re")
			e.Add(pod, "a18re")
			if crash != "" {
				envv := pluginEnv("DEL", "a18re", pod, "eth0")
				envv["EBPF_CNI_CRASH_AT"] = crash
				out, err := e.RunPlugin(crashBinary(t), envv, e.StdinConf(nil))
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Fatalf("DEL at %s: %v, want SIGKILL; %s", crash, err, out)
				}
			}
			if err := e.Del(pod, "a18re", "eth0"); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			res := e.Add(pod, "a18re")
			nh := strings.Join(a18Nexthops(t, pod), "\n")
			if strings.Contains(nh, "blackhole") {
				t.Errorf("the pod's nexthops after DEL+ADD:\n%s", nh)
			}
			v4, v6 := testenv.PodIPs(t, res)
			a18PingAll(t, "node to the new eth0", e.Node, v4, v6)
			a18PingAll(t, "pod to node after DEL+ADD", pod, testenv.NodeIP4, testenv.NodeIP6)
			if err := e.Del(pod, "a18re", "eth0"); err != nil {
				t.Fatalf("DEL at the end: %v", err)
			}
			if l := podLeftovers(t, pod); len(l) > 0 {
				t.Errorf("the pod after the last DEL:\n  %s", strings.Join(l, "\n  "))
			}
			e.AssertClean()
		})
	}
}

// TestAttack18CrashThenAdd: a DEL killed after the veth's deletion leaves
// blackholes of the old interface's ids; an ADD of the same container and
// ifname at once, before any retried DEL, must give working routes (the
// kernel's table and ids may be the same as the old ones).
func TestAttack18CrashThenAdd(t *testing.T) {
	e := testenv.New(t)
	pod := podWithLoUp(t, e)
	e.CleanupDel(pod, "a18cr")
	e.Add(pod, "a18cr")
	envv := pluginEnv("DEL", "a18cr", pod, "eth0")
	envv["EBPF_CNI_CRASH_AT"] = "del-veth"
	out, err := e.RunPlugin(crashBinary(t), envv, e.StdinConf(nil))
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("DEL at del-veth: %v, want SIGKILL; %s", err, out)
	}
	t.Logf("after the killed DEL:\n%s", strings.Join(a18Nexthops(t, pod), "\n"))
	res, err := e.AddV("1.1.0", pod, "a18cr", "eth0")
	if err != nil {
		t.Logf("ADD after the killed DEL refused: %v (then the runtime retries DEL)", err)
		if err := e.Del(pod, "a18cr", "eth0"); err != nil {
			t.Fatalf("DEL retry: %v", err)
		}
		if l := podLeftovers(t, pod); len(l) > 0 {
			t.Errorf("the pod after the retried DEL:\n  %s", strings.Join(l, "\n  "))
		}
		e.AssertClean()
		return
	}
	r, err := current.NewResultFromResult(res)
	must(t, err)
	t.Logf("after ADD:\n%s\n%s", strings.Join(a18Nexthops(t, pod), "\n"), ipInPod(t, pod, "route", "show", "table", "all"))
	v4, v6 := testenv.PodIPs(t, r)
	a18PingAll(t, "node to the new eth0", e.Node, v4, v6)
	a18PingAll(t, "pod to node", pod, testenv.NodeIP4, testenv.NodeIP6)
	if err := e.Del(pod, "a18cr", "eth0"); err != nil {
		t.Fatalf("DEL at the end: %v", err)
	}
	if l := podLeftovers(t, pod); len(l) > 0 {
		t.Errorf("the pod after the last DEL:\n  %s", strings.Join(l, "\n  "))
	}
	e.AssertClean()
}

// TestAttack18CrashThenOtherIf: a DEL of eth0 killed after the veth's
// deletion leaves eth0's ids parked as blackholes; an ADD of net1 in the
// same pod before the retry may get eth0's old table and ids. net1 must
// work, and the retried DEL of eth0 must leave net1 whole.
func TestAttack18CrashThenOtherIf(t *testing.T) {
	e := testenv.New(t)
	pod := podWithLoUp(t, e)
	e.CleanupDel(pod, "a18oi")
	t.Cleanup(func() { _ = e.Del(pod, "a18oi", "net1") })
	e.Add(pod, "a18oi")
	envv := pluginEnv("DEL", "a18oi", pod, "eth0")
	envv["EBPF_CNI_CRASH_AT"] = "del-veth"
	out, err := e.RunPlugin(crashBinary(t), envv, e.StdinConf(nil))
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("DEL at del-veth: %v, want SIGKILL; %s", err, out)
	}
	r := a18AddIf(t, e, pod, "a18oi", "net1")
	t.Logf("after net1's ADD:\n%s\n%s%s", strings.Join(a18Nexthops(t, pod), "\n"),
		ipInPod(t, pod, "route", "show", "table", "all"), ipInPod(t, pod, "rule", "show"))
	v4, v6 := testenv.PodIPs(t, r)
	a18PingAll(t, "node to net1 after its ADD", e.Node, v4, v6)
	if err := e.Del(pod, "a18oi", "eth0"); err != nil {
		t.Fatalf("DEL eth0 retry: %v", err)
	}
	t.Logf("after eth0's retried DEL:\n%s\n%s%s", strings.Join(a18Nexthops(t, pod), "\n"),
		ipInPod(t, pod, "route", "show", "table", "all"), ipInPod(t, pod, "rule", "show"))
	if nh := strings.Join(a18Nexthops(t, pod), "\n"); strings.Contains(nh, "blackhole") || !strings.Contains(nh, "net1") {
		t.Errorf("the pod's nexthops after eth0's retried DEL:\n%s\nwant net1's, no blackhole", nh)
	}
	a18PingAll(t, "node to net1 after eth0's retried DEL", e.Node, v4, v6)
	if err := e.Del(pod, "a18oi", "net1"); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	if l := podLeftovers(t, pod); len(l) > 0 {
		t.Errorf("the pod after the last DEL:\n  %s", strings.Join(l, "\n  "))
	}
	e.AssertClean()
}
