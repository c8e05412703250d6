// A live pod's link pins are no orphans when an operator renamed its host
// veth: the pins stay under the attachment's host veth name, their tcx
// links attached to the renamed device, and removing one detaches the
// pod's program. Lab: a26Add, a26Rename, a26Foreign (attack26_links_test.go).

package integration

import (
	"os"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestOrphanPinsRenamedVethKept: attachMode tcx (pinned links, no agent);
// pod A's host veth renamed (and, "taken", a third party's link made under
// the old name). GC (A valid) and the agent's reconcile leave A's link pins,
// and A's veth keeps both programs attached.
func TestOrphanPinsRenamedVethKept(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		taken bool
		by    string
	}{{"gc", false, "GC"}, {"reconcile", false, "reconcile"}, {"gc-taken", true, "GC"}, {"reconcile-taken", true, "reconcile"}} {
		t.Run(c.name, func(t *testing.T) {
			e := testenv.New(t)
			e.Extra = map[string]any{"attachMode": "tcx"}
			p := a26Add(t, e, "orph-ren-"+c.name)
			a26Rename(t, e, p, "orphren0")
			if c.taken {
				a26Foreign(t, e, p.name, 0, "")
			}
			before := len(e.ProgIDs(p.idx))
			switch c.by {
			case "reconcile":
				if out, err := e.AgentCmd(append([]string{"reconcile"}, e.AgentArgs(e.WriteConfDir())...)...); err != nil {
					t.Fatalf("reconcile: %v\n%s", err, out)
				}
			case "GC":
				if err := a16GC(t, e, p.id); err != nil {
					t.Fatalf("GC: %v", err)
				}
			}
			for _, d := range []string{datapath.DirIngress, datapath.DirEgress} {
				if _, err := os.Stat(datapath.LinkPinPath(e.PinDir, p.name, d)); err != nil {
					t.Errorf("after %s: the live pod's link pin %s (its veth renamed): %v", c.by, d, err)
				}
			}
			if after := len(e.ProgIDs(p.idx)); after != before || after != 2 {
				t.Errorf("after %s: the renamed veth runs %d programs (before: %d), want 2", c.by, after, before)
			}
		})
	}
}
