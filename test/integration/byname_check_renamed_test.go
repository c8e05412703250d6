// CHECK on a host veth an operator renamed (`ip link set NAME name ...`):
// our veth (its alias, the record's ifindex, its peer in the pod) under
// another name. Lab: a26Add, a26Rename, a26Foreign (attack26_links_test.go).

package integration

import (
	"net"
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestCheckRenamedHostVeth: pod A's host veth renamed (and, "taken", a
// third party's link made under the old name; "alias", the alias changed
// too). Packets between A and pod B, and between the node and A, still go
// both ways: the datapath is keyed by ifindex (routes, entries, programs,
// link pins attached by device). CHECK fails naming the rename, as
// the host interface of ADD's result is not there under its name — not the
// veth as gone ("Link not found", or "is gone" when the name was taken,
// before byname26) — and only once everything else checked out.
func TestCheckRenamedHostVeth(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, mode string
		taken      bool
		alias      string
	}{
		{"auto", "auto", false, ""},
		{"tcx", "tcx", false, ""},
		{"taken", "auto", true, ""},
		{"alias", "tcx", true, "ebpf-cni:x/someone-else/eth0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := testenv.New(t)
			e.Extra = map[string]any{"attachMode": c.mode}
			p := a26Add(t, e, "ren-chk-"+c.name)
			b, rb := e.RunPod("ren-chk-b-" + c.name)
			b4, b6 := testenv.PodIPs(t, rb)
			a26Rename(t, e, p, "renchk0")
			if c.taken {
				a26Foreign(t, e, p.name, 0, "")
			}
			if c.alias != "" {
				a26SetAlias(t, e, p.idx, c.alias)
			}
			for _, ip := range p.ips {
				if err := testenv.Ping(b, ip, 2); err != nil {
					t.Errorf("after the rename, pod B to A: %v", err)
				}
				if err := testenv.Ping(e.Node, ip, 2); err != nil {
					t.Errorf("after the rename, the node to A: %v", err)
				}
			}
			for _, ip := range []net.IP{b4, b6} {
				if err := testenv.TCPTransfer(p.pod, b, ip, 1<<16); err != nil {
					t.Errorf("after the rename, TCP pod A to B %s: %v", ip, err)
				}
			}
			err := e.Check(p.pod, p.id, "eth0")
			if err == nil {
				t.Fatal("CHECK passed with the host veth under another name than ADD's result gives")
			}
			t.Logf("CHECK: %v", err)
			if msg := err.Error(); strings.Contains(msg, "gone") || !strings.Contains(msg, "renamed to renchk0") || !strings.Contains(msg, p.name) {
				t.Errorf("CHECK: %q, want it to name %s renamed to renchk0, not the veth as gone", msg, p.name)
			}
			// Renamed back, the pod is as ADD left it.
			if c.taken {
				return // the old name is the third party's
			}
			a26Rename(t, e, p, p.name)
			if c.alias != "" {
				a26SetAlias(t, e, p.idx, p.alias)
			}
			if err := e.Check(p.pod, p.id, "eth0"); err != nil {
				t.Errorf("CHECK after renaming it back: %v", err)
			}
		})
	}
}
