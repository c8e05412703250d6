// Attack26 (black box): a teardown identifies a pod's host veth by the
// attachment's record / alias / ifindex, never by name alone (design.md,
// "A name is not an owner"). Attacks: the host veth renamed by an operator,
// its alias cleared or changed, a foreign link given our alias, a foreign
// link given the old ifindex of our veth; each followed by DEL, GC,
// reconcile or uninstall. The tests here are guards (the attack failed);
// those where it works are in attack26_links_repro_test.go (review_repro).

package integration

import (
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a26Pod is a pod added by a26Add: its host veth's name, ifindex, alias.
type a26Pod struct {
	pod        ns.NetNS
	id, name   string
	idx        int
	alias      string
	ips        []net.IP
	foreignIdx int // the third party's link's, a26Replaced
}

func a26Add(t *testing.T, e *testenv.Env, id string) *a26Pod {
	t.Helper()
	p := &a26Pod{pod: e.NewPod(), id: id}
	e.CleanupDel(p.pod, id)
	r := e.Add(p.pod, id)
	for _, ipc := range r.IPs {
		p.ips = append(p.ips, ipc.Address.IP)
	}
	p.name, p.idx = e.HostVeth(id)
	l := a26Link(t, e, p.idx)
	if l == nil {
		t.Fatalf("host veth %s (ifindex %d) not found", p.name, p.idx)
	}
	p.alias = l.Attrs().Alias
	if want := fmt.Sprintf("ebpf-cni:%s/%s/eth0", e.Name, id); p.alias != want {
		t.Fatalf("host veth alias %q, the docs say %q", p.alias, want)
	}
	return p
}

// a26Link is the node link of ifindex idx, nil when there is none.
func a26Link(t *testing.T, e *testenv.Env, idx int) netlink.Link {
	t.Helper()
	var l netlink.Link
	e.InNode(func() error {
		var err error
		if l, err = netlink.LinkByIndex(idx); err != nil {
			l = nil
		}
		return nil
	})
	return l
}

// a26Foreign makes a veth named name in the node netns (peer "p"+name
// cut to 15 bytes), at ifindex idx when idx > 0, with alias alias, up, as a
// third party would, and returns its ifindex.
func a26Foreign(t *testing.T, e *testenv.Env, name string, idx int, alias string) int {
	t.Helper()
	peer := "p" + name
	if len(peer) > 15 {
		peer = peer[:15]
	}
	got := 0
	err := e.InNode(func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, Index: idx}, PeerName: peer}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		got = l.Attrs().Index
		if alias != "" {
			if err := netlink.LinkSetAlias(l, alias); err != nil {
				return err
			}
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatalf("the third party's link %s (index %d): %v", name, idx, err)
	}
	if idx > 0 && got != idx {
		t.Fatalf("the third party's link %s got ifindex %d, asked %d", name, got, idx)
	}
	return got
}

// a26AssertForeign fails unless the link at idx is still as the third
// party made it: name, alias, up.
func a26AssertForeign(t *testing.T, e *testenv.Env, idx int, name, alias, after string) {
	t.Helper()
	l := a26Link(t, e, idx)
	switch {
	case l == nil:
		t.Errorf("after %s: the third party's link %s (ifindex %d) was deleted", after, name, idx)
	case l.Attrs().Name != name || l.Attrs().Alias != alias || l.Attrs().Flags&net.FlagUp == 0:
		t.Errorf("after %s: the third party's link (ifindex %d) was changed: name %q alias %q flags %v, want %q alias %q up",
			after, idx, l.Attrs().Name, l.Attrs().Alias, l.Attrs().Flags, name, alias)
	}
}

// a26AssertTornDown: after a teardown the pod's veth is gone, with its
// record and lease and its endpoint entries.
func a26AssertTornDown(t *testing.T, e *testenv.Env, p *a26Pod, after string) {
	t.Helper()
	a26AssertOursGone(t, e, p, after)
	a26AssertRecordLease(t, e, p, after)
	a26AssertEntries(t, e, p, after)
}

// a26AssertOursGone fails unless our veth (ifindex p.idx) is gone.
func a26AssertOursGone(t *testing.T, e *testenv.Env, p *a26Pod, after string) {
	t.Helper()
	if l := a26Link(t, e, p.idx); l != nil && l.Attrs().Index == p.idx && p.foreignIdx != p.idx {
		t.Errorf("after %s: our host veth (ifindex %d, now %q alias %q) is left", after, p.idx, l.Attrs().Name, l.Attrs().Alias)
	}
}

// a26AssertRecordLease fails unless the pod's record and lease are gone.
func a26AssertRecordLease(t *testing.T, e *testenv.Env, p *a26Pod, after string) {
	t.Helper()
	if _, err := os.Stat(e.RecordPath(p.id, "eth0")); err == nil {
		t.Errorf("after %s: the record of %s is left", after, p.id)
	}
	if res := e.ReservationsOf(p.id); len(res) > 0 {
		t.Errorf("after %s: IPAM still holds %v for %s", after, res, p.id)
	}
}

// a26AssertEntries fails unless the pod's endpoint entries and the links
// entry of its veth's ifindex are gone.
func a26AssertEntries(t *testing.T, e *testenv.Env, p *a26Pod, after string) {
	t.Helper()
	m := e.Maps()
	for _, ip := range p.ips {
		if ep, err := m.Endpoints().Lookup(ip); err == nil {
			t.Errorf("after %s: endpoint entry of %s left: %+v", after, ip, ep)
		}
	}
	if p.foreignIdx != p.idx {
		if _, err := m.Links().Lookup(p.idx); err == nil {
			t.Errorf("after %s: the links entry of our veth (ifindex %d) is left", after, p.idx)
		}
	}
}

// a26Teardown runs one teardown verb against the pod: "del", "gc",
// "reconcile", "uninstall".
func a26Teardown(t *testing.T, e *testenv.Env, p *a26Pod, verb string) {
	t.Helper()
	var err error
	var out string
	switch verb {
	case "del":
		err = e.Del(p.pod, p.id, "eth0")
	case "gc":
		err = a16GC(t, e)
	case "reconcile", "uninstall":
		out, err = e.AgentCmd(append([]string{verb}, e.AgentArgs(e.WriteConfDir())...)...)
	}
	if err != nil {
		t.Fatalf("%s: %v\n%s", verb, err, out)
	}
}

// a26Rename renames our host veth as an operator would (`ip link set NAME
// name other`).
func a26Rename(t *testing.T, e *testenv.Env, p *a26Pod, to string) {
	t.Helper()
	err := e.InNode(func() error {
		l, err := netlink.LinkByIndex(p.idx)
		if err != nil {
			return err
		}
		return netlink.LinkSetName(l, to)
	})
	if err != nil {
		t.Fatalf("rename %s to %s: %v", p.name, to, err)
	}
}

// a26Renamed: our veth renamed by an operator, a third party's link made
// under the old name; the teardown verb deletes ours (it is ours: record,
// alias, ifindex) and leaves the new link under the old name.
func a26Renamed(t *testing.T, verb string) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "a26ren-"+verb)
	a26Rename(t, e, p, "a26op0")
	fidx := a26Foreign(t, e, p.name, 0, "")
	a26Teardown(t, e, p, verb)
	a26AssertForeign(t, e, fidx, p.name, "", verb)
	a26AssertRecordLease(t, e, p, verb)
	if verb != "uninstall" { // uninstall takes the maps with it
		a26AssertOursGone(t, e, p, verb)
		a26AssertEntries(t, e, p, verb)
	}
}

// TestAttack26RenamedUninstall: uninstall with a pod whose veth an operator
// renamed and whose old name a third party's link took: that link stays,
// the pod's record and lease go.
func TestAttack26RenamedUninstall(t *testing.T) { a26Renamed(t, "uninstall") }

// TestAttack26AliasClearedDel: someone clears our veth's alias; DEL still
// deletes it (record and ifindex name it) and the pod's entries.
func TestAttack26AliasClearedDel(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "a26clr")
	a26SetAlias(t, e, p.idx, "")
	a26Teardown(t, e, p, "del")
	a26AssertTornDown(t, e, p, "DEL")
}

func a26SetAlias(t *testing.T, e *testenv.Env, idx int, alias string) {
	t.Helper()
	err := e.InNode(func() error {
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			return err
		}
		return netlink.LinkSetAlias(l, alias)
	})
	if err != nil {
		t.Fatalf("set alias of ifindex %d to %q: %v", idx, alias, err)
	}
	if l := a26Link(t, e, idx); l == nil || l.Attrs().Alias != alias {
		t.Fatalf("alias of ifindex %d not set to %q", idx, alias)
	}
}

// TestAttack26ForgedAliasOtherName: a third party's link under another
// name carries our veth's alias; DEL deletes our veth, not the forged one.
func TestAttack26ForgedAliasOtherName(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "a26fa")
	fidx := a26Foreign(t, e, "a26forged0", 0, p.alias)
	a26Teardown(t, e, p, "del")
	a26AssertForeign(t, e, fidx, "a26forged0", p.alias, "DEL")
	a26AssertTornDown(t, e, p, "DEL")
	if err := e.Del(p.pod, p.id, "eth0"); err != nil {
		t.Fatalf("DEL again: %v", err)
	}
	a26AssertForeign(t, e, fidx, "a26forged0", p.alias, "a second DEL")
}

// a26Replaced: our veth deleted (`ip link del`); a third party's link made
// under name (ours when name == ""), at ifindex idx (any when 0), with
// alias; then DEL, twice: the third party's link stays as made, the pod's
// record and lease go.
func a26Replaced(t *testing.T, id, name string, sameIdx bool, forgeAlias bool) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, id)
	if name == "" {
		name = p.name
	}
	if err := e.InNode(func() error { return deleteHostLink(p.name) }); err != nil {
		t.Fatalf("ip link del %s: %v", p.name, err)
	}
	idx, alias := 0, ""
	if sameIdx {
		idx = p.idx
	}
	if forgeAlias {
		alias = p.alias
	}
	p.foreignIdx = a26Foreign(t, e, name, idx, alias)
	for _, after := range []string{"DEL", "a second DEL"} {
		if err := e.Del(p.pod, p.id, "eth0"); err != nil {
			t.Fatalf("%s: %v", after, err)
		}
		a26AssertForeign(t, e, p.foreignIdx, name, alias, after)
		a26AssertRecordLease(t, e, p, after)
	}
	for _, ip := range p.ips {
		if ep, err := e.Maps().Endpoints().Lookup(ip); err == nil {
			t.Errorf("endpoint entry of %s left: %+v", ip, ep)
		}
	}
}
