// A teardown (DEL, GC, the agent's reconcile) never removes a link that is
// not its own veth: when the host veth is gone (an operator's `ip link del`,
// the pod's netns gone) and another tool has since made a link of the same
// name, with no alias of ours, that link and what is keyed by its ifindex
// stay, while the attachment's own record, IPAM lease and entries go.

package integration

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// replacedPod is a pod whose host veth (ifindex Old) was deleted and whose
// name another tool's veth (ifindex New, up, no alias) took.
type replacedPod struct {
	pod      ns.NetNS
	id, name string
	ips      []net.IP
	old, new int
}

// addReplaced adds pod id, deletes its host veth as `ip link del` does and
// makes another tool's veth of the same name in the node netns. A links
// entry is put for the new link's ifindex, standing for any state keyed by
// it that is not the pod's (a teardown that took the link for its own
// would delete it with its own).
func addReplaced(t *testing.T, e *testenv.Env, id string) *replacedPod {
	t.Helper()
	p := &replacedPod{pod: e.NewPod(), id: id}
	e.CleanupDel(p.pod, id)
	r := e.Add(p.pod, id)
	for _, ipc := range r.IPs {
		p.ips = append(p.ips, ipc.Address.IP)
	}
	p.name, p.old = e.HostVeth(id)
	if err := e.InNode(func() error { return deleteHostLink(p.name) }); err != nil {
		t.Fatalf("ip link del %s: %v", p.name, err)
	}
	p.new = makeOtherToolsLink(t, e, p.name)
	if p.new == p.old {
		t.Fatalf("the other tool's %s got the old ifindex %d", p.name, p.old)
	}
	if err := e.Maps().Links().Put(p.new, maps.LinkInfo{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// makeOtherToolsLink makes a veth named name (its peer named after it) in
// the node netns, up, with no alias, as another tool would, and returns
// its ifindex.
func makeOtherToolsLink(t *testing.T, e *testenv.Env, name string) int {
	t.Helper()
	idx := 0
	err := e.InNode(func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "o" + strings.TrimPrefix(name, state.HostIfPrefix)}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		idx = l.Attrs().Index
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatalf("the other tool's link %s: %v", name, err)
	}
	return idx
}

// assertOtherToolsLink fails unless the link name is still the other
// tool's, as it made it: same ifindex, up, no alias, and the entry keyed by
// its ifindex still there.
func assertOtherToolsLink(t *testing.T, e *testenv.Env, name string, idx int, after string) {
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
	if _, err := e.Maps().Links().Lookup(idx); err != nil {
		t.Errorf("after %s: the links entry of the other tool's link (ifindex %d) is gone: %v", after, idx, err)
	}
}

// assertPodGone fails unless the pod's record, IPAM lease, endpoint
// entries and links entry (of its old ifindex) are gone.
func assertPodGone(t *testing.T, e *testenv.Env, p *replacedPod, after string) {
	t.Helper()
	if _, err := os.Stat(e.RecordPath(p.id, "eth0")); err == nil {
		t.Errorf("after %s: the record of %s is left", after, p.id)
	}
	if res := e.ReservationsOf(p.id); len(res) > 0 {
		t.Errorf("after %s: IPAM still holds %v for %s", after, res, p.id)
	}
	m := e.Maps()
	for _, ip := range p.ips {
		if ep, err := m.Endpoints().Lookup(ip); err == nil {
			t.Errorf("after %s: endpoint entry of %s left: %+v", after, ip, ep)
		}
	}
	if _, err := m.Links().Lookup(p.old); err == nil {
		t.Errorf("after %s: the links entry of the pod's veth (ifindex %d) is left", after, p.old)
	}
}

// dropOtherToolsEntry removes the stand-in entry put by addReplaced.
func dropOtherToolsEntry(e *testenv.Env, p *replacedPod) { _ = e.Maps().Links().Delete(p.new) }

// TestDelReplacedHostVeth: the record names ifindex X, the link under the
// pod's host veth name is another tool's (ifindex Y != X): DEL succeeds,
// removes the pod's record, lease and entries, and leaves the link and what
// is keyed by Y; a second DEL (the runtime's retry, no record left now)
// succeeds and leaves the link too.
func TestDelReplacedHostVeth(t *testing.T) {
	e := testenv.New(t)
	p := addReplaced(t, e, "rep")
	defer dropOtherToolsEntry(e, p)
	if err := e.Del(p.pod, p.id, "eth0"); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	assertOtherToolsLink(t, e, p.name, p.new, "DEL")
	assertPodGone(t, e, p, "DEL")
	if err := e.Del(p.pod, p.id, "eth0"); err != nil {
		t.Fatalf("DEL again: %v", err)
	}
	assertOtherToolsLink(t, e, p.name, p.new, "a second DEL")
}

// TestDelReplacedAfterDel: the pod DELed, another tool makes a link of its
// host veth's name, the runtime repeats the DEL (no record left): the
// link stays.
func TestDelReplacedAfterDel(t *testing.T) {
	e := testenv.New(t)
	pod, _ := e.RunPod("again")
	name, _ := e.HostVeth("again")
	e.MustDel(pod, "again")
	idx := makeOtherToolsLink(t, e, name)
	if err := e.Maps().Links().Put(idx, maps.LinkInfo{}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Maps().Links().Delete(idx) }()
	if err := e.Del(pod, "again", "eth0"); err != nil {
		t.Fatalf("repeated DEL: %v", err)
	}
	assertOtherToolsLink(t, e, name, idx, "the repeated DEL")
}

// TestDelReplacedHostVethHandOff: as TestDelReplacedHostVeth with the
// agent alive, where DEL hands its veth off to the agent: the other tool's
// link is neither handed off (renamed, set down) nor deleted.
func TestDelReplacedHostVethHandOff(t *testing.T) {
	e := testenv.New(t)
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	defer ag.Stop()
	p := addReplaced(t, e, "rep-ho")
	defer dropOtherToolsEntry(e, p)
	if err := e.Del(p.pod, p.id, "eth0"); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	assertOtherToolsLink(t, e, p.name, p.new, "DEL with the agent alive")
	assertPodGone(t, e, p, "DEL with the agent alive")
}

// TestGCReplacedHostVeth: the plugin's GC (the pod not among the valid
// attachments) tears the pod down and leaves the other tool's link.
func TestGCReplacedHostVeth(t *testing.T) {
	e := testenv.New(t)
	p := addReplaced(t, e, "rep-gc")
	defer dropOtherToolsEntry(e, p)
	if err := a16GC(t, e); err != nil {
		t.Fatalf("GC: %v", err)
	}
	assertOtherToolsLink(t, e, p.name, p.new, "GC")
	assertPodGone(t, e, p, "GC")
}

// TestReconcileReplacedHostVeth: `ebpf-agent reconcile` takes the pod whose
// veth is gone for gone though a link has its name (another tool's, not
// its veth), tears it down and leaves that link.
func TestReconcileReplacedHostVeth(t *testing.T) {
	e := testenv.New(t)
	p := addReplaced(t, e, "rep-rc")
	defer dropOtherToolsEntry(e, p)
	out, err := e.AgentCmd(append([]string{"reconcile"}, e.AgentArgs(e.WriteConfDir())...)...)
	if err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	assertOtherToolsLink(t, e, p.name, p.new, "reconcile")
	assertPodGone(t, e, p, "reconcile")
}
