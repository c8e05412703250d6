// Attack (round 14 hostile review, attack17) on ADD with a map of another
// layout pinned in the node's place (README error 50, naming the pin; "a
// failed ADD undoes everything it made, the IPAM reservation included") and
// the runtime retrying the ADD of the same container meanwhile.

package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack17ForeignPinAddRetried: for each map pin of the node in turn,
// a new masquerading container is ADDed while that pin is a map of another
// layout (50 naming the pin, or success), and ADDed again (the runtime's
// retry, no DEL between) while still foreign. A refused ADD must leave
// nothing (veth, routes, link pins, IPAM, record: as for every other
// error, README "leaving nothing behind"). With the pin back the retried
// ADD (if none succeeded) must work, its flows be masqueraded, it holds one
// pair of IPAM reservations, and its DEL leaves nothing.
func TestAttack17ForeignPinAddRetried(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	echoUDP(t, lab.out, 7551)
	warm := addMasqPod(t, a, "a17rw", 7551)
	forEachMapPin(t, datapath.MapsDir(a.PinDir), 40*time.Second, func(i int, name, p string) {
		a17NewWhileForeign(t, a, p, fmt.Sprintf("a17r%d", i))
		if err := a15MasqFlows(warm.pod, 7551); err != nil {
			t.Errorf("foreign %s: the warm pod's flows: %v", name, err)
		}
	})
}

func a17NewWhileForeign(t *testing.T, a *testenv.Env, p, id string) {
	t.Helper()
	name := filepath.Base(p)
	pod := a.NewPod()
	a.CleanupDel(pod, id)
	back, ok := swapForeignPin(t, p)
	if !ok {
		t.Logf("%s: the kernel takes no foreign map of its sizes", name)
		return
	}
	var r types.Result
	var err error
	for try := 0; try < 2 && (try == 0 || err != nil); try++ {
		r, err = a.AddV("1.0.0", pod, id, "eth0")
		if err != nil && !is50Naming(err, p) {
			t.Errorf("new %s's ADD %d with a foreign %s: %v (code %d), want 50 naming it, or success", id, try+1, name, err, testenv.ErrCode(err))
		}
		t.Logf("new %s's ADD %d with a foreign %s: code %d", id, try+1, name, testenv.ErrCode(err))
		if err != nil {
			r0 := a.ReservationsOf(id)
			time.Sleep(300 * time.Millisecond)
			t.Logf("IPAM of %s right after the refused ADD %d: %v, 0.3 s later %v", id, try+1, r0, a.ReservationsOf(id))
			left := attachmentLeft(t, a, id, state.HostIfName(id, "eth0"), 0, nil, false)
			if _, err := os.Stat(a.RecordPath(id, "eth0")); err == nil {
				left = append(left, "record")
			}
			if len(left) > 0 {
				t.Errorf("new %s's ADD %d refused (%d) with a foreign %s left %v", id, try+1, testenv.ErrCode(err), name, left)
			}
		}
	}
	back()
	if err != nil {
		if r, err = a.AddV("1.0.0", pod, id, "eth0"); err != nil {
			t.Errorf("new %s's ADD with the %s pin back: %v", id, name, err)
			return
		}
	}
	cr, err := current.NewResultFromResult(r)
	must(t, err)
	i4, i6 := testenv.PodIPs(t, cr)
	hif, idx := a.HostVeth(id)
	if res := a.ReservationsOf(id); len(res) != 2 {
		t.Errorf("new %s (a foreign %s on its first ADDs): IPAM reservations %v, want its 2", id, name, res)
	}
	if err := a15MasqFlows(pod, 7551); err != nil {
		t.Errorf("new %s (a foreign %s on its first ADDs): its flows: %v", id, name, err)
	}
	if err := a.Del(pod, id, "eth0"); err != nil {
		t.Errorf("new %s: DEL: %v", id, err)
	}
	if left := attachmentLeft(t, a, id, hif, idx, []net.IP{i4, i6}, true); len(left) > 0 {
		t.Errorf("new %s (a foreign %s on its first ADDs): DEL left %v", id, name, left)
	}
}
