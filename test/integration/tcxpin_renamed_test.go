// A host veth's tcx link pins are its programs' last references; an
// operator-renamed veth keeps them under its attachment's host veth name
// (orphanPin). Another attachment's veth made under that name since must
// neither replace them (attachTCXProg) nor remove them (its undo, its DEL).

package integration

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/libcni"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTCXPinOfRenamedVethKept: attachMode tcx, no agent. Network A's pod
// (container "pinren", eth0) has its host veth renamed by an operator;
// network B (same pinDir) then ADDs the same container ID and interface
// name for another pod, which makes its veth under the name A's pins are
// under. B's ADD is refused (the pins are another device's), and neither it,
// its undo nor the runtime's DEL after it detaches A's programs: A's
// renamed veth runs the same two programs throughout, its pins in place,
// and CHECK of A passes once the operator renamed it back.
//
// Red before twodel30: B's ADD removed A's pins to pin its own links there
// (A's veth ran 0 programs), and B's DEL would have removed them in any case.
func TestTCXPinOfRenamedVethKept(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p, before := renamedTCXPod(t, e, "pinren", "pinren0")
	kept := func(when string) {
		t.Helper()
		if after := e.ProgIDs(p.idx); !slices.Equal(after, before) {
			t.Errorf("%s: pod A's renamed veth runs programs %v, was %v", when, after, before)
		}
		for _, d := range []string{datapath.DirIngress, datapath.DirEgress} {
			if _, err := os.Stat(datapath.LinkPinPath(e.PinDir, p.name, d)); err != nil {
				t.Errorf("%s: pod A's link pin %s: %v", when, d, err)
			}
		}
	}
	netB, rt := netBSameAttachment(t, e, p)
	_, err := e.AddList(netB, rt)
	if err == nil {
		t.Errorf("network B's ADD over pod A's pins succeeded")
	} else if !strings.Contains(err.Error(), "attached to another device") {
		t.Errorf("network B's ADD over pod A's pins: %v, want the refusal naming the other device", err)
	}
	kept("after network B's ADD")
	if err := e.DelList(netB, rt); err != nil {
		t.Errorf("network B's DEL of its refused attachment: %v", err)
	}
	kept("after network B's DEL")
	a26Rename(t, e, p, p.name) // the operator puts the name back
	if err := e.Check(p.pod, p.id, "eth0"); err != nil {
		t.Errorf("CHECK of pod A after network B's ADD and DEL, its veth's name back: %v", err)
	}
}

// TestTCXPinOfRenamedVethKeptAgent: as TestTCXPinOfRenamedVethKept with the
// agent alive when network B adds: B's ADD attaches tc filters (the agent
// moves them to tcx later, which the pins under the name refuse: B keeps
// its filters), then B's DEL hands its veth off, moving the pins under the
// name to the handed-off name, and the agent reaps the veth and those
// pins. A's renamed veth keeps its programs and pins throughout.
//
// Red before twodel30 (the move and its refusal): the hand-off moved A's
// pins, which the agent's reap removed, detaching A's programs.
func TestTCXPinOfRenamedVethKeptAgent(t *testing.T) {
	e := testenv.New(t)
	p, before := renamedTCXPod(t, e, "pinrenag", "pinrenag0")
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	defer ag.Stop()
	netB, rt := netBSameAttachment(t, e, p)
	if _, err := e.AddList(netB, rt); err != nil {
		t.Fatalf("network B's ADD (tc filters, the agent alive): %v", err)
	}
	bIdx := e.HostIfindex(p.name)
	if err := e.DelList(netB, rt); err != nil {
		t.Errorf("network B's DEL: %v", err)
	}
	e.WaitLinkGone(state.HandedOffName(bIdx)) // reaped by the agent
	// A removed pin's link is released from a work queue: a second to
	// see a detach.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if after := e.ProgIDs(p.idx); !slices.Equal(after, before) {
			t.Errorf("after network B's DEL and the agent's reap: pod A's renamed veth runs programs %v, was %v", after, before)
			break
		}
	}
	for _, d := range []string{datapath.DirIngress, datapath.DirEgress} {
		if _, err := os.Stat(datapath.LinkPinPath(e.PinDir, p.name, d)); err != nil {
			t.Errorf("after network B's DEL and the agent's reap: pod A's link pin %s: %v", d, err)
		}
	}
}

// renamedTCXPod: network A's pod (attachMode tcx, container id, eth0),
// its host veth renamed by an operator to renamed, its links pinned under
// its old name; before is the two programs its veth runs.
func renamedTCXPod(t *testing.T, e *testenv.Env, id, renamed string) (p *a26Pod, before []ebpf.ProgramID) {
	t.Helper()
	e.Extra = map[string]any{"attachMode": "tcx"}
	p = a26Add(t, e, id)
	a26Rename(t, e, p, renamed)
	before = e.ProgIDs(p.idx)
	if len(before) != 2 {
		t.Fatalf("pod A's renamed veth runs %d programs, want 2", len(before))
	}
	return p, before
}

// netBSameAttachment: network B (same pinDir, attachMode tcx, its own
// state and IPAM) and a runtime config of a new pod with p's container ID
// and interface name: B's ADD makes its veth under the name p's pins are
// under.
func netBSameAttachment(t *testing.T, e *testenv.Env, p *a26Pod) (*libcni.NetworkConfigList, *libcni.RuntimeConf) {
	t.Helper()
	netB := e.NetList(testenv.RandName("netb"), map[string]any{"type": "ebpf-cni", "pinDir": e.PinDir, "stateDir": t.TempDir(),
		"attachMode": "tcx",
		"ipam":       map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{{{"subnet": "10.251.0.0/24"}}}}})
	return netB, e.RuntimeConf(e.NewPod(), p.id, "eth0")
}
