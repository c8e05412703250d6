// attack30b: hostile review of attack30's look at a pod's other
// interfaces (otherAttachment). A veth of another attachment of ours is one
// whose peer is in the node's netns; the look found the node's netns id by
// the pod's interface being deleted (its name and its peer's index), and
// without it took any netns but the pod's for the node's. The pod, with
// CAP_NET_ADMIN and CAP_SYS_ADMIN in its netns, renames its own eth0 and
// makes a netns of its own.

package integration

import (
	"fmt"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack30bRenamedEth0DecoySibling: pod A renames its eth0 (the look
// no longer finds the interface being deleted by its name), makes a veth
// pair whose peer it moves into a netns of its own at the ifindex of pod
// B's host veth in the node. A's DEL of its only interface must delete A's
// cni_netns entry, and leave B's.
//
// Red before attack30b: without the interface being deleted found, the
// look took the decoy's peer netns for the node's, the peer's index for B's
// host veth (B's cni_links entry), and kept A's entry past its last DEL.
func TestAttack30bRenamedEth0DecoySibling(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	podA, podB := e.NewPod(), e.NewPod()
	own := e.NewPod() // the netns pod A makes (unshare -n) for the decoy's peer
	idA, idB := "a30bdecA", "a30bdecB"
	t.Cleanup(func() { _ = e.Del(podA, idA, "eth0"); _ = e.Del(podB, idB, "eth0") })
	e.Add(podA, idA)
	e.Add(podB, idB)
	_, idxA := e.HostVeth(idA)
	_, idxB := e.HostVeth(idB)
	cookieA, cookieB := e.NetnsCookieOf(podA), e.NetnsCookieOf(podB)
	for _, c := range []uint64{cookieA, cookieB} {
		if _, err := testenv.LookupNetns(e.Maps(), c); err != nil {
			t.Fatalf("no cni_netns entry for cookie %d after ADD: %v", c, err)
		}
	}
	// What pod A does in its own netns: eth0 renamed, a veth pair whose
	// peer (at B's host veth's index) goes into a netns of A's.
	ipInPod(t, podA, "link", "set", "eth0", "down")
	ipInPod(t, podA, "link", "set", "eth0", "name", "a30beth")
	ipInPod(t, podA, "link", "set", "a30beth", "up")
	ipInPod(t, podA, "link", "add", "a30bx", "type", "veth", "peer", "name", "a30by", "index", fmt.Sprint(idxB))
	if err := podA.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("a30by")
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(l, int(own.Fd()))
	}); err != nil {
		t.Fatalf("moving the decoy's peer into pod A's own netns: %v", err)
	}
	var peerIdx int
	if err := own.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("a30by")
		if err == nil {
			peerIdx = l.Attrs().Index
		}
		return err
	}); err != nil || peerIdx != idxB {
		t.Fatalf("the decoy's peer in pod A's netns: index %d (want B's host veth's %d): %v", peerIdx, idxB, err)
	}
	t.Logf("pod A's links:\n%s", ipInPod(t, podA, "-d", "link", "show"))

	if err := e.Del(podA, idA, "eth0"); err != nil {
		t.Fatalf("DEL of pod A: %v", err)
	}
	if v, err := testenv.LookupNetns(e.Maps(), cookieA); err == nil {
		t.Errorf("pod A's last DEL left its cni_netns entry (%+v): A's own veth, its peer in a netns of A's at B's host ifindex %d, was taken for another interface of A's", v, idxB)
	}
	if _, err := testenv.LookupNetns(e.Maps(), cookieB); err != nil {
		t.Errorf("pod B lost its cni_netns entry to A's DEL: %v", err)
	}
	if err := e.InNode(func() error { _, err := netlink.LinkByIndex(idxA); return err }); err == nil {
		t.Errorf("pod A's host veth (ifindex %d) outlived its DEL", idxA)
	}
}
