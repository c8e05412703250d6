// attack30: what a pod makes in its own netns (CAP_NET_ADMIN there, as
// istio-init and VPN sidecars have) against the DEL's look at its other
// interfaces (podSide): a veth of another attachment of ours is one whose
// peer is a host veth of the node's datapath.

package integration

import (
	"fmt"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack30PodLocalVethNotASibling: pod A makes a veth pair inside its
// own netns whose peer has the ifindex of pod B's host veth in the node
// (any pod reads its own eth0's iflink; a neighbour's is a guess nearby).
// A's DEL of its only interface must delete A's cni_netns entry, and leave
// B's.
//
// Red before attack30: the look took that veth's peer index (in A's
// netns) for a node ifindex of ours (B's cni_links entry) and kept A's
// entry: one entry left per pod that does it, which fill cni_netns
// (sized for maxPods) on a node without the agent's sweep.
func TestAttack30PodLocalVethNotASibling(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	podA, podB := e.NewPod(), e.NewPod()
	idA, idB := "a30sibA", "a30sibB"
	t.Cleanup(func() { _ = e.Del(podA, idA, "eth0"); _ = e.Del(podB, idB, "eth0") })
	e.Add(podA, idA)
	e.Add(podB, idB)
	_, idxB := e.HostVeth(idB)
	cookieA, cookieB := e.NetnsCookieOf(podA), e.NetnsCookieOf(podB)
	for _, c := range []uint64{cookieA, cookieB} {
		if _, err := testenv.LookupNetns(e.Maps(), c); err != nil {
			t.Fatalf("no cni_netns entry for cookie %d after ADD: %v", c, err)
		}
	}
	// Pod A's own veth pair, its peer at B's host veth's index.
	ipInPod(t, podA, "link", "add", "a30x", "type", "veth", "peer", "name", "a30y", "index", fmt.Sprint(idxB))
	t.Logf("pod A's links:\n%s", ipInPod(t, podA, "-d", "link", "show"))

	if err := e.Del(podA, idA, "eth0"); err != nil {
		t.Fatalf("DEL of pod A: %v", err)
	}
	if v, err := testenv.LookupNetns(e.Maps(), cookieA); err == nil {
		t.Errorf("pod A's last DEL left its cni_netns entry (%+v): a veth of A's own, its peer at B's host ifindex %d, was taken for another interface of A's", v, idxB)
	}
	if _, err := testenv.LookupNetns(e.Maps(), cookieB); err != nil {
		t.Errorf("pod B lost its cni_netns entry to A's DEL: %v", err)
	}
}
