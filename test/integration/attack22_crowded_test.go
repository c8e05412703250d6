package integration

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"

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
		if strings.TrimSpace(l) != "" {
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
				fmt.Fprintf(&b, "link set crowd1b mtu %d\n", 1400+(i+j)%50)
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
// pod's routes and a link changing all through the ADD (interrupted
// dumps). The ADD succeeds, eth0 is whole, the pod's own links and routes
// are all still there after ADD and DEL, and DEL leaves nothing of ours.
func TestAttack22CrowdedPodNetns(t *testing.T) {
	for _, c := range []struct {
		veths, routes int
		churn         bool
	}{{50, 200, false}, {120, 3000, false}, {120, 3000, true}} {
		name := fmt.Sprintf("veths=%d,routes=%d,churn=%v", c.veths, c.routes, c.churn)
		t.Run(name, func(t *testing.T) {
			e := testenv.New(t)
			pod := podWithLoUp(t, e)
			a22Crowd(t, pod, c.veths, c.routes)
			links, r4, r6 := a22Count(t, pod, "link", "show"), a22Count(t, pod, "-4", "route", "show"), a22Count(t, pod, "-6", "route", "show")
			t.Logf("pod before ADD: %d link lines, %d v4 routes, %d v6 routes", links, r4, r6)
			id := testenv.RandName("a22crowd")
			e.CleanupDel(pod, id)
			ctx, stop := context.WithCancel(context.Background())
			var done <-chan struct{} = closedChan()
			if c.churn {
				done = a22Churn(ctx, pod)
			}
			res, err := a22Add(e, pod, id, "eth0")
			stop()
			<-done
			if err != nil {
				t.Fatalf("ADD in the crowded pod: %v", err)
			}
			a22Whole(t, e, "crowded", pod, "eth0", res)
			for i := 0; i < c.routes; i += 37 {
				r := ipInPod(t, pod, "route", "get", fmt.Sprintf("172.%d.%d.9", 16+i/250, i%250))
				if !strings.Contains(r, fmt.Sprintf("dev crowd%da", i%c.veths)) {
					t.Errorf("after ADD the pod's route %d goes %q", i, r)
				}
			}
			if err := e.Del(pod, id, "eth0"); err != nil {
				t.Fatalf("DEL: %v", err)
			}
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
