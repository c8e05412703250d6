// Ident30: one owner (pkg/endpoint) for "which node link is our host
// veth" of a record. `ebpf-agent status` asks endpoint.RecordedHostVeth,
// the teardown's rule (ifindex, and under another name the alias or the
// peer's netns, with the record's host MAC), not the recorded ifindex
// alone. Helpers: a26Add, a26Link (attack26_links_test.go),
// a28ForeignIntoPod (attack28_test.go), statusHostVeths
// (byname_status_test.go).
// Run:
//
//	go test -count=1 -run 'TestIdent30' -v ./test/integration/

package integration

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestIdent30StatusForeignAtRecordedIndex: attachMode tcx, one live pod.
// A second pod's host veth deleted (`ip link del`, its record left) and
// another plugin's veth made at its old ifindex with its peer in the pod
// ("other": another name, no alias; "forged": another name, our alias
// copied). DEL leaves that veth (attack28); status must not count it as a
// host veth of ours either: {tcx: 1}, the live pod.
//
// Red before ident30: status took any veth with a peer in another netns
// at a recorded ifindex for ours ({none: 1, tcx: 1}).
func TestIdent30StatusForeignAtRecordedIndex(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, link string }{{"other", "i30tp0"}, {"forged", "i30tp1"}} {
		t.Run(c.name, func(t *testing.T) {
			e := testenv.New(t)
			e.Extra = map[string]any{"attachMode": "tcx"}
			e.RunPod("i30-live-" + c.name)
			p := a26Add(t, e, "i30-st-"+c.name)
			alias := ""
			if c.name == "forged" {
				alias = p.alias
			}
			a28ForeignIntoPod(t, e, p, c.link, alias)
			if got, want := statusHostVeths(t, e), map[string]int{datapath.StateTCX: 1}; !maps.Equal(got, want) {
				t.Errorf("status host veths with one live pod and another plugin's veth %s at a gone veth's recorded ifindex %d: %v, want %v",
					c.link, p.idx, got, want)
			}
		})
	}
}

// TestIdent30MoveRenamedToTCX: a pod's ADD attached cls_bpf waiting for
// tcx (the agent lock held), then an operator renamed its host veth (to
// another name the agent watches, ebpf...). The agent started since moves
// it to tcx with its link pins where every verb looks for them: under the
// record's host veth name (endpoint.RecordedHostVeth), not the link's
// name now. Status counts it on tcx; renamed back, CHECK passes; DEL
// leaves nothing.
//
// Red before ident30: the agent pinned the tcx links under the link's
// current name (and judged the veth done by the same name): status said
// {none: 1}, CHECK after the rename back failed on the missing pins, and
// DEL left them.
func TestIdent30MoveRenamedToTCX(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	release := holdAgentLock(t, e)
	p := a26Add(t, e, "i30mv")
	if st := e.AttachState(p.name); st != datapath.StateTCPending {
		t.Fatalf("%s is %q with the agent lock held, want %q", p.name, st, datapath.StateTCPending)
	}
	const renamed = "ebpfi30mv0"
	a26Rename(t, e, p, renamed)
	release()
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var pending bool
		e.InNode(func() error { _, pending = datapath.TCVethOf(p.idx, renamed); return nil })
		if !pending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not move the renamed %s off cls_bpf in 10s", renamed)
		}
	}
	if got, want := statusHostVeths(t, e), map[string]int{datapath.StateTCX: 1}; !maps.Equal(got, want) {
		t.Errorf("status host veths after the agent moved the renamed veth: %v, want %v", got, want)
	}
	a26Rename(t, e, p, p.name)
	if err := e.Check(p.pod, p.id, "eth0"); err != nil {
		t.Errorf("CHECK after the rename back: %v", err)
	}
	a26Teardown(t, e, p, "del")
	a26AssertRecordLease(t, e, p, "DEL")
	e.AssertClean()
}

// TestIdent30CheckRenamedNameTaken: a pod's host veth renamed, and a third
// party's link made under its old name since. CHECK's advice, the rename
// back, fails then (File exists): the message must name the link that
// holds the name. Done as it says (that link gone, the veth renamed back),
// CHECK passes.
//
// Red before ident30: CHECK advised "rename it back (ip link set ...)"
// alone, naming no holder.
func TestIdent30CheckRenamedNameTaken(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "i30chk")
	const renamed = "i30chk0"
	a26Rename(t, e, p, renamed)
	holder := a26Foreign(t, e, p.name, 0, "")
	err := e.Check(p.pod, p.id, "eth0")
	if err == nil {
		t.Fatal("CHECK passed with the host veth renamed")
	}
	t.Logf("CHECK: %v", err)
	msg := err.Error()
	if !strings.Contains(msg, "renamed to "+renamed) || !strings.Contains(msg, fmt.Sprintf("link %s (ifindex %d)", p.name, holder)) {
		t.Errorf("CHECK: %q, want it to name %s renamed to %s and the link holding the name (ifindex %d)", msg, p.name, renamed, holder)
	}
	// The plain rename back fails while the name is held.
	rename := func() error {
		return e.InNode(func() error {
			l, err := netlink.LinkByIndex(p.idx)
			if err != nil {
				return err
			}
			return netlink.LinkSetName(l, p.name)
		})
	}
	if err := rename(); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("rename back with the name held: %v, want EEXIST", err)
	}
	if err := e.InNode(func() error { return deleteHostLink(p.name) }); err != nil {
		t.Fatalf("delete the holder %s: %v", p.name, err)
	}
	if err := rename(); err != nil {
		t.Fatalf("rename back once the name is free: %v", err)
	}
	if err := e.Check(p.pod, p.id, "eth0"); err != nil {
		t.Errorf("CHECK after freeing the name and renaming back: %v", err)
	}
}
