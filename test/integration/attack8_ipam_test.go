// Hostile review 8, addresses: two containers given one address by IPAM.

package integration

import (
	"net"
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack8DelOfOtherContainerKeepsSameAddressPod: IPAM may hand an
// address that a live container still holds to a new one (static IPAM, a
// runtime that lost a DEL, a wiped host-local store). Either ADD refuses
// the second container, naming the address it cannot take (and leaves
// nothing behind), or it gives the address to the new container; then the
// later DEL of the first container must not take it away from the second:
// a runtime garbage-collecting a dead sandbox must not cut a live pod off.
func TestAttack8DelOfOtherContainerKeepsSameAddressPod(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.IPAM = staticIPAM("10.250.0.10/24", "fd00:250::10/64")
	ips := []net.IP{net.ParseIP("10.250.0.10"), net.ParseIP("fd00:250::10")}

	old := e.NewPod()
	e.CleanupDel(old, "old")
	e.Add(old, "old")
	e.PodReachable(t, old, ips)

	next := e.NewPod()
	e.CleanupDel(next, "next")
	_, err := e.AddV("1.1.0", next, "next", "eth0")
	if err != nil {
		// Refused: it must name the address and leave the live pod whole.
		if !strings.Contains(err.Error(), "10.250.0.10") && !strings.Contains(err.Error(), "fd00:250::10") {
			t.Errorf("ADD of a second container with the live pod's address failed without naming the address: %v", err)
		}
		e.PodReachable(t, old, ips)
		return
	}
	t.Logf("ADD of a second container with the live pod's address succeeded")
	e.PodReachable(t, next, ips)

	// The runtime deletes the first container (its sandbox died).
	e.MustDel(old, "old")
	for _, ip := range ips {
		if err := testenv.Ping(e.Node, ip, 2); err != nil {
			t.Errorf("after DEL of the other container, node to the live pod's %s: %v", ip, err)
		}
	}
	for _, ip := range []net.IP{testenv.NodeIP4, testenv.NodeIP6} {
		if err := testenv.Ping(next, ip, 2); err != nil {
			t.Errorf("after DEL of the other container, the live pod to the node %s: %v", ip, err)
		}
	}
	if err := e.Check(next, "next", "eth0"); err != nil {
		t.Errorf("CHECK of the live pod after DEL of the other container: %v", err)
	}
}
