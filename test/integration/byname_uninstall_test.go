// Uninstall judges a pod live by its host veth as the teardown identifies
// it (replacedLink), not by a link another tool made under its name. Lab:
// addReplaced (teardown_replaced_test.go).

package integration

import (
	"os"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestUninstallReplacedHostVeth: a pod's host veth is gone and another
// tool's link has its name. The pod is no live pod: uninstall (without
// --force) does not refuse on its account, tears its attachment down
// (record, lease) and leaves the other tool's link as it was.
//
// Red before the fix: the judgement went by the name, took the pod for
// live and refused ("still use ebpf-cni ... rep-un/eth0 ... --force").
func TestUninstallReplacedHostVeth(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := addReplaced(t, e, "rep-un") // its links entry goes with the maps
	defer e.InNode(func() error { return deleteHostLink(p.name) })
	out, err := e.AgentCmd(append([]string{"uninstall"}, e.AgentArgs(e.WriteConfDir())...)...)
	if err != nil {
		t.Fatalf("uninstall (no pod is live: its veth is gone): %v\n%s", err, out)
	}
	assertLinkAsMade(t, e, p.name, p.new, "uninstall")
	if _, err := os.Stat(e.RecordPath(p.id, "eth0")); err == nil {
		t.Errorf("after uninstall: the record of %s is left", p.id)
	}
	if res := e.ReservationsOf(p.id); len(res) > 0 {
		t.Errorf("after uninstall: IPAM still holds %v for %s", res, p.id)
	}
}

// TestUninstallForceReplacedHostVeth (guard: right before the fix too):
// with --force the attachment's teardown identifies the veth by its
// record (teardown25), and the other tool's link stays.
func TestUninstallForceReplacedHostVeth(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := addReplaced(t, e, "rep-unf")
	defer e.InNode(func() error { return deleteHostLink(p.name) })
	out, err := e.AgentCmd(append([]string{"uninstall", "--force"}, e.AgentArgs(e.WriteConfDir())...)...)
	if err != nil {
		t.Fatalf("uninstall --force: %v\n%s", err, out)
	}
	assertLinkAsMade(t, e, p.name, p.new, "uninstall --force")
	if res := e.ReservationsOf(p.id); len(res) > 0 {
		t.Errorf("after uninstall --force: IPAM still holds %v for %s", res, p.id)
	}
}
