// Attack (round 12 hostile review, attack15): one pod with two masquerading
// interfaces of the network (eth0, net1) reaching one server that closes
// first, from the same source port on both.

package integration

import (
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
)

// TestAttack15MasqTwoInterfaces: pod with eth0 and net1 (two ADDs, two
// addresses; net1's traffic routed out of net1 by a source rule in the pod).
// Both connect from port 62400 to one server that writes a line and closes
// first, then reopen the same tuples 50 ms later, 5 rounds. Both must be
// masqueraded (the server sees the node), on two different node ports (one
// tuple each), each keeping its node port across reopenings, and the server
// must refuse no SYN by PAWS.
func TestAttack15MasqTwoInterfaces(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	pod := a.NewPod()
	a.CleanupDel(pod, "a15two")
	t.Cleanup(func() { a.Del(pod, "a15two", "net1") })
	_, e6 := resultIPs(a.Add(pod, "a15two"))
	res, err := a.AddV("1.1.0", pod, "a15two", "net1")
	if err != nil {
		t.Fatalf("ADD net1: %v", err)
	}
	r1, err := types100.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	_, n6 := resultIPs(r1)
	var gw6 net.IP
	for _, ip := range r1.IPs {
		if ip.Address.IP.To4() == nil {
			gw6 = ip.Gateway
		}
	}
	if gw6 == nil {
		for _, rt := range r1.Routes {
			if rt.GW != nil && rt.GW.To4() == nil {
				gw6 = rt.GW
			}
		}
	}
	t.Logf("eth0 %s, net1 %s (gateway %v)", e6, n6, gw6)
	must(t, pod.Do(func(ns.NetNS) error {
		for _, args := range [][]string{
			{"-6", "rule", "add", "from", n6.String(), "table", "100"},
			{"-6", "route", "replace", gw6.String(), "dev", "net1", "table", "100"},
			{"-6", "route", "replace", "default", "via", gw6.String(), "dev", "net1", "table", "100"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				return fmt.Errorf("ip %v: %v: %s", args, err, out)
			}
		}
		return nil
	}))
	const port = 7460
	a15ServeSeen(t, lab.out, port)
	addr := hp(outsideIP6, port)
	paws0 := a15Paws(t, lab.out)
	firsts := map[string]string{}
	for i := 0; i < 5; i++ {
		for _, src := range []net.IP{e6, n6} {
			seen, took, err := a15DialSeen(pod, src, 62400, addr, a15CloseNow)
			if err != nil {
				var ss []byte
				pod.Do(func(ns.NetNS) error { ss, _ = exec.Command("ss", "-tanoi").CombinedOutput(); return nil })
				t.Fatalf("round %d from [%s]:62400: %v; the pod's sockets:\n%s", i, src, err, ss)
			}
			if f, ok := firsts[src.String()]; !ok {
				firsts[src.String()] = seen
			} else if f != seen {
				t.Errorf("round %d from [%s]:62400: the server saw %s, first %s", i, src, seen, f)
			}
			if took > 500*time.Millisecond {
				t.Errorf("round %d from [%s]:62400: connect took %v", i, src, took)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the server saw eth0's tuple as %s, net1's as %s", firsts[e6.String()], firsts[n6.String()])
	for src, seen := range firsts {
		if ua, err := net.ResolveUDPAddr("udp6", seen); err != nil || !ua.IP.Equal(labNodeA6) {
			t.Errorf("from %s the server saw %s, want the node %s", src, seen, labNodeA6)
		}
	}
	if firsts[e6.String()] == firsts[n6.String()] {
		t.Errorf("both interfaces' tuples got the same node port %s", firsts[e6.String()])
	}
	if d := a15Paws(t, lab.out) - paws0; d > 0 {
		t.Errorf("the server refused %d SYNs by PAWS", d)
	}
}
