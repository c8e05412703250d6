// attack22: hostile review of "an ADD keeps its netlink sockets"
// (docs/performance.md round 16), from the outside: the ADD's ~20 requests
// now share one socket pair per netns, so ADDs into one pod side by side,
// many ADDs at once, crowded netns dumps and retried ADDs are the risks.

package integration

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a22Add is ADD of ifname in the env's network, returning the error.
func a22Add(e *testenv.Env, pod ns.NetNS, id, ifname string) (*current.Result, error) {
	var res *current.Result
	err := e.InNode(func() error {
		r, err := e.CNI.AddNetworkList(context.Background(), e.ConfList("1.1.0"), e.RuntimeConf(pod, id, ifname))
		if err == nil {
			res, err = current.NewResultFromResult(r)
		}
		return err
	})
	return res, err
}

// a22Whole checks an interface ADD made: up, both addresses in the pod,
// reachable from the node, the pod reaching the node through its gateway.
func a22Whole(t *testing.T, e *testenv.Env, what string, pod ns.NetNS, ifname string, res *current.Result) {
	t.Helper()
	v4, v6 := testenv.PodIPs(t, res)
	a := ipInPod(t, pod, "addr", "show", "dev", ifname)
	if !strings.Contains(a, "state UP") && !strings.Contains(a, ",UP") {
		t.Errorf("%s: %s not up:\n%s", what, ifname, a)
	}
	for _, ip := range []net.IP{v4, v6} {
		if !strings.Contains(a, ip.String()+"/") {
			t.Errorf("%s: %s lacks %s:\n%s", what, ifname, ip, a)
		}
	}
	a18PingAll(t, what+": node to "+ifname, e.Node, v4, v6)
	// The gateway exists nowhere on the node (docs/design.md): whole is its
	// permanent neighbour entry and a next hop through it on this interface.
	neigh := ipInPod(t, pod, "neigh", "show", "dev", ifname)
	nh := ipInPod(t, pod, "nexthop", "show") + ipInPod(t, pod, "route", "show", "table", "all")
	for _, ipc := range res.IPs {
		gw := ipc.Gateway
		if gw == nil {
			continue
		}
		if !strings.Contains(neigh, gw.String()+" lladdr") || !strings.Contains(neigh, "PERMANENT") {
			t.Errorf("%s: %s has no permanent neighbour for its gateway %s:\n%s", what, ifname, gw, neigh)
		}
		if !strings.Contains(nh, "via "+gw.String()+" dev "+ifname) {
			t.Errorf("%s: nothing routes via %s's gateway %s:\n%s", what, ifname, gw, nh)
		}
	}
	a18PingAll(t, what+": pod to node", pod, testenv.NodeIP4, testenv.NodeIP6)
}

// TestAttack22TwoIfOnePod: eth0 and net1 of one network in one pod (lo up),
// added at the same time (3 rounds) and one after the other: both ADDs
// succeed, both interfaces are whole and routed, DELs leave nothing.
func TestAttack22TwoIfOnePod(t *testing.T) {
	for _, mode := range []string{"concurrent", "concurrent", "concurrent", "serial"} {
		e := testenv.New(t)
		pod := podWithLoUp(t, e)
		id := testenv.RandName("a22two")
		e.CleanupDel(pod, id)
		t.Cleanup(func() { _ = e.Del(pod, id, "net1") })
		ifs := []string{"eth0", "net1"}
		res := make([]*current.Result, 2)
		errs := make([]error, 2)
		if mode == "serial" {
			for i, ifn := range ifs {
				res[i], errs[i] = a22Add(e, pod, id, ifn)
			}
		} else {
			var wg sync.WaitGroup
			for i, ifn := range ifs {
				wg.Add(1)
				go func(i int, ifn string) { defer wg.Done(); res[i], errs[i] = a22Add(e, pod, id, ifn) }(i, ifn)
			}
			wg.Wait()
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s: ADD %s: %v", mode, ifs[i], err)
			}
		}
		for i, ifn := range ifs {
			a22Whole(t, e, mode, pod, ifn, res[i])
		}
		for _, ifn := range []string{"net1", "eth0"} {
			if err := e.Del(pod, id, ifn); err != nil {
				t.Fatalf("%s: DEL %s: %v", mode, ifn, err)
			}
		}
		if l := podLeftovers(t, pod); len(l) > 0 {
			t.Errorf("%s: the pod after both DELs:\n  %s", mode, strings.Join(l, "\n  "))
		}
		e.AssertClean()
	}
}

// TestAttack22TwentyAdds: 20 ADDs at once, in 20 pods (lo up): each
// succeeds, each pod's eth0 is whole (up, addressed, its gateway's neighbour
// and next hop set, pinging the node, reached from the node), and the DELs leave nothing.
func TestAttack22TwentyAdds(t *testing.T) {
	e := testenv.New(t)
	const n = 20
	pods := make([]ns.NetNS, n)
	ids := make([]string, n)
	res := make([]*current.Result, n)
	errs := make([]error, n)
	for i := range pods {
		pods[i] = podWithLoUp(t, e)
		ids[i] = testenv.RandName("a22m")
		e.CleanupDel(pods[i], ids[i])
	}
	var wg sync.WaitGroup
	for i := range pods {
		wg.Add(1)
		go func(i int) { defer wg.Done(); res[i], errs[i] = a22Add(e, pods[i], ids[i], "eth0") }(i)
	}
	wg.Wait()
	for i := range pods {
		if errs[i] != nil {
			t.Errorf("ADD #%d: %v", i, errs[i])
			continue
		}
		a22Whole(t, e, "pod "+ids[i], pods[i], "eth0", res[i])
	}
	for i := range pods {
		if err := e.Del(pods[i], ids[i], "eth0"); err != nil {
			t.Errorf("DEL #%d: %v", i, err)
		}
	}
	e.AssertClean()
}
