// A link pin is an orphan by its link's device, not by its name: a pin
// whose host veth went is removed though another tool's link took the
// name since, and that link is left as it was. Lab: addReplaced
// (teardown_replaced_test.go).

package integration

import (
	"errors"
	"net"
	"os"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// assertLinkAsMade fails unless the link idx is still name, up, with no
// alias (the maps may be gone: an uninstall's check).
func assertLinkAsMade(t *testing.T, e *testenv.Env, name string, idx int, after string) {
	t.Helper()
	var (
		l   netlink.Link
		err error
	)
	e.InNode(func() error { l, err = netlink.LinkByIndex(idx); return nil })
	switch {
	case err != nil:
		t.Errorf("after %s: the other tool's link %s (ifindex %d) is gone: %v", after, name, idx, err)
	case l.Attrs().Name != name || l.Attrs().Alias != "" || l.Attrs().Flags&net.FlagUp == 0:
		t.Errorf("after %s: the other tool's link (ifindex %d) was changed: name %q alias %q flags %v, want %q, no alias, up",
			after, idx, l.Attrs().Name, l.Attrs().Alias, l.Attrs().Flags, name)
	}
}

// TestOrphanPinsReplacedHostVeth: a pod attached by pinned tcx links
// (attachMode tcx) loses its host veth and another tool's link takes its
// name. Its pins are orphans (their links' device is gone): the agent's
// reconcile and the plugin's GC remove them, and leave the other tool's
// link as it was, with no program of ours attached.
//
// Red before the fix: the orphan check went by the name alone, so the
// pins stayed for as long as the other link lived.
func TestOrphanPinsReplacedHostVeth(t *testing.T) {
	t.Parallel()
	for _, by := range []string{"reconcile", "GC"} {
		t.Run(by, func(t *testing.T) {
			e := testenv.New(t)
			e.Extra = map[string]any{"attachMode": "tcx"} // pinned tcx links, no agent
			p := addReplaced(t, e, "rep-pin")
			defer dropOtherToolsEntry(e, p)
			defer e.InNode(func() error { return deleteHostLink(p.name) })
			pins := []string{datapath.LinkPinPath(e.PinDir, p.name, datapath.DirIngress), datapath.LinkPinPath(e.PinDir, p.name, datapath.DirEgress)}
			for _, pin := range pins {
				if _, err := os.Stat(pin); err != nil {
					t.Fatalf("no link pin %s of the gone veth: the test would prove nothing (%v)", pin, err)
				}
			}
			switch by {
			case "reconcile":
				out, err := e.AgentCmd(append([]string{"reconcile"}, e.AgentArgs(e.WriteConfDir())...)...)
				if err != nil {
					t.Fatalf("reconcile: %v\n%s", err, out)
				}
			case "GC":
				// The pod stays valid: GC keeps its record, and the pins
				// still go (they are not its veth's: that is gone).
				if err := a16GC(t, e, p.id); err != nil {
					t.Fatalf("GC: %v", err)
				}
			}
			for _, pin := range pins {
				if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("after %s: the link pin %s of the gone veth is left (%v)", by, pin, err)
				}
			}
			assertLinkAsMade(t, e, p.name, p.new, by)
			if st := e.AttachState(p.name); st != datapath.StateNone {
				t.Errorf("after %s: the other tool's link %s is attached: %q, want %q", by, p.name, st, datapath.StateNone)
			}
		})
	}
}

// TestOrphanPinsLiveVethKept (guard): the pins of a live pod's veth are no
// orphans: reconcile leaves them, and the pod attached.
func TestOrphanPinsLiveVethKept(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.Extra = map[string]any{"attachMode": "tcx"}
	pod, _ := e.RunPod("live-pin")
	defer e.MustDel(pod, "live-pin")
	name, _ := e.HostVeth("live-pin")
	out, err := e.AgentCmd(append([]string{"reconcile"}, e.AgentArgs(e.WriteConfDir())...)...)
	if err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	for _, d := range []string{datapath.DirIngress, datapath.DirEgress} {
		if _, err := os.Stat(datapath.LinkPinPath(e.PinDir, name, d)); err != nil {
			t.Errorf("after reconcile: the live pod's link pin %s: %v", d, err)
		}
	}
	if st := e.AttachState(name); st != datapath.StateTCX {
		t.Errorf("after reconcile: the live pod's veth %s: %q, want %q", name, st, datapath.StateTCX)
	}
}
