// attack30: a pod moves its own interface (our veth's pod end) into a
// netns of its own making (CAP_NET_ADMIN and CAP_SYS_ADMIN in the pod: it
// unshares a netns and moves eth0 there): the host veth's peer is then in
// another netns than the record's. The teardown and the liveness judgement
// go by the host veth's name and alias, or, renamed by an operator, by the
// record's ifindex, alias and host MAC (renamedVeth), and, re-aliased too,
// by the ifindex and MAC alone (recordedVeth), none of which the pod can
// touch: reconcile keeps the live pod whole, and DEL removes it whole.
// "plain" and "renamed" green when written (guards); "realiased" red
// before attack30: recordedVeth wanted the peer in the record's netns, so
// reconcile released the live pod's record, lease and entries (its veth
// left) and DEL left the veth and its links entry. Helpers:
// attack26_links_test.go, attack28_test.go.

package integration

import (
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a30MovePeer moves the pod's eth0 into child (from inside the pod, as the
// pod's own process would).
func a30MovePeer(t *testing.T, p *a26Pod, child ns.NetNS) {
	t.Helper()
	err := p.pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(l, int(child.Fd()))
	})
	if err != nil {
		t.Fatalf("move the pod's eth0 into its own netns: %v", err)
	}
}

// TestAttack30MovedPeerTeardown: reconcile, then DEL, of a pod whose eth0
// its own process moved into a child netns; "renamed": an operator also
// renamed the host veth; "realiased": and set an alias naming another
// attachment (attack28's operator).
func TestAttack30MovedPeerTeardown(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"plain", "renamed", "realiased"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := testenv.New(t)
			p := a26Add(t, e, "a30mv-"+name)
			child := testenv.NewNS(t)
			a30MovePeer(t, p, child)
			if name != "plain" {
				a26Rename(t, e, p, "a30op"+name[:2])
			}
			if name == "realiased" {
				a26SetAlias(t, e, p.idx, "ebpf-cni:"+e.Name+"/someone-else/eth0")
			}
			if l := a26Link(t, e, p.idx); l == nil || l.Attrs().NetNsID < 0 {
				t.Fatalf("host veth (ifindex %d) after the move: %v, want its peer in another netns", p.idx, l)
			}
			a26Teardown(t, e, p, "reconcile")
			if !a28Whole(t, e, p, "reconcile") {
				t.Fatalf("reconcile deleted the veth of a live pod whose eth0 moved into its own netns")
			}
			a26Teardown(t, e, p, "del")
			a26AssertTornDown(t, e, p, "DEL")
		})
	}
}
