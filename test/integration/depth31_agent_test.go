// depth31: the agent knows a host veth by its record (ifindex and MAC:
// endpoint.RecordedHostVeth), not by its name: a veth an operator renamed
// to any name is moved to tcx like the others, its links pinned under the
// record's name. A move refused for good (its pins' name held by another
// device's links) is logged once per veth, not on every pass.

package integration

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestDepth31MoveRenamedAnyName: a pod's ADD attached cls_bpf waiting for
// tcx, then an operator renamed its host veth to a name the agent never
// watched ("d31…", not ebpf…). "start": the rename before the agent
// started (its first full pass finds it); "event": with the agent running
// and the verbs held, so the rename's link event is what names it. Either
// way the agent moves it to tcx, pins its links under the record's host
// veth name (none under the new one), and logs the move of a renamed veth;
// renamed back, CHECK passes; DEL leaves nothing.
//
// Red before depth31: the agent looked at links named ebpf… only: the
// veth stayed "tc, tcx pending" on cls_bpf, with no log line.
func TestDepth31MoveRenamedAnyName(t *testing.T) {
	t.Parallel()
	for _, when := range []string{"start", "event"} {
		t.Run(when, func(t *testing.T) {
			e := testenv.New(t)
			renamed := "d31rn" + when[:1] + "0"
			var ag *testenv.AgentProc
			var p *a26Pod
			if when == "start" {
				release := holdAgentLock(t, e)
				p = a26Add(t, e, "d31mv"+when)
				if st := e.AttachState(p.name); st != datapath.StateTCPending {
					t.Fatalf("%s is %q with the agent lock held, want %q", p.name, st, datapath.StateTCPending)
				}
				a26Rename(t, e, p, renamed)
				release()
				ag = e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
			} else {
				ag = e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
				verbs := e.HoldVerbs() // the agent waits: the veth stays pending
				p = a26Add(t, e, "d31mv"+when)
				if st := e.AttachState(p.name); st != datapath.StateTCPending {
					t.Fatalf("%s is %q with the verbs held, want %q", p.name, st, datapath.StateTCPending)
				}
				a26Rename(t, e, p, renamed)
				verbs()
			}
			defer ag.Stop()
			state := func() string {
				var st string
				e.InNode(func() error { st = datapath.AttachmentOf(e.PinDir, p.idx, p.name); return nil })
				return st
			}
			for deadline := time.Now().Add(15 * time.Second); state() != datapath.StateTCX; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the agent did not move %s (renamed from %s) to tcx in 15 s: %q; agent log:\n%s", renamed, p.name, state(), ag.Logs())
				}
			}
			if ids := e.ProgIDs(p.idx); len(ids) != 2 {
				t.Errorf("%s runs %d programs after the move, want 2: %v", renamed, len(ids), ids)
			}
			for _, d := range []string{datapath.DirIngress, datapath.DirEgress} {
				if _, err := os.Stat(datapath.LinkPinPath(e.PinDir, renamed, d)); err == nil {
					t.Errorf("a %s link pin under the veth's new name %s", d, renamed)
				}
			}
			want := "renamed from " + p.name + ", moved to tcx"
			for deadline := time.Now().Add(5 * time.Second); !strings.Contains(ag.Logs(), want); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Errorf("the agent's log does not say %q:\n%s", want, ag.Logs())
					break
				}
			}
			a26Rename(t, e, p, p.name)
			if err := e.Check(p.pod, p.id, "eth0"); err != nil {
				t.Errorf("CHECK after the rename back: %v", err)
			}
			a26Teardown(t, e, p, "del")
			a26AssertRecordLease(t, e, p, "DEL")
			e.AssertClean()
		})
	}
}

// TestDepth31RefusalLoggedOnce: network A's pod (attachMode tcx) has its
// host veth renamed by an operator, its links pinned under its old name;
// network B (same pinDir, the agent alive) ADDs the same container ID and
// interface name, so B's veth is made under that name with cls_bpf filters
// waiting for tcx. The agent must not move B's veth there (the pins are A's
// device's: replacing them would detach A's programs), and says so in its
// log once, though each of ten link changes of B's veth has a pass try the
// move again. A's programs and pins stay; B's veth stays on cls_bpf.
//
// Red before depth31: the refusal was logged on every pass (11 lines for
// the ADD and the ten changes).
func TestDepth31RefusalLoggedOnce(t *testing.T) {
	e := testenv.New(t)
	e.Extra = map[string]any{"attachMode": "tcx"}
	p := a26Add(t, e, "d31ref")
	a26Rename(t, e, p, "d31ref0")
	before := e.ProgIDs(p.idx)
	if len(before) != 2 {
		t.Fatalf("pod A's renamed veth runs %d programs, want 2", len(before))
	}
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	defer ag.Stop()
	netB := e.NetList(testenv.RandName("netb"), map[string]any{"type": "ebpf-cni", "pinDir": e.PinDir, "stateDir": t.TempDir(),
		"attachMode": "tcx",
		"ipam":       map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{{{"subnet": "10.251.0.0/24"}}}}})
	podB := e.NewPod()
	rt := e.RuntimeConf(podB, p.id, "eth0")
	if _, err := e.AddList(netB, rt); err != nil {
		t.Fatalf("network B's ADD (tc filters, the agent alive): %v", err)
	}
	t.Cleanup(func() { _ = e.DelList(netB, rt) })
	bIdx := e.HostIfindex(p.name)
	count := func() int {
		n := 0
		for _, l := range strings.Split(ag.Logs(), "\n") {
			if strings.Contains(l, p.name) && strings.Contains(l, "attached to another device") {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(10 * time.Second); count() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal to move network B's veth %s (ifindex %d) in the agent's log after 10 s:\n%s", p.name, bIdx, ag.Logs())
		}
	}
	for i := 0; i < 10; i++ {
		// A link change of B's veth: a pass looks at it again.
		if err := e.InNode(func() error {
			l, err := netlink.LinkByIndex(bIdx)
			if err != nil {
				return err
			}
			return netlink.LinkSetTxQLen(l, 500+i)
		}); err != nil {
			t.Fatalf("change network B's veth: %v", err)
		}
		time.Sleep(150 * time.Millisecond)
	}
	if n := count(); n != 1 {
		t.Errorf("the refusal to move network B's veth is in the agent's log %d times, want once:\n%s", n, ag.Logs())
	}
	if st := e.AttachState(p.name); st != datapath.StateTCPending {
		t.Errorf("network B's veth %s is %q, want %q (its filters kept)", p.name, st, datapath.StateTCPending)
	}
	if after := e.ProgIDs(p.idx); !slices.Equal(after, before) {
		t.Errorf("pod A's renamed veth runs programs %v, was %v", after, before)
	}
	for _, d := range []string{datapath.DirIngress, datapath.DirEgress} {
		if _, err := os.Stat(datapath.LinkPinPath(e.PinDir, p.name, d)); err != nil {
			t.Errorf("pod A's link pin %s: %v", d, err)
		}
	}
}
