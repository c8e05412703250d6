package integration

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a22Sysctl sets sysctls in the pod's netns.
func a22Sysctl(t *testing.T, pod ns.NetNS, kv ...string) {
	t.Helper()
	for _, s := range kv {
		if out, err := exec.Command("nsenter", "--net="+pod.Path(), "sysctl", "-w", s).CombinedOutput(); err != nil {
			t.Fatalf("sysctl %s in the pod: %v: %s", s, err, out)
		}
	}
}

// TestAttack22RetryIPv6Off: a dual-stack ADD into a pod whose IPv6 is
// disabled (all and default), so a request inside the pod side is refused
// by the kernel on the kept pod socket, or the plugin copes: either the ADD
// fails and leaves nothing, and with IPv6 back on the retry works, or it
// succeeds and eth0's IPv4 works. Twice, in one env.
func TestAttack22RetryIPv6Off(t *testing.T) {
	e := testenv.New(t)
	for round := 0; round < 2; round++ {
		pod := podWithLoUp(t, e)
		id := testenv.RandName("a22v6")
		e.CleanupDel(pod, id)
		a22Sysctl(t, pod, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
		res, err := a22Add(e, pod, id, "eth0")
		t.Logf("round %d: ADD with IPv6 off: %v (code %d)", round, err, testenv.ErrCode(err))
		if err == nil {
			v4, _ := testenv.PodIPs(t, res)
			a18PingAll(t, "node to eth0 (v4) with IPv6 off", e.Node, v4)
			a18PingAll(t, "pod to node (v4) with IPv6 off", pod, testenv.NodeIP4)
			if err := e.Del(pod, id, "eth0"); err != nil {
				t.Fatalf("round %d: DEL: %v", round, err)
			}
			continue
		}
		// The kernel says only EACCES: the error names the cause.
		if !strings.Contains(err.Error(), "IPv6 is disabled") {
			t.Errorf("round %d: ADD's error %q does not say IPv6 is disabled in the pod", round, err)
		}
		e.AssertNothingOf(id)
		if l := podLeftovers(t, pod); len(l) > 0 {
			t.Errorf("round %d: the pod after the failed ADD:\n  %s", round, strings.Join(l, "\n  "))
		}
		a22Gone(t, pod)
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Errorf("round %d: DEL of the failed ADD: %v", round, err)
		}
		a22Sysctl(t, pod, "net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.default.disable_ipv6=0")
		res, err = a22Add(e, pod, id, "eth0")
		if err != nil {
			t.Fatalf("round %d: retried ADD with IPv6 on: %v", round, err)
		}
		a22Whole(t, e, "retry with IPv6 on", pod, "eth0", res)
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Fatalf("round %d: DEL: %v", round, err)
		}
	}
	e.AssertClean()
}
