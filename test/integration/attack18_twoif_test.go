// attack18: hostile review of the agent-less DEL's parked nexthops
// (docs/design.md, docs/performance.md round 14), from the outside.

package integration

import (
	"context"
	"net"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a18Nexthops is the pod's nexthop objects, one per line.
func a18Nexthops(t *testing.T, pod ns.NetNS) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(ipInPod(t, pod, "nexthop", "show"), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// a18AddIf adds ifname to the pod at 1.1.0 and fails the test on error.
func a18AddIf(t *testing.T, e *testenv.Env, pod ns.NetNS, id, ifname string) *current.Result {
	t.Helper()
	var res *current.Result
	must(t, e.InNode(func() error {
		r, err := e.CNI.AddNetworkList(context.Background(), e.ConfList("1.1.0"), e.RuntimeConf(pod, id, ifname))
		if err == nil {
			res, err = current.NewResultFromResult(r)
		}
		return err
	}))
	return res
}

// a18PingAll pings each address from src and reports failures as errors.
func a18PingAll(t *testing.T, what string, src ns.NetNS, ips ...net.IP) {
	t.Helper()
	for _, ip := range ips {
		if err := testenv.Ping(src, ip, 2); err != nil {
			t.Errorf("%s: ping %s: %v", what, ip, err)
		}
	}
}

// TestAttack18TwoIfDelOne: with lo up, DEL of net1 (the second interface)
// must leave eth0 whole: its nexthop objects not blackholes, its default
// route working (pod to node, v4 and v6), the node reaching its addresses.
// Then DEL of eth0 parks and sweeps with net1 gone first.
func TestAttack18TwoIfDelOne(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := podWithLoUp(t, e)
	e.CleanupDel(pod, "a18two")
	res0 := e.Add(pod, "a18two")
	t.Cleanup(func() { _ = e.Del(pod, "a18two", "net1") })
	res1 := a18AddIf(t, e, pod, "a18two", "net1")
	t.Logf("after both ADDs:\n%s\n%s", strings.Join(a18Nexthops(t, pod), "\n"), ipInPod(t, pod, "route", "show", "table", "all"))
	if err := e.Del(pod, "a18two", "net1"); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	nh := strings.Join(a18Nexthops(t, pod), "\n")
	if strings.Contains(nh, "blackhole") || strings.Contains(nh, "net1") {
		t.Errorf("the pod's nexthops after net1's DEL:\n%s\nwant no blackhole and nothing of net1", nh)
	}
	v4, v6 := testenv.PodIPs(t, res0)
	a18PingAll(t, "node to eth0 after net1's DEL", e.Node, v4, v6)
	a18PingAll(t, "pod to node (default route) after net1's DEL", pod, testenv.NodeIP4, testenv.NodeIP6)
	if r := ipInPod(t, pod, "-6", "route", "show", "default"); !strings.Contains(r, "eth0") {
		t.Errorf("pod's v6 default after net1's DEL: %q", r)
	}
	if r := ipInPod(t, pod, "-4", "route", "show", "default"); !strings.Contains(r, "eth0") {
		t.Errorf("pod's v4 default after net1's DEL: %q", r)
	}
	n4, _ := testenv.PodIPs(t, res1)
	if err := testenv.Ping(e.Node, n4, 1); err == nil {
		t.Errorf("node still reaches net1's %s after its DEL", n4)
	}
	if err := e.Del(pod, "a18two", "eth0"); err != nil {
		t.Fatalf("DEL eth0: %v", err)
	}
	if l := podLeftovers(t, pod); len(l) > 0 {
		t.Errorf("the pod after both DELs:\n  %s", strings.Join(l, "\n  "))
	}
	e.AssertClean()
}
