package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack31cDelKilledVethRemovedOrders (attack31c, on depth31's DEL
// that removes its veth's cni_links entry before it releases the pod's
// netns lock): a pod with eth0 and net1, the agent alive (DEL hands its
// veth off), eth0's DEL killed with SIGKILL at del-veth-removed (its veth
// renamed ebpz<ifindex>, its cni_links entry still there, the lock
// released by the kill). TestAttack30cDelKilledAfterHandOff lets the agent
// reap first; here the verbs are held (the agent waits) while the rest
// runs in another order, and the agent reaps only after:
//
//   - "net1-reap-retry": net1's DEL, the reap, eth0's retried DEL;
//   - "net1-retry-reap": net1's DEL, eth0's retried DEL, the reap;
//   - "retry-add-reap": eth0's retried DEL, an ADD of eth0 again (same
//     container), the reap, then both DELs;
//   - "add-reap": an ADD of eth0 again over the killed DEL's record (refused:
//     the attachment is there until a DEL ends; it must change nothing),
//     the reap, eth0's retried DEL, an ADD of eth0 again, then both DELs.
//
// After the reap the handed-off veth, its pins and its link entry are gone
// while an eth0 ADDed again keeps its own (entry, programs); once every
// DEL returned the pod's cni_netns entry is gone, nothing is left in the
// pod or the node (AssertClean: pins, entries, records, leases, veths).
//
//	go test -count=1 -run 'TestAttack31cDelKilledVethRemovedOrders$' -v ./test/integration/
func TestAttack31cDelKilledVethRemovedOrders(t *testing.T) {
	t.Parallel()
	for _, order := range []string{"net1-reap-retry", "net1-retry-reap", "retry-add-reap", "add-reap"} {
		t.Run(order, func(t *testing.T) { a31cDelKilledOrder(t, order) })
	}
}

func a31cDelKilledOrder(t *testing.T, order string) {
	e := testenv.New(t)
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	defer ag.Stop()
	pod, id := podWithTwoIfs(t, e, "a31ck")
	cookie := e.NetnsCookieOf(pod)
	hostIf, eth0 := e.HostVeth(id)
	hold := e.HoldVerbs() // the agent waits: no reap until released
	killDelAt(t, e, pod, id, "eth0", "del-veth-removed")
	handed := state.HandedOffName(eth0)
	if !e.NodeLinkExists(handed) {
		t.Fatalf("eth0's host veth (ifindex %d) is not there as %s after the killed DEL, the agent held", eth0, handed)
	}
	if _, err := e.Maps().Links().Lookup(eth0); err != nil {
		t.Fatalf("eth0's cni_links entry (ifindex %d) is gone already at del-veth-removed: %v", eth0, err)
	}
	reap := func() {
		t.Helper()
		hold()
		waitHandedOffReaped(t, e, eth0, order+": the verbs were released", ag.Logs)
	}
	del := func(ifn, what string) {
		t.Helper()
		if err := e.Del(pod, id, ifn); err != nil {
			t.Fatalf("%s: %s: %v", order, what, err)
		}
	}
	readd := func() int {
		t.Helper()
		if _, err := a22Add(e, pod, id, "eth0"); err != nil {
			t.Fatalf("%s: ADD eth0 again: %v", order, err)
		}
		idx := e.HostIfindex(hostIf)
		if idx == eth0 {
			t.Fatalf("%s: eth0 ADDed again at the handed-off veth's ifindex %d", order, idx)
		}
		return idx
	}
	var again int // ifindex of eth0's host veth ADDed again, 0 when none
	switch order {
	case "net1-reap-retry":
		del("net1", "DEL net1")
		reap()
		del("eth0", "DEL eth0 retry")
	case "net1-retry-reap":
		del("net1", "DEL net1")
		del("eth0", "DEL eth0 retry")
		reap()
	case "retry-add-reap":
		del("eth0", "DEL eth0 retry")
		again = readd()
		reap()
	case "add-reap":
		if _, err := a22Add(e, pod, id, "eth0"); err == nil || !strings.Contains(err.Error(), "exists already") {
			t.Fatalf("%s: ADD eth0 over the killed DEL's record: %v, want refused (exists already)", order, err)
		}
		if !e.NodeLinkExists(handed) {
			t.Errorf("%s: the refused ADD removed the handed-off veth %s", order, handed)
		}
		reap()
		del("eth0", "DEL eth0 retry")
		again = readd()
	}
	if again != 0 {
		// The reap of the old veth must leave the new one alone.
		if _, err := e.Maps().Links().Lookup(again); err != nil {
			t.Errorf("%s: eth0 ADDed again (ifindex %d) lost its cni_links entry to the reap of %s: %v", order, again, handed, err)
		}
		// With the agent free (add-reap) it moves the new veth to tcx
		// one hook at a time, and ProgIDs counts tcx programs alone once
		// there is one: wait for the move to end (a program the reap
		// took stays missing).
		ids := e.ProgIDs(again)
		for deadline := time.Now().Add(10 * time.Second); len(ids) != 2 && time.Now().Before(deadline); ids = e.ProgIDs(again) {
			time.Sleep(20 * time.Millisecond)
		}
		if len(ids) != 2 {
			t.Errorf("%s: eth0 ADDed again (ifindex %d) runs %d programs after the reap of %s, want 2 (state %q)", order, again, len(ids), handed, e.AttachState(hostIf))
		}
		if err := e.Check(pod, id, "eth0"); err != nil {
			t.Errorf("%s: CHECK eth0 ADDed again, after the reap: %v", order, err)
		}
		if _, err := testenv.LookupNetns(e.Maps(), cookie); err != nil {
			t.Errorf("%s: the pod's cni_netns entry is gone with eth0 and net1 both attached: %v", order, err)
		}
		del("eth0", "DEL eth0 (ADDed again)")
		del("net1", "DEL net1")
	}
	if v, err := testenv.LookupNetns(e.Maps(), cookie); err == nil {
		t.Errorf("%s: the pod's cni_netns entry (cookie %d) is left after every DEL returned: %+v", order, cookie, v)
	}
	if l := podLeftovers(t, pod); len(l) > 0 {
		t.Errorf("%s: the pod after the DELs:\n  %s", order, strings.Join(l, "\n  "))
	}
	e.AssertClean()
}
