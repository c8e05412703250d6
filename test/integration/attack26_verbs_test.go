// Attack26 (black box), more verbs against a renamed or replaced host
// veth: DEL with the agent alive (DEL hands veths off to it), CHECK,
// uninstall after a third party took our veth's name and old ifindex, the
// agent's periodic reconcile after a rename (a26AgentAfterRename; its tests
// are red: attack26_links_repro_test.go).
// Helpers: attack26_links_test.go.

package integration

import (
	"os"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack26RenamedCheck: our veth renamed, a third party's link under
// the old name: CHECK (whatever it answers) leaves that link as made, and
// our renamed veth. (It failed "host veth ... is gone: the link under its
// name ... is not the attachment's" though the veth is there, renamed;
// since byname26 it names the rename: TestCheckRenamedHostVeth.)
func TestAttack26RenamedCheck(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "a26ren-ck")
	a26Rename(t, e, p, "a26op0")
	fidx := a26Foreign(t, e, p.name, 0, "")
	err := e.Check(p.pod, p.id, "eth0")
	t.Logf("CHECK: %v", err)
	a26AssertForeign(t, e, fidx, p.name, "", "CHECK")
	if l := a26Link(t, e, p.idx); l == nil || l.Attrs().Name != "a26op0" {
		t.Errorf("after CHECK: our renamed veth (ifindex %d) changed or gone: %v", p.idx, l)
	}
}

// TestAttack26RenamedDelHandOff: as a26Renamed("del") with the agent
// alive: the third party's link under the old name is neither handed off
// (renamed, set down) nor deleted.
func TestAttack26RenamedDelHandOff(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	defer ag.Stop()
	p := a26Add(t, e, "a26ren-ho")
	a26Rename(t, e, p, "a26op0")
	fidx := a26Foreign(t, e, p.name, 0, "")
	a26Teardown(t, e, p, "del")
	a26AssertForeign(t, e, fidx, p.name, "", "DEL with the agent alive")
	a26AssertRecordLease(t, e, p, "DEL with the agent alive")
}

// a26ReplacedUninstall: our veth deleted, a third party's link under our
// name at our old ifindex (with our alias when forge); uninstall (with
// --force when force) leaves it as made.
func a26ReplacedUninstall(t *testing.T, id string, forge, force bool) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, id)
	if err := e.InNode(func() error { return deleteHostLink(p.name) }); err != nil {
		t.Fatalf("ip link del %s: %v", p.name, err)
	}
	alias := ""
	if forge {
		alias = p.alias
	}
	fidx := a26Foreign(t, e, p.name, p.idx, alias)
	args := []string{"uninstall"}
	if force {
		args = append(args, "--force")
	}
	out, err := e.AgentCmd(append(args, e.AgentArgs(e.WriteConfDir())...)...)
	t.Logf("%v: %v\n%s", args, err, out)
	a26AssertForeign(t, e, fidx, p.name, alias, "uninstall")
}

// TestAttack26IfindexReuseUninstall: a third party's link under our name
// at our old ifindex, no alias: uninstall (no --force) leaves it. (It
// refuses, taking that link for the pod's live veth: see
// TestAttack26IfindexReuseOurName for the root; --force deletes it,
// TestAttack26IfindexReuseUninstallForce, review_repro.)
func TestAttack26IfindexReuseUninstall(t *testing.T) {
	a26ReplacedUninstall(t, "a26iu", false, false)
}

// a26AgentAfterRename: the agent running, an operator renames a live pod's
// host veth (and a third party makes a link under the old name when
// taken); the agent (--reconcile-interval 2s) reconciles meanwhile. The pod is live (netns, veth, address): 5 s later it is
// whole (record, lease) or gone whole, never its lease released with its
// veth left; the third party's link is as made.
func a26AgentAfterRename(t *testing.T, id string, taken bool) {
	t.Parallel()
	e := testenv.New(t)
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "", "--reconcile-interval", "2s")
	defer ag.Stop()
	p := a26Add(t, e, id)
	a26Rename(t, e, p, "a26op0")
	fidx := 0
	if taken {
		fidx = a26Foreign(t, e, p.name, 0, "")
	}
	time.Sleep(5 * time.Second) // two reconcile intervals and margin
	if taken {
		a26AssertForeign(t, e, fidx, p.name, "", "the agent's reconcile")
	}
	ours := a26Link(t, e, p.idx) != nil
	_, recErr := os.Stat(e.RecordPath(p.id, "eth0"))
	lease := len(e.ReservationsOf(p.id)) > 0
	t.Logf("5 s after the rename: veth %v, record %v, lease %v", ours, recErr == nil, lease)
	if ours && (recErr != nil || !lease) {
		t.Errorf("the agent half tore down the live pod: veth %v, record %v, lease %v", ours, recErr == nil, lease)
	}
}
