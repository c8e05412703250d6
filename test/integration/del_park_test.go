// DEL parks the pod's nexthop objects on lo before the veth goes when the
// pod's lo is up, as runtimes bring it up (pkg/endpoint/nexthop.go
// parkNexthopsOn; issue 30): the pod netns keeps nothing of the interface.

package integration

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// ipInPod runs ip with args in the pod's netns.
func ipInPod(t *testing.T, pod ns.NetNS, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + pod.Path(), "ip"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s in the pod: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// podWithLoUp is a pod netns whose lo is up, as runtimes leave it.
func podWithLoUp(t *testing.T, e *testenv.Env) ns.NetNS {
	pod := e.NewPod()
	ipInPod(t, pod, "link", "set", "lo", "up")
	return pod
}

// podLeftovers lists what the pod netns holds of ebpf-cni's interfaces:
// nexthop objects, routes outside the local table, rules to pod tables.
func podLeftovers(t *testing.T, pod ns.NetNS) []string {
	t.Helper()
	var out []string
	for _, fam := range []string{"-4", "-6"} {
		for _, l := range strings.Split(ipInPod(t, pod, fam, "nexthop", "show"), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, "nexthop "+l)
			}
		}
		for _, l := range strings.Split(ipInPod(t, pod, fam, "route", "show", "table", "all"), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.Contains(l, "table local") && !strings.HasPrefix(l, "multicast") &&
				!strings.Contains(l, "dev lo proto kernel") {
				out = append(out, "route "+l)
			}
		}
		for _, l := range strings.Split(ipInPod(t, pod, fam, "rule", "show"), "\n") {
			if strings.Contains(l, "lookup 100") {
				out = append(out, "rule "+strings.TrimSpace(l))
			}
		}
	}
	return out
}

// TestDelParkedNexthops: with the pod's lo up, DEL of one of the pod's two
// interfaces leaves the other's routes working and nothing of its own (no
// blackhole nexthop, no route through one); DEL of the second leaves the
// pod netns with no nexthop object, route or rule of ours.
func TestDelParkedNexthops(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := podWithLoUp(t, e)
	e.CleanupDel(pod, "park")
	e.Add(pod, "park")
	rt1 := e.RuntimeConf(pod, "park", "net1")
	t.Cleanup(func() { _ = e.Del(pod, "park", "net1") })
	var res1 *current.Result
	must(t, e.InNode(func() error {
		r, err := e.CNI.AddNetworkList(context.Background(), e.ConfList("1.1.0"), rt1)
		if err == nil {
			res1, err = current.NewResultFromResult(r)
		}
		return err
	}))
	if err := e.Del(pod, "park", "eth0"); err != nil {
		t.Fatalf("DEL eth0: %v", err)
	}
	left := strings.Join(podLeftovers(t, pod), "\n  ")
	if strings.Contains(left, "blackhole") || strings.Contains(left, "eth0") {
		t.Errorf("the pod after eth0's DEL:\n  %s\nwant none of eth0's (no blackhole, nothing on eth0)", left)
	}
	v4, v6 := testenv.PodIPs(t, res1)
	for _, ip := range []net.IP{v4, v6} {
		if err := testenv.Ping(e.Node, ip, 2); err != nil {
			t.Errorf("node to net1's %s after eth0's DEL: %v", ip, err)
		}
	}
	if err := e.Del(pod, "park", "net1"); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	if l := podLeftovers(t, pod); len(l) > 0 {
		t.Errorf("the pod after both DELs:\n  %s", strings.Join(l, "\n  "))
	}
	e.AssertClean()
}

// TestCrashDelParked: a DEL killed (SIGKILL) after parking the pod's
// nexthop objects, before or after the veth's deletion, leaves blackhole
// routes in the pod; the runtime's retry removes them and everything else,
// and the attachment can be made again.
func TestCrashDelParked(t *testing.T) {
	for _, step := range []string{"del-parked", "del-veth"} {
		t.Run(step, func(t *testing.T) {
			bin := crashBinary(t)
			e := testenv.New(t)
			pod := podWithLoUp(t, e)
			e.CleanupDel(pod, "crashdel")
			e.Add(pod, "crashdel")
			envv := pluginEnv("DEL", "crashdel", pod, "eth0")
			envv["EBPF_CNI_CRASH_AT"] = step
			out, err := e.RunPlugin(bin, envv, e.StdinConf(nil))
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("DEL with EBPF_CNI_CRASH_AT=%s: %v, want killed by SIGKILL; stdout %s", step, err, out)
			}
			if left := strings.Join(podLeftovers(t, pod), "\n"); !strings.Contains(left, "blackhole") {
				t.Fatalf("the killed DEL parked nothing; the test would prove nothing. The pod:\n%s", left)
			}
			if err := e.Del(pod, "crashdel", "eth0"); err != nil {
				t.Fatalf("DEL again: %v", err)
			}
			if l := podLeftovers(t, pod); len(l) > 0 {
				t.Errorf("the pod after the retried DEL:\n  %s", strings.Join(l, "\n  "))
			}
			e.AssertClean()
			a := e.AddAttachment(pod, "crashdel")
			if err := testenv.Ping(pod, testenv.NodeIP4, 2); err != nil {
				t.Errorf("pod to node after ADD again: %v", err)
			}
			if err := e.Del(pod, a.ID, "eth0"); err != nil {
				t.Fatal(err)
			}
			e.AssertClean()
		})
	}
}
