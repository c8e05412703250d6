package integration

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a22Batch runs `ip -batch -` in the pod with the given commands.
func a22Batch(t *testing.T, pod ns.NetNS, cmds []string) {
	t.Helper()
	c := exec.Command("nsenter", "--net="+pod.Path(), "ip", "-batch", "-")
	c.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("ip -batch in the pod: %v: %s", err, out)
	}
}

// a22Count counts the non-empty lines of ip's output in the pod.
func a22Count(t *testing.T, pod ns.NetNS, args ...string) int {
	n := 0
	for _, l := range strings.Split(ipInPod(t, pod, args...), "\n") {
		// fe80::/64 and multicast routes: the kernel's own, added as the
		// crowd's veths finish addrconf, whatever the ADD does.
		if strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "fe80::") && !strings.HasPrefix(l, "multicast") {
			n++
		}
	}
	return n
}

// a22Crowd fills the pod with veth pairs (up, addressed), routes per
// family through them and permanent neighbours.
func a22Crowd(t *testing.T, pod ns.NetNS, veths, routes int) {
	var cmds []string
	for i := 0; i < veths; i++ {
		cmds = append(cmds,
			fmt.Sprintf("link add crowd%da type veth peer name crowd%db", i, i),
			fmt.Sprintf("link set crowd%da up", i), fmt.Sprintf("link set crowd%db up", i),
			fmt.Sprintf("addr add 10.100.%d.1/24 dev crowd%da", i, i),
			fmt.Sprintf("addr add fd00:c0:%x::1/64 dev crowd%da", i, i),
			fmt.Sprintf("neigh add 10.100.%d.2 lladdr 02:00:00:00:%02x:02 dev crowd%da nud permanent", i, i%256, i))
	}
	for i := 0; i < routes; i++ {
		cmds = append(cmds,
			fmt.Sprintf("route add 172.%d.%d.0/24 via 10.100.%d.2 dev crowd%da", 16+i/250, i%250, i%veths, i%veths),
			fmt.Sprintf("route add fd00:d0:%x::/64 via fd00:c0:%x::2 dev crowd%da", i, i%veths, i%veths))
	}
	a22Batch(t, pod, cmds)
}

// a22Churn adds and removes routes in the pod until ctx ends, so the ADD's
// dumps of the pod's routes and links are interrupted (NLM_F_DUMP_INTR).
func a22Churn(ctx context.Context, pod ns.NetNS) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			var b strings.Builder
			for j := 0; j < 50; j++ {
				fmt.Fprintf(&b, "route replace 192.168.%d.0/24 via 10.100.0.2 dev crowd0a\nroute del 192.168.%d.0/24\n", j, j)
				fmt.Fprintf(&b, "route replace fd00:e0:%x::/64 via fd00:c0::2 dev crowd0a\nroute del fd00:e0:%x::/64\n", j, j)
				fmt.Fprintf(&b, "addr add 10.101.%d.1/24 dev crowd1b\naddr del 10.101.%d.1/24 dev crowd1b\n", j, j)
				fmt.Fprintf(&b, "link add churn%d type veth peer name churn%dp\nlink del churn%d\n", j, j, j)
			}
			c := exec.Command("nsenter", "--net="+pod.Path(), "ip", "-force", "-batch", "-")
			c.Stdin = strings.NewReader(b.String())
			_ = c.Run()
		}
	}()
	return done
}

// TestAttack22CrowdedPodNetns: the pod netns already holds veth pairs (up,
// addressed, a permanent neighbour each) and routes per family through
// them, so every dump the ADD reads spans many netlink messages: 50 veths
// and 200 routes, 120 veths and 3000 routes, and the latter with the
// pod's routes and a link changing all through six ADDs and DELs
// (interrupted dumps). The ADD succeeds, eth0 is whole, the pod's own links and routes
// are all still there after ADD and DEL, and DEL leaves nothing of ours.
func TestAttack22CrowdedPodNetns(t *testing.T) {
	for _, c := range []struct {
		veths, routes int
		churn         bool
		rounds        int
	}{{50, 200, false, 1}, {120, 3000, false, 1}, {120, 3000, true, 6}} {
		name := fmt.Sprintf("veths=%d,routes=%d,churn=%v", c.veths, c.routes, c.churn)
		t.Run(name, func(t *testing.T) {
			e := testenv.New(t)
			pod := podWithLoUp(t, e)
			a22Crowd(t, pod, c.veths, c.routes)
			links, r4, r6 := a22Count(t, pod, "link", "show"), a22Count(t, pod, "-4", "route", "show"), a22Count(t, pod, "-6", "route", "show")
			t.Logf("pod before ADD: %d link lines, %d v4 routes, %d v6 routes", links, r4, r6)
			ctx, stop := context.WithCancel(context.Background())
			done := closedChan()
			if c.churn {
				done = a22Churn(ctx, pod)
				defer func() { stop(); <-done }()
				time.Sleep(300 * time.Millisecond) // churning before the first ADD
				t.Logf("under the churn, %d of 20 dumps by ip were interrupted", a22Interrupted(pod, 20))
			}
			for round := 0; round < c.rounds; round++ {
				a22CrowdRound(t, e, pod, c.veths, c.routes, round)
			}
			stop()
			<-done
			if l2, a4, a6 := a22Count(t, pod, "link", "show"), a22Count(t, pod, "-4", "route", "show"), a22Count(t, pod, "-6", "route", "show"); l2 != links || a4 != r4 || a6 != r6 {
				t.Errorf("pod after ADD+DEL: %d link lines, %d v4, %d v6 routes; before %d, %d, %d", l2, a4, a6, links, r4, r6)
			}
			a22Gone(t, pod)
			e.AssertClean()
		})
	}
}

// closedChan is a channel already closed: nothing to wait for.
func closedChan() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// a22CrowdRound is one ADD and DEL in the crowded pod: the ADD succeeds,
// eth0 is whole, the pod's own routes still go their way, DEL succeeds.
func a22CrowdRound(t *testing.T, e *testenv.Env, pod ns.NetNS, veths, routes, round int) {
	t.Helper()
	id := testenv.RandName("a22crowd")
	e.CleanupDel(pod, id)
	res, err := a22Add(e, pod, id, "eth0")
	if err != nil {
		t.Fatalf("round %d: ADD in the crowded pod: %v", round, err)
	}
	a22Whole(t, e, fmt.Sprintf("crowded round %d", round), pod, "eth0", res)
	for i := round; i < routes; i += 37 {
		r := ipInPod(t, pod, "route", "get", fmt.Sprintf("172.%d.%d.9", 16+i/250, i%250))
		if !strings.Contains(r, fmt.Sprintf("dev crowd%da", i%veths)) {
			t.Errorf("round %d: after ADD the pod's route %d goes %q", round, i, r)
		}
	}
	if err := e.Del(pod, id, "eth0"); err != nil {
		t.Fatalf("round %d: DEL: %v", round, err)
	}
	a22Gone(t, pod)
}

// a22Interrupted counts how many of n route and link dumps by ip in the pod
// the kernel marked interrupted: proof the churn does what it is for.
func a22Interrupted(pod ns.NetNS, n int) int {
	k := 0
	for i := 0; i < n; i++ {
		what := []string{"route", "show", "table", "all"}
		if i%2 == 1 {
			what = []string{"link", "show"}
		}
		out, _ := exec.Command("nsenter", append([]string{"--net=" + pod.Path(), "ip"}, what...)...).CombinedOutput()
		if strings.Contains(string(out), "nterrupted") {
			k++
		}
	}
	return k
}
