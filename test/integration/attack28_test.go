// Attack28 (black box, round byname26): the host veth renamed by an
// operator AND its alias changed. CHECK takes that link for the pod's veth
// (renamedHost: renamedVeth or recordedVeth, TestCheckRenamedHostVeth
// "alias"); the teardown and the liveness judgement must agree with it:
// DEL deletes it whole, and reconcile / GC never take the live pod for
// gone while its veth (the record's ifindex, its peer in the record's
// netns) is there under another name. And the converse: another plugin's
// veth made at our veth's old ifindex with its peer in the pod (what that
// judgement would take for ours but for the record's host MAC) is left by
// DEL. All green since attack28's fixes (red on main: RenamedReAliasedDel,
// RenamedReAliasedReconcile, ForeignIntoPodDel/named; /forged red after
// the first fix too). Helpers: attack26_links_test.go.
// Run:
//
//	go test -count=1 -run 'TestAttack28' -parallel 2 -v ./test/integration/

package integration

import (
	"os"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a28RenamedReAliased adds a pod, renames its host veth to to and gives
// it the alias of an attachment that does not exist (someone else's).
func a28RenamedReAliased(t *testing.T, e *testenv.Env, id, to string) *a26Pod {
	t.Helper()
	p := a26Add(t, e, id)
	a26Rename(t, e, p, to)
	a26SetAlias(t, e, p.idx, "ebpf-cni:"+e.Name+"/someone-else/eth0")
	return p
}

// a28Whole fails when the live pod is half torn down: its veth left with
// its record or lease released (the address would go to the next pod).
// It returns whether the veth is still there.
func a28Whole(t *testing.T, e *testenv.Env, p *a26Pod, after string) bool {
	t.Helper()
	ours := a26Link(t, e, p.idx) != nil
	_, recErr := os.Stat(e.RecordPath(p.id, "eth0"))
	lease := len(e.ReservationsOf(p.id)) > 0
	var eps int
	for _, ip := range p.ips {
		if _, err := e.Maps().Endpoints().Lookup(ip); err == nil {
			eps++
		}
	}
	t.Logf("after %s: veth %v, record %v, lease %v, endpoint entries %d of %d", after, ours, recErr == nil, lease, eps, len(p.ips))
	whole := ours && recErr == nil && lease && eps == len(p.ips)
	gone := !ours && recErr != nil && !lease && eps == 0
	if !whole && !gone {
		t.Errorf("after %s: the live pod is half torn down: veth %v, record %v, lease %v, endpoint entries %d of %d",
			after, ours, recErr == nil, lease, eps, len(p.ips))
	}
	return ours
}

// TestAttack28RenamedReAliasedDel: DEL of a pod whose host veth was
// renamed and re-aliased must delete the veth (CHECK names it the pod's),
// its entries, record and lease.
func TestAttack28RenamedReAliasedDel(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a28RenamedReAliased(t, e, "a28ra-del", "a28op0")
	a26Teardown(t, e, p, "del")
	a26AssertTornDown(t, e, p, "DEL")
}

// TestAttack28RenamedReAliasedReconcile: `ebpf-agent reconcile` with the
// pod live (netns and veth there, renamed and re-aliased): the pod stays
// whole or goes whole.
func TestAttack28RenamedReAliasedReconcile(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a28RenamedReAliased(t, e, "a28ra-rc", "a28op1")
	a26Teardown(t, e, p, "reconcile")
	a28Whole(t, e, p, "reconcile")
}

// TestAttack28RenamedReAliasedGCValid: the plugin's GC with the pod in the
// runtime's valid attachments: the pod must stay whole, and CHECK must
// still find it (naming the rename).
func TestAttack28RenamedReAliasedGCValid(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a28RenamedReAliased(t, e, "a28ra-gcv", "a28op2")
	if err := a16GC(t, e, p.id); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if !a28Whole(t, e, p, "GC (pod valid)") {
		t.Errorf("GC deleted the veth of a valid attachment")
	}
}

// a28ForeignIntoPod: our host veth deleted (`ip link del`, the pod's netns
// lives on); a third party (another plugin adding an interface to the same
// pod) makes a veth at our veth's old ifindex, named name, its peer
// "net9" moved into the pod's netns, with alias alias. It returns the
// link's ifindex.
func a28ForeignIntoPod(t *testing.T, e *testenv.Env, p *a26Pod, name, alias string) int {
	t.Helper()
	err := e.InNode(func() error {
		l, err := netlink.LinkByIndex(p.idx)
		if err != nil {
			return err
		}
		if err := netlink.LinkDel(l); err != nil {
			return err
		}
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, Index: p.idx}, PeerName: "net9",
			PeerNamespace: netlink.NsFd(int(p.pod.Fd()))}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return err
		}
		if alias != "" {
			if err := netlink.LinkSetAlias(l, alias); err != nil {
				return err
			}
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatalf("the third party's veth %s at ifindex %d into the pod: %v", name, p.idx, err)
	}
	l := a26Link(t, e, p.idx)
	if l == nil || l.Attrs().Name != name {
		t.Fatalf("the third party's veth %s did not get ifindex %d", name, p.idx)
	}
	return p.idx
}

// TestAttack28ForeignIntoPodDel: our veth deleted, a third party's veth at
// its old ifindex with its peer in the pod's netns (what recordedVeth
// takes for ours: the record's ifindex, a peer in the record's netns).
// DEL must leave that veth, and release the pod's record, lease and
// entries. "other": under another name, no alias; "named": under our
// veth's name with an alias naming another attachment of the network;
// "forged": under another name with our veth's alias copied.
func TestAttack28ForeignIntoPodDel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, link, alias string }{
		{"other", "a28tp0", ""},
		{"named", "", "x"},
		{"forged", "a28tp1", "ours"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := testenv.New(t)
			p := a26Add(t, e, "a28fp-"+c.name)
			link, alias := c.link, c.alias
			if link == "" {
				link = p.name
			}
			switch alias {
			case "x":
				alias = "ebpf-cni:" + e.Name + "/someone-else/eth0"
			case "ours":
				alias = p.alias // copied
			}
			p.foreignIdx = a28ForeignIntoPod(t, e, p, link, alias)
			a26Teardown(t, e, p, "del")
			a26AssertForeign(t, e, p.foreignIdx, link, alias, "DEL")
			a26AssertRecordLease(t, e, p, "DEL")
			for _, ip := range p.ips {
				if ep, err := e.Maps().Endpoints().Lookup(ip); err == nil {
					t.Errorf("after DEL: endpoint entry of %s left: %+v", ip, ep)
				}
			}
		})
	}
}
