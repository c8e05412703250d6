// The agent's status counts a pod's host veth by the device, as the
// teardown identifies it, never by the name alone: a tcx link pin under a
// host veth name counts only when its link is attached to the device (not
// to none: the veth went, another tool's link took the name), and a veth
// an operator renamed is still counted, at its record's ifindex. Lab:
// addReplaced (teardown_replaced_test.go), a26Add, a26Rename
// (attack26_links_test.go).

package integration

import (
	"encoding/json"
	"maps"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// statusHostVeths is `ebpf-agent status`'s count of host veths by state.
func statusHostVeths(t *testing.T, e *testenv.Env) map[string]int {
	t.Helper()
	out, _ := e.AgentCmd("status", "-o", "json", "--pin-dir", e.PinDir, "--state-dir", e.StateDir) // exit 1: problems
	var st inspect.StatusReport
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, out)
	}
	return st.Attachments.HostVeths
}

// TestStatusReplacedHostVeth: attachMode tcx (pinned links, no agent). Pod
// A's veth deleted (`ip link del`) and another tool's veth made under its
// name; A's link pins are left (their links attached to no device). Pod B
// is live. Status counts B on tcx and nothing for the other tool's link;
// AttachmentOf calls that link "none". Then pod C's veth is renamed by an
// operator: still counted on tcx (its pins, under its host veth name, are
// attached to it).
//
// Red before byname26: the pins were looked at by name (os.Stat), so the
// other tool's link was "tcx" and counted as a host veth on tcx (status
// {tcx: 2}); the renamed veth was not counted at all (the second count
// came out right only as the other tool's link stood in for it).
func TestStatusReplacedHostVeth(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.Extra = map[string]any{"attachMode": "tcx"}
	p := addReplaced(t, e, "st-rep")
	defer dropOtherToolsEntry(e, p)
	defer e.InNode(func() error { return deleteHostLink(p.name) })
	e.RunPod("st-live")
	if st := e.AttachState(p.name); st != datapath.StateNone {
		t.Errorf("the other tool's link %s under the gone veth's name: %q, want %q", p.name, st, datapath.StateNone)
	}
	if got, want := statusHostVeths(t, e), map[string]int{datapath.StateTCX: 1}; !maps.Equal(got, want) {
		t.Errorf("status host veths with one live pod and another tool's link under a gone veth's name: %v, want %v", got, want)
	}
	c := a26Add(t, e, "st-ren")
	a26Rename(t, e, c, "strenamed0")
	if got, want := statusHostVeths(t, e), map[string]int{datapath.StateTCX: 2}; !maps.Equal(got, want) {
		t.Errorf("status host veths with a live pod's veth renamed: %v, want %v", got, want)
	}
}
