// CHECK judges the host veth as the teardown identifies it (replacedLink),
// never another tool's link under its name. Lab: addReplaced
// (teardown_replaced_test.go).

package integration

import (
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestCheckReplacedHostVeth: with the pod's host veth gone and another
// tool's link under its name (up, no alias), CHECK fails naming the host
// veth as gone, not judging the other link.
func TestCheckReplacedHostVeth(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := addReplaced(t, e, "rep-chk")
	defer dropOtherToolsEntry(e, p)
	defer e.InNode(func() error { return deleteHostLink(p.name) })
	err := e.Check(p.pod, p.id, "eth0")
	if err == nil {
		t.Fatal("CHECK passed with the pod's host veth gone and another tool's link under its name")
	}
	if msg := err.Error(); !strings.Contains(msg, p.name) || !strings.Contains(msg, "gone") {
		t.Errorf("CHECK: %q, want it to name host veth %s as gone", msg, p.name)
	}
	if err := e.Del(p.pod, p.id, "eth0"); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	assertOtherToolsLink(t, e, p.name, p.new, "CHECK and DEL")
}
