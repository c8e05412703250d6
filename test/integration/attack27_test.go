// Attack27 (black box): design.md, "A name is not an owner". Our host veth
// renamed (and its peer changed inside the pod), renamed to another pod's
// old host-veth name, and a foreign veth with its peer in a third netns
// given our name after ours went; then DEL. Uses the a26 lab helpers.

package integration

import (
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// GUARD. TestAttack27RenamedPeerRenamedDel: our host veth renamed on the node AND
// its peer renamed inside the pod; DEL still deletes ours by index and
// forgets the record, lease and entries.
func TestAttack27RenamedPeerRenamedDel(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "a27pr")
	a26Rename(t, e, p, "a27op0")
	err := p.pod.Do(func(_ ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetDown(l); err != nil {
			return err
		}
		return netlink.LinkSetName(l, "a27inner")
	})
	if err != nil {
		t.Fatalf("rename peer in pod: %v", err)
	}
	a26Teardown(t, e, p, "del")
	a26AssertTornDown(t, e, p, "DEL")
}

// GUARD. TestAttack27RenamedToOtherPodsName: pod B is deleted, then pod A's host
// veth is renamed to B's old host-veth name; a repeated DEL of B must not
// touch A's veth; A's DEL deletes it.
func TestAttack27RenamedToOtherPodsName(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a := a26Add(t, e, "a27ona")
	b := a26Add(t, e, "a27onb")
	a26Teardown(t, e, b, "del")
	a26Rename(t, e, a, b.name)
	a26Teardown(t, e, b, "del")
	l := a26Link(t, e, a.idx)
	if l == nil {
		t.Fatalf("a repeated DEL of B deleted A's veth (ifindex %d, renamed to B's old name %s)", a.idx, b.name)
	}
	if l.Attrs().Alias != a.alias {
		t.Errorf("A's veth alias changed to %q by B's DEL", l.Attrs().Alias)
	}
	for _, ip := range a.ips {
		if _, err := e.Maps().Endpoints().Lookup(ip); err != nil {
			t.Errorf("B's DEL removed A's endpoint entry of %s: %v", ip, err)
		}
	}
	a26Teardown(t, e, a, "del")
	a26AssertTornDown(t, e, a, "DEL A")
}

// GUARD. TestAttack27ForeignThirdNetnsDel: our veth deleted (ip link del), a third
// party's veth with its peer in a third netns (a real veth with a remote
// peer) takes our name; DEL must leave it and forget the pod.
func TestAttack27ForeignThirdNetnsDel(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "a27tn")
	err := e.InNode(func() error {
		l, err := netlink.LinkByIndex(p.idx)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	})
	if err != nil {
		t.Fatalf("ip link del our veth: %v", err)
	}
	fidx := a26Foreign(t, e, p.name, 0, "")
	third := e.NewPod()
	peer := ("p" + p.name)
	if len(peer) > 15 {
		peer = peer[:15]
	}
	err = e.InNode(func() error {
		l, err := netlink.LinkByName(peer)
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(l, int(third.Fd()))
	})
	if err != nil {
		t.Fatalf("move foreign peer to a third netns: %v", err)
	}
	a26Teardown(t, e, p, "del")
	a26AssertForeign(t, e, fidx, p.name, "", "DEL")
	a26AssertRecordLease(t, e, p, "DEL")
	a26AssertEntries(t, e, p, "DEL")
}

// GUARD. TestAttack27RenamedReconcileThenDel: our veth renamed with its peer in
// the pod; reconcile keeps the pod (record, lease, veth), DEL then deletes it.
func TestAttack27RenamedReconcileThenDel(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "a27rr")
	a26Rename(t, e, p, "a27op1")
	a26Teardown(t, e, p, "reconcile")
	if a26Link(t, e, p.idx) == nil {
		t.Fatalf("reconcile deleted the renamed live veth")
	}
	if len(e.ReservationsOf(p.id)) == 0 {
		t.Errorf("reconcile released the lease of the live, renamed pod")
	}
	a26Teardown(t, e, p, "del")
	a26AssertTornDown(t, e, p, "DEL")
}

// GUARD. TestAttack27RenamedPeerMovedDel: our veth renamed, its peer moved
// from the pod into a third netns (still a veth with a remote peer, our
// alias and ifindex); DEL deletes ours by index and forgets the pod.
func TestAttack27RenamedPeerMovedDel(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "a27pm")
	a26Rename(t, e, p, "a27op2")
	third := e.NewPod()
	err := p.pod.Do(func(_ ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(l, int(third.Fd()))
	})
	if err != nil {
		t.Fatalf("move peer to a third netns: %v", err)
	}
	a26Teardown(t, e, p, "del")
	a26AssertTornDown(t, e, p, "DEL")
}

// GUARD. TestAttack27RenameDuringDel: our veth renamed while DEL runs
// concurrently; whichever wins, the veth, record, lease and entries go.
func TestAttack27RenameDuringDel(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "a27rd")
	done := make(chan error, 1)
	go func() { done <- e.Del(p.pod, p.id, "eth0") }()
	_ = e.InNode(func() error {
		l, err := netlink.LinkByIndex(p.idx)
		if err != nil {
			return nil
		}
		_ = netlink.LinkSetName(l, "a27op3")
		return nil
	})
	if err := <-done; err != nil {
		t.Fatalf("DEL racing a rename: %v", err)
	}
	a26AssertTornDown(t, e, p, "DEL")
}
