// The pod's nexthop objects (pkg/endpoint/nexthop.go) beside another
// tool's.

package integration

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestIntegrityForeignNexthopID: the pod netns already has a nexthop object
// (another tool's) with the id ADD would give eth0's gateway (64 x table
// 10000+ifindex, + 1). ADD is refused (7, naming the id), the foreign
// object is left as it was (never replaced: its routes would move), and
// DEL leaves nothing behind.
func TestIntegrityForeignNexthopID(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	var id int
	must(t, pod.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		last := 0
		for _, l := range links {
			last = max(last, l.Attrs().Index)
		}
		// A fresh netns: the next device, eth0 (born in the pod), takes
		// the next index.
		id = (10000+last+1)*64 + 1
		return nil
	}))
	ipIn := func(args ...string) (string, error) {
		out, err := exec.Command("nsenter", append([]string{"--net=" + pod.Path(), "ip"}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := ipIn("link", "set", "lo", "up"); err != nil { // a blackhole nexthop sits on lo
		t.Fatalf("lo up: %v: %s", err, out)
	}
	if out, err := ipIn("nexthop", "add", "id", fmt.Sprint(id), "blackhole"); err != nil {
		t.Fatalf("foreign nexthop %d: %v: %s", id, err, out)
	}
	e.CleanupDel(pod, "fnh")
	_, err := e.AddV("1.1.0", pod, "fnh", "eth0")
	libcniErr(t, "ADD beside a foreign nexthop with eth0's id", err, codeInvalidConfig, "nexthop id", fmt.Sprint(id))
	if out, err := ipIn("nexthop", "show", "id", fmt.Sprint(id)); err != nil || !strings.Contains(out, "blackhole") {
		t.Errorf("the foreign nexthop %d after the refused ADD: %q (%v), want it unchanged (blackhole)", id, out, err)
	}
	if err := e.Del(pod, "fnh", "eth0"); err != nil {
		t.Fatalf("DEL after the refused ADD: %v", err)
	}
	e.AssertClean()
}
