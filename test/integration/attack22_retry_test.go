package integration

import (
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a22RetryIPAM is the env's IPAM with one extra route per family, which a
// pod route can make the ADD refuse midway (docs/design.md: a route the pod
// already routes elsewhere is refused, code 7).
func a22RetryIPAM(e *testenv.Env) map[string]any {
	return map[string]any{
		"type": "host-local", "dataDir": e.DataDir,
		"ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}, {{"subnet": testenv.PodSubnet6}}},
		"routes": []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}, {"dst": "10.77.0.0/16"}, {"dst": "fd00:77::/64"}},
	}
}

// TestAttack22RetryAfterMidwayError: an ADD refused midway (the pod's
// eth0 taken by another plugin's veth; the pod already routing the IPAM
// route 10.77.0.0/16 through a side link) returns an error and leaves
// nothing of ours; once the cause is gone, the runtime's retry with the
// same container ID succeeds and eth0 is whole; DEL then leaves nothing.
// Twice each, on one kept node side, so a socket left in a bad state by
// the error would show on the retry.
func TestAttack22RetryAfterMidwayError(t *testing.T) {
	causes := map[string]struct {
		make, undo []string
		code       uint   // the CNI error code the first ADD returns
		names      string // what its message names
	}{
		"ifname-taken": {
			make: []string{"link add eth0 type veth peer name a22peer", "link set eth0 up", "addr add 10.254.0.2/24 dev eth0"},
			undo: []string{"link del eth0"},
			code: 4, names: "CNI_IFNAME eth0",
		},
		"route-taken": {
			make: []string{"link add side0 type veth peer name side1", "link set side0 up", "route add 10.77.0.0/16 dev side0"},
			undo: []string{"route del 10.77.0.0/16 dev side0"},
			code: 7, names: "10.77.0.0/16",
		},
	}
	for name, c := range causes {
		c := c
		t.Run(name, func(t *testing.T) {
			e := testenv.New(t)
			e.IPAM = a22RetryIPAM(e)
			for round := 0; round < 2; round++ {
				pod := podWithLoUp(t, e)
				id := testenv.RandName("a22rt")
				e.CleanupDel(pod, id)
				a22Batch(t, pod, c.make)
				before := podLeftovers(t, pod)
				_, err := a22Add(e, pod, id, "eth0")
				if err == nil {
					t.Fatalf("round %d: ADD with the cause in place succeeded", round)
				}
				t.Logf("round %d: first ADD: %v (code %d)", round, err, testenv.ErrCode(err))
				if testenv.ErrCode(err) != c.code || !strings.Contains(err.Error(), c.names) {
					t.Errorf("round %d: first ADD's error %q (code %d), want code %d naming %q", round, err,
						testenv.ErrCode(err), c.code, c.names)
				}
				e.AssertNothingOf(id)
				if after := podLeftovers(t, pod); strings.Join(after, "\n") != strings.Join(before, "\n") {
					t.Errorf("round %d: the pod after the failed ADD:\n  %s\nbefore it:\n  %s", round,
						strings.Join(after, "\n  "), strings.Join(before, "\n  "))
				}
				a22Batch(t, pod, c.undo)
				res, err := a22Add(e, pod, id, "eth0")
				if err != nil {
					t.Fatalf("round %d: retried ADD: %v", round, err)
				}
				a22Whole(t, e, name+" retry", pod, "eth0", res)
				if r := ipInPod(t, pod, "route", "get", "10.77.1.1"); !strings.Contains(r, "dev eth0") {
					t.Errorf("round %d: after the retry 10.77.1.1 goes %q, want eth0", round, r)
				}
				if err := e.Del(pod, id, "eth0"); err != nil {
					t.Fatalf("round %d: DEL: %v", round, err)
				}
				a22Gone(t, pod)
			}
			e.AssertClean()
		})
	}
}

// a22Gone fails if the pod still has an eth0.
func a22Gone(t *testing.T, pod ns.NetNS) {
	t.Helper()
	if out := ipInPod(t, pod, "-br", "link"); strings.Contains(out, "eth0") {
		t.Errorf("eth0 still in the pod after DEL:\n%s", out)
	}
}

// TestAddHostNameTaken: a link on the node with the host end's name that no
// record of ours names (another tool's, or one left by hand) refuses the ADD
// with code 4 naming it; the link is left alone, nothing of ours is made, and
// once it is gone the runtime's retry works.
func TestAddHostNameTaken(t *testing.T) {
	e := testenv.New(t)
	pod := podWithLoUp(t, e)
	id := testenv.RandName("hname")
	e.CleanupDel(pod, id)
	host := state.HostIfName(id, "eth0")
	a22Batch(t, e.Node, []string{"link add " + host + " type veth peer name " + testenv.RandName("hnp")})
	t.Cleanup(func() {
		e.InNode(func() error {
			if l, err := netlink.LinkByName(host); err == nil {
				return netlink.LinkDel(l)
			}
			return nil
		})
	})
	_, err := a22Add(e, pod, id, "eth0")
	if err == nil {
		t.Fatal("ADD with the host end's name taken succeeded")
	}
	if testenv.ErrCode(err) != 4 || !strings.Contains(err.Error(), host) {
		t.Errorf("ADD's error %q (code %d), want code 4 naming %s", err, testenv.ErrCode(err), host)
	}
	if !e.NodeLinkExists(host) {
		t.Errorf("the ADD removed the node's link %s, which is not its own", host)
	}
	a22Gone(t, pod)
	a22Batch(t, e.Node, []string{"link del " + host})
	e.AssertNothingOf(id)
	res, err := a22Add(e, pod, id, "eth0")
	if err != nil {
		t.Fatalf("retried ADD: %v", err)
	}
	a22Whole(t, e, "retry", pod, "eth0", res)
	if err := e.Del(pod, id, "eth0"); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	e.AssertClean()
}
