package integration

import (
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a18Has reports whether the pod has a nexthop object line starting "id N ".
func a18Has(t *testing.T, pod ns.NetNS, id string) string {
	t.Helper()
	for _, l := range a18Nexthops(t, pod) {
		if strings.HasPrefix(l, "id "+id+" ") {
			return l
		}
	}
	return ""
}

// TestAttack18LoDownBeforeDel: the pod brings lo down between ADD and DEL
// (of one of two interfaces, then the other): DEL must still remove
// everything of the interface and leave the other working.
func TestAttack18LoDownBeforeDel(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := podWithLoUp(t, e)
	e.CleanupDel(pod, "a18lo")
	t.Cleanup(func() { _ = e.Del(pod, "a18lo", "net1") })
	e.Add(pod, "a18lo")
	r1 := a18AddIf(t, e, pod, "a18lo", "net1")
	ipInPod(t, pod, "link", "set", "lo", "down")
	if err := e.Del(pod, "a18lo", "eth0"); err != nil {
		t.Fatalf("DEL eth0 with lo down: %v", err)
	}
	left := strings.Join(podLeftovers(t, pod), "\n  ")
	if strings.Contains(left, "blackhole") || strings.Contains(left, "eth0") || strings.Contains(left, "10002") {
		t.Errorf("the pod after eth0's DEL with lo down:\n  %s", left)
	}
	v4, v6 := testenv.PodIPs(t, r1)
	a18PingAll(t, "node to net1 after eth0's DEL with lo down", e.Node, v4, v6)
	if err := e.Del(pod, "a18lo", "net1"); err != nil {
		t.Fatalf("DEL net1 with lo down: %v", err)
	}
	if l := podLeftovers(t, pod); len(l) > 0 {
		t.Errorf("the pod after both DELs with lo down:\n  %s", strings.Join(l, "\n  "))
	}
	e.AssertClean()
}

// TestAttack18HostileNexthops: before DEL of eth0 the pod makes its own
// nexthop objects in ids next to ours: a blackhole of another protocol in
// eth0's range, a blackhole of protocol 199 in net1's range, and a gateway
// object through net1 (protocol static) in eth0's range that its own route
// to the node uses. DEL must succeed, leave them (they are not eth0's), and
// net1 and the pod's route through it must keep working.
func TestAttack18HostileNexthops(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := podWithLoUp(t, e)
	e.CleanupDel(pod, "a18ho")
	t.Cleanup(func() { _ = e.Del(pod, "a18ho", "net1") })
	e.Add(pod, "a18ho")
	r1 := a18AddIf(t, e, pod, "a18ho", "net1")
	base0, base1 := "", ""
	for _, l := range a18Nexthops(t, pod) {
		f := strings.Fields(l)
		if len(f) > 4 && strings.Contains(l, " dev eth0 ") && base0 == "" {
			base0 = f[1]
		}
		if len(f) > 4 && strings.Contains(l, " dev net1 ") && base1 == "" {
			base1 = f[1]
		}
	}
	if base0 == "" || base1 == "" {
		t.Fatalf("no nexthop objects of ours found:\n%s", strings.Join(a18Nexthops(t, pod), "\n"))
	}
	near := func(b string, d int) string {
		var n int
		for _, c := range b {
			n = n*10 + int(c-'0')
		}
		return strconv.Itoa(n + d)
	}
	bhOther, bh199, gwNet1 := near(base0, 2), near(base1, 2), near(base0, 3)
	ipInPod(t, pod, "nexthop", "add", "id", bhOther, "blackhole", "proto", "static")
	ipInPod(t, pod, "nexthop", "add", "id", bh199, "blackhole", "proto", "199")
	ipInPod(t, pod, "nexthop", "add", "id", gwNet1, "via", "10.250.0.1", "dev", "net1", "onlink", "proto", "static")
	ipInPod(t, pod, "route", "add", testenv.NodeIP4.String()+"/32", "nhid", gwNet1)
	t.Logf("before DEL:\n%s", strings.Join(a18Nexthops(t, pod), "\n"))
	if err := e.Del(pod, "a18ho", "eth0"); err != nil {
		t.Fatalf("DEL eth0 beside the pod's own objects: %v", err)
	}
	t.Logf("after DEL:\n%s", strings.Join(a18Nexthops(t, pod), "\n"))
	for _, id := range []string{bhOther, bh199, gwNet1} {
		if a18Has(t, pod, id) == "" {
			t.Errorf("DEL of eth0 removed the pod's own nexthop object %s", id)
		}
	}
	if l := a18Has(t, pod, gwNet1); l != "" && !strings.Contains(l, "net1") {
		t.Errorf("the pod's own object through net1 is now %q", l)
	}
	for _, l := range a18Nexthops(t, pod) {
		if strings.Contains(l, "eth0") || (strings.Contains(l, "blackhole") && !strings.HasPrefix(l, "id "+bhOther+" ") && !strings.HasPrefix(l, "id "+bh199+" ")) {
			t.Errorf("left of eth0 after its DEL: %s", l)
		}
	}
	v4, v6 := testenv.PodIPs(t, r1)
	a18PingAll(t, "node to net1 after eth0's DEL", e.Node, v4, v6)
	a18PingAll(t, "pod to node by its own route through net1", pod, testenv.NodeIP4)
	if err := e.Del(pod, "a18ho", "net1"); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	t.Logf("after net1's DEL:\n%s", strings.Join(a18Nexthops(t, pod), "\n"))
	if a18Has(t, pod, bhOther) == "" {
		t.Errorf("DEL of net1 removed the pod's own blackhole %s of protocol static", bhOther)
	}
	e.AssertClean()
}
