// The agent's reconcile runs 2 s after one of our host veths disappears,
// whatever name it had then: a veth an operator renamed is still ours (its
// ifindex has a cni_links entry), and its pod gone without DEL must not
// wait for the next periodic run (a minute by default) to give its address
// back.

package integration

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestReconcileRenamedVethDeleted: the agent runs with its default
// reconcile interval (1 min); a pod's host veth is renamed ("rcren0", not
// ebpf…) and then deleted, as when the pod goes without DEL. Within 10 s
// the agent logs a reconcile for the deleted link and the pod's record,
// lease, endpoint entries and links entry are gone.
//
// Red before: the agent kicked its reconcile only for links named ebpf…,
// so the record and lease stayed until the minute's timer.
func TestReconcileRenamedVethDeleted(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	defer ag.Stop()
	p := a26Add(t, e, "rcren")
	a26Rename(t, e, p, "rcren0")
	if err := e.InNode(func() error {
		l, err := netlink.LinkByIndex(p.idx)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}); err != nil {
		t.Fatalf("delete the renamed host veth: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := os.Stat(e.RecordPath(p.id, "eth0"))
		if os.IsNotExist(err) && len(e.ReservationsOf(p.id)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the renamed host veth was deleted, the record (stat: %v) or lease %v of %s is left; agent log:\n%s",
				err, e.ReservationsOf(p.id), p.id, ag.Logs())
		}
	}
	if !strings.Contains(ag.Logs(), "reconcile (link deleted)") {
		t.Errorf("the agent's log has no reconcile for the deleted link:\n%s", ag.Logs())
	}
	a26AssertEntries(t, e, p, "the reconcile")
}
