package endpoint

import (
	"errors"
	"os"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// addWait is how long DEL waits for an ADD of the same attachment to end.
const addWait = 30 * time.Second

// Delete is the DEL of one attachment, best effort and idempotent: it needs
// neither the netns nor the veth to exist, and succeeds when called again.
// Like ADD it claims the attachment first (or, while an ADD of it is at
// work, waits for that ADD to end), then tears it down (Teardown) while
// release, when set, releases its IPAM reservation. The error joins every
// failure.
func Delete(n *Network, id ID, release func() error, tr *Tracer) error {
	if err := n.CheckDirs(); err != nil {
		return err
	}
	defer datapath.MarkBusy(n.PinDir)() // the agent's background work waits
	rec, done, err := claimForDelete(n, id)
	defer done()
	if err != nil {
		return err
	}
	tr.Mark("claim")
	// The IPAM release is a separate process: run it while tearing down.
	ipamErr := make(chan error, 1)
	go func() {
		if release == nil {
			ipamErr <- nil
			return
		}
		ipamErr <- release()
	}()
	errs := tearDown(n, id, rec, tr)
	tr.Mark("teardown")
	ipErr := <-ipamErr
	tr.Mark("ipam-wait")
	// The record (or this DEL's claim) goes only now: until the IPAM plugin
	// has released the lease, an ADD of the attachment is refused rather
	// than given a lease this release would free under it.
	return errors.Join(forget(n, id, errs), ipErr)
}

// claimForDelete is DEL's claim: the attachment's record, once no ADD of it
// is at work. Without a record DEL holds a provisional one for its
// duration (done releases it), so an ADD of the attachment starting
// meanwhile is refused (11) instead of having its fresh IPAM lease released
// by this DEL; the teardown removes it, and the directories the claim made
// go with it. A corrupt record must not block DEL: rec is nil then.
func claimForDelete(n *Network, id ID) (rec *state.Record, done func(), err error) {
	var undo []func()
	done = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	store := n.Store()
	rec, err = store.Read(id.ContainerID, id.IfName)
	if err != nil {
		rec = nil
	} else if rec == nil {
		if _, err := os.Stat(store.Dir()); errors.Is(err, os.ErrNotExist) {
			undo = append(undo, store.RemoveDirsIfEmpty)
		}
		claim := &state.Record{ContainerID: id.ContainerID, IfName: id.IfName, Netns: id.Netns,
			Provisional: true, Pid: os.Getpid(), Created: time.Now().UTC()}
		if f, cerr := store.Claim(claim); cerr == nil {
			undo = append(undo, func() { f.Close() })
		} else if errors.Is(cerr, state.ErrClaimed) {
			// An ADD claimed it just now: wait for it below.
			if rec, err = store.Read(id.ContainerID, id.IfName); err != nil {
				rec = nil
			}
		}
	}
	if rec == nil || !store.Busy(rec) {
		return rec, done, nil
	}
	// An ADD of this attachment is still at work: tear down what it ends
	// with, not what it has made so far.
	if !store.WaitIdle(id.ContainerID, id.IfName, addWait) {
		if rec.WriterGone() {
			return nil, done, Errorf(ErrTryAgain,
				"the remains of an ADD of CNI_CONTAINERID %q, CNI_IFNAME %q (pid %d) that did not finish are still being torn down (GC or ebpf-agent reconcile) after %s", id.ContainerID, id.IfName, rec.Pid, addWait)
		}
		return nil, done, Errorf(ErrTryAgain,
			"an ADD of CNI_CONTAINERID %q, CNI_IFNAME %q (pid %d) is still running after %s", id.ContainerID, id.IfName, rec.Pid, addWait)
	}
	if rec, err = store.Read(id.ContainerID, id.IfName); err != nil {
		rec = nil
	}
	return rec, done, nil
}
