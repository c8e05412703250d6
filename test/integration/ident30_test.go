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
	"maps"
	"testing"

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
