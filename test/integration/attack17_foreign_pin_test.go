// Attack (round 14 hostile review, attack17) on DEL with a map of another
// layout pinned in the node's place (README error 50, naming the pin) and
// the runtime retrying ADD of the same container meanwhile.

package integration

import (
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack17ForeignPinDelThenAdd: for each map pin of the node in turn, a
// masquerading pod x (live UDP flows, both families) is DELed while that
// pin is a map of another layout (50 naming the pin, or success), and the
// runtime then ADDs the same container again, still with the foreign pin
// (50 or success; never another code, and never a second set of IPAM
// reservations for x). With the pin back, DEL must succeed and leave
// nothing of x (veth, routes, link pins, IPAM, record, endpoint entries,
// masquerade flows, share, quota row), and a warm pod keeps its flows.
func TestAttack17ForeignPinDelThenAdd(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	echoUDP(t, lab.out, 7550)
	warm := addMasqPod(t, a, "a17fw", 7550)
	forEachMapPin(t, datapath.MapsDir(a.PinDir), 40*time.Second, func(i int, name, p string) {
		id := fmt.Sprintf("a17f%d", i)
		x := addMasqPod(t, a, id, 7550)
		back, ok := swapForeignPin(t, p)
		if !ok {
			t.Logf("%s: the kernel takes no foreign map of its sizes", name)
			return
		}
		err := a.Del(x.pod, id, "eth0")
		if err != nil && !is50Naming(err, p) {
			t.Errorf("DEL with a foreign %s: %v (code %d), want 50 naming it, or success", name, err, testenv.ErrCode(err))
		}
		r, aerr := a.AddV("1.0.0", x.pod, id, "eth0")
		ips := x.ips
		if aerr == nil {
			cr, err := current.NewResultFromResult(r)
			must(t, err)
			i4, i6 := testenv.PodIPs(t, cr)
			ips = []net.IP{i4, i6}
		}
		if aerr != nil && !is50Naming(aerr, p) && (err == nil || testenv.ErrCode(aerr) != 4) {
			t.Errorf("ADD again of %s with a foreign %s: %v (code %d), want 50 naming it, or success", id, name, aerr, testenv.ErrCode(aerr))
		}
		if res := a.ReservationsOf(id); len(res) > 2 {
			t.Errorf("foreign %s: after DEL (%v) and ADD again (%v), x holds IPAM reservations %v", name, testenv.ErrCode(err), testenv.ErrCode(aerr), res)
		}
		t.Logf("foreign %s: DEL code %d, ADD again code %d", name, testenv.ErrCode(err), testenv.ErrCode(aerr))
		back()
		hif, idx := x.hif, x.ifindex
		if aerr == nil {
			hif, idx = a.HostVeth(id)
		}
		if err := a.Del(x.pod, id, "eth0"); err != nil {
			t.Errorf("foreign %s: DEL with the pin back: %v", name, err)
		}
		for _, w := range []struct {
			hif string
			idx int
			ips []net.IP
		}{{x.hif, x.ifindex, x.ips}, {hif, idx, ips}} {
			if left := attachmentLeft(t, a, id, w.hif, w.idx, w.ips, true); len(left) > 0 {
				t.Errorf("foreign %s: DEL with the pin back left %v (ifindex %d)", name, left, w.idx)
			}
		}
		if err := a15MasqFlows(warm.pod, 7550); err != nil {
			t.Errorf("foreign %s: the warm pod's flows: %v", name, err)
		}
	})
}

// TestAttack17ForeignSFPinAddThenDel: with cni_sf_slots or cni_sf_pool a
// map of another layout, a new container's ADD is refused (50 naming the
// pin); the runtime, as after any failed ADD, puts things right (here: the
// pin back) and DELs the container at once. Nothing of the container may
// remain a second later: no host veth, no record, no IPAM reservation. An
// ADD that returns while its IPAM plugin still runs would reserve the
// addresses after the DEL released none, for good.
func TestAttack17ForeignSFPinAddThenDel(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	echoUDP(t, lab.out, 7552)
	addMasqPod(t, a, "a17sw", 7552)
	for _, m := range []string{"cni_sf_slots", "cni_sf_pool"} {
		p := filepath.Join(datapath.MapsDir(a.PinDir), m)
		for k := 0; k < 3; k++ {
			id := fmt.Sprintf("a17s%s%d", m[len(m)-4:], k)
			pod := a.NewPod()
			a.CleanupDel(pod, id)
			back, ok := swapForeignPin(t, p)
			if !ok {
				t.Fatalf("no foreign map for %s", m)
			}
			_, err := a.AddV("1.0.0", pod, id, "eth0")
			back()
			if err == nil {
				t.Logf("%s: ADD with a foreign %s succeeded", id, m)
			} else if !is50Naming(err, p) {
				t.Errorf("%s: ADD with a foreign %s: %v (code %d), want 50 naming it", id, m, err, testenv.ErrCode(err))
			}
			if derr := a.Del(pod, id, "eth0"); derr != nil {
				t.Errorf("%s: the runtime's DEL after the ADD (%d), the %s pin back: %v", id, testenv.ErrCode(err), m, derr)
			}
			time.Sleep(time.Second)
			left := attachmentLeft(t, a, id, state.HostIfName(id, "eth0"), 0, nil, true)
			t.Logf("%s: ADD with a foreign %s: code %d; a second after the DEL: %v", id, m, testenv.ErrCode(err), left)
			if len(left) > 0 {
				t.Errorf("%s: ADD refused with a foreign %s (code %d), then the pin back and the runtime's DEL: a second later it keeps %v", id, m, testenv.ErrCode(err), left)
			}
		}
	}
}
