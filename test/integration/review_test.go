// Hostile review: attacks on the stack-flow table and the integrity of
// attachments that earlier tests did not cover.

package integration

import (
	"os"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestReviewDelRacingAdd: a DEL of an attachment started while its ADD is
// under way (a runtime giving up on a slow ADD; the spec forbids it, runtimes
// still do it). Whatever the interleaving, the node ends as one of the two
// serial orders left it: the attachment complete and working (DEL first),
// or nothing of it (ADD first) - never a veth without its lease or record.
func TestReviewDelRacingAdd(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	for i := 0; i < 8; i++ {
		pod := e.NewPod()
		id := testenv.RandName("race")
		e.CleanupDel(pod, id)
		delay := time.Duration(i) * 4 * time.Millisecond
		type addOut struct {
			res types.Result
			err error
		}
		addCh, delCh := make(chan addOut, 1), make(chan error, 1)
		go func() { r, err := e.AddV("1.1.0", pod, id, "eth0"); addCh <- addOut{r, err} }()
		go func() { time.Sleep(delay); delCh <- e.Del(pod, id, "eth0") }()
		ao, derr := <-addCh, <-delCh
		t.Logf("round %d (DEL after %s): ADD %v, DEL %v", i, delay, ao.err, derr)
		hostIf := state.HostIfName(id, "eth0")
		if e.NodeLinkExists(hostIf) {
			if ao.err != nil {
				t.Errorf("round %d: ADD failed (%v) but its veth %s is left", i, ao.err, hostIf)
			} else if r, err := current.NewResultFromResult(ao.res); err != nil {
				t.Fatal(err)
			} else {
				v4, _ := testenv.PodIPs(t, r)
				if _, err := os.Stat(e.RecordPath(id, "eth0")); err != nil {
					t.Errorf("round %d: veth %s of %s left without its record: %v", i, hostIf, v4, err)
				}
				if len(e.ReservationsOf(id)) == 0 {
					t.Errorf("round %d: veth %s of %s left, its address not reserved in IPAM (the next pod gets it)", i, hostIf, v4)
				}
				if err := testenv.Ping(e.Node, v4, 1); err != nil {
					t.Errorf("round %d: the attachment left (%s) does not answer: %v", i, v4, err)
				}
			}
		} else {
			e.AssertNothingOf(id)
		}
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Errorf("round %d: final DEL: %v", i, err)
		}
		e.AssertNothingOf(id)
	}
}
