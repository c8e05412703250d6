package integration

import (
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack31cEbpzNamedNotHandedOff (attack31c, on depth31's agent that
// knows host veths by their record under any name): a link is handed off
// to the agent by its name, state.HandedOffName, "ebpz" followed by its
// own ifindex; the agent's full pass (ListHandedOff) reaps only those. The
// link-event path took any name that starts with "ebpz" as handed off and
// deleted the link at the event's ifindex:
//
//   - "foreign": another plugin's veth named ebpz… (not ebpz<its ifindex>);
//   - "other-index": a veth named ebpz<another link's ifindex> (lo's, 1);
//   - "pod": a pod's live host veth an operator renamed to ebpz… (depth31:
//     a host veth is known by its record under any name), which lost its
//     veth, its programs and its cni_links entry.
//
// Each link must still be there 3 s after it got that name, the agent
// running; the pod's veth keeps its two programs and its entry, and is
// torn down by DEL once renamed back.
//
//	go test -count=1 -run 'TestAttack31cEbpzNamedNotHandedOff$' -v ./test/integration/
func TestAttack31cEbpzNamedNotHandedOff(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"foreign", "other-index", "pod"} {
		t.Run(c, func(t *testing.T) {
			e := testenv.New(t)
			ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
			defer ag.Stop()
			var p *a26Pod
			name := map[string]string{"foreign": "ebpzx31c", "other-index": state.HandedOffName(1), "pod": "ebpzp31c"}[c]
			var idx int
			if c == "pod" {
				p = a26Add(t, e, "a31cz")
				idx = p.idx
				a26Rename(t, e, p, name)
			} else {
				peer := e.NewPod()
				if err := e.InNode(func() error {
					return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "a31cpeer",
						PeerNamespace: netlink.NsFd(int(peer.Fd()))})
				}); err != nil {
					t.Fatalf("make veth %s: %v", name, err)
				}
				t.Cleanup(func() {
					e.InNode(func() error { return netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}}) })
				})
				idx = e.HostIfindex(name)
				if strconv.Itoa(idx) == name[len(state.HandedOffPrefix):] {
					t.Fatalf("veth %s got the ifindex its name carries: not the case under test", name)
				}
			}
			time.Sleep(3 * time.Second)
			if !e.NodeLinkExists(name) {
				t.Fatalf("%s: the agent deleted %s (ifindex %d), not handed off (its name is not %s); agent log:\n%s",
					c, name, idx, state.HandedOffName(idx), ag.Logs())
			}
			if p == nil {
				return
			}
			if ids := e.ProgIDs(p.idx); len(ids) != 2 {
				t.Errorf("the pod's veth renamed %s runs %d programs, want 2", name, len(ids))
			}
			if _, err := e.Maps().Links().Lookup(p.idx); err != nil {
				t.Errorf("the pod's veth renamed %s lost its cni_links entry: %v", name, err)
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
