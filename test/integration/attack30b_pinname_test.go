// attack30b: ident30's agent move pins a renamed host veth's tcx links
// under its record's host veth name (endpoint.PinNameOf). A link whose
// name is the host veth name its alias names was taken at its alias's word,
// no record read; the alias is anyone's with CAP_NET_ADMIN on the node
// (design.md: the record decides, not the alias).

package integration

import (
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack30bMoveAliasSpoofSharesPins: two pods on cls_bpf waiting for
// the agent's move to tcx. An operator renames pod 2's veth away, then
// renames pod 1's veth to pod 2's old host veth name and gives it pod 2's
// alias. The agent moves both: each veth must end with its two programs
// attached (tcx or cls_bpf), and pod 2's pins must be its own veth's.
//
// Red before attack30b: PinNameOf took pod 1's veth at its alias's word
// and pinned its tcx links under pod 2's name, where pod 2's move pinned
// too: the second pin replaced the first (attachTCXProg removes a pin in
// its way), detaching the first veth's tcx links after its cls_bpf filters
// had gone, so that veth ran no program of ours.
func TestAttack30bMoveAliasSpoofSharesPins(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	release := holdAgentLock(t, e)
	p1, p2 := a26Add(t, e, "a30bsp1"), a26Add(t, e, "a30bsp2")
	for _, p := range []*a26Pod{p1, p2} {
		if st := e.AttachState(p.name); st != datapath.StateTCPending {
			t.Fatalf("%s is %q with the agent lock held, want %q", p.name, st, datapath.StateTCPending)
		}
	}
	const away = "ebpfa30bsp2x" // the agent moves links named with the host veth prefix only
	a26Rename(t, e, p2, away)
	a26Rename(t, e, p1, p2.name)
	a26SetAlias(t, e, p1.idx, p2.alias)
	names := map[int]string{p1.idx: p2.name, p2.idx: away}
	release()
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	defer func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", ag.Log)
		}
	}()
	var pending []int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		pending = pending[:0]
		for idx, name := range names {
			var p bool
			e.InNode(func() error { _, p = datapath.TCVethOf(idx, name); return nil })
			if p {
				pending = append(pending, idx)
			}
		}
		if len(pending) == 0 || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(500 * time.Millisecond) // a pass that moves one of them again would show
	if len(pending) > 0 {
		t.Errorf("the agent did not move ifindex %v off cls_bpf in 10 s", pending)
	}
	for _, p := range []*a26Pod{p1, p2} {
		if ids := e.ProgIDs(p.idx); len(ids) != 2 {
			t.Errorf("%s's veth (ifindex %d, now %s) runs %d programs of ours (%v), want 2", p.id, p.idx, names[p.idx], len(ids), ids)
		}
	}
	var st1, st2 string
	e.InNode(func() error {
		st1 = datapath.AttachmentOf(e.PinDir, p1.idx, p1.name)
		st2 = datapath.AttachmentOf(e.PinDir, p2.idx, p2.name)
		return nil
	})
	if st1 != datapath.StateTCX || st2 != datapath.StateTCX {
		t.Errorf("pins under each record's host veth name: %s %q, %s %q; want both %q", p1.name, st1, p2.name, st2, datapath.StateTCX)
	}
}
