package cni

import (
	"errors"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/plugins/pkg/ipam"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// addWait is how long DEL waits for an ADD of the same attachment to end.
const addWait = 30 * time.Second

// del is the CNI DEL verb: best effort and idempotent. It needs neither the
// netns nor the veth to exist, and succeeds when called again.
func del(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	n := conf.net
	if err := n.CheckDirs(); err != nil {
		return err
	}
	defer datapath.MarkBusy(n.PinDir)() // the agent's background work waits
	store := n.Store()
	rec, err := store.Read(args.ContainerID, args.IfName)
	if err != nil {
		// A corrupt record must not block DEL: fall back to what can be derived.
		rec = nil
	} else if rec == nil {
		// No record: hold one for this DEL's duration, so an ADD of the
		// attachment starting meanwhile is refused (11) instead of having
		// its fresh IPAM lease released by this DEL. Teardown removes it,
		// and the directories the claim made go with it.
		if _, err := os.Stat(store.Dir()); errors.Is(err, os.ErrNotExist) {
			defer store.RemoveDirsIfEmpty()
		}
		claim := &state.Record{ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns,
			Provisional: true, Pid: os.Getpid(), Created: time.Now().UTC()}
		if f, cerr := store.Claim(claim); cerr == nil {
			defer f.Close()
		} else if errors.Is(cerr, state.ErrClaimed) {
			// An ADD claimed it just now: wait for it below.
			if rec, err = store.Read(args.ContainerID, args.IfName); err != nil {
				rec = nil
			}
		}
	}
	if rec != nil && store.Busy(rec) {
		// An ADD of this attachment is still at work: tear down what it
		// ends with, not what it has made so far.
		if !store.WaitIdle(args.ContainerID, args.IfName, addWait) {
			if rec.WriterGone() {
				return endpoint.Errorf(endpoint.ErrTryAgain,
					"the remains of an ADD of CNI_CONTAINERID %q, CNI_IFNAME %q (pid %d) that did not finish are still being torn down (GC or ebpf-agent reconcile) after %s", args.ContainerID, args.IfName, rec.Pid, addWait)
			}
			return endpoint.Errorf(endpoint.ErrTryAgain,
				"an ADD of CNI_CONTAINERID %q, CNI_IFNAME %q (pid %d) is still running after %s", args.ContainerID, args.IfName, rec.Pid, addWait)
		}
		if rec, err = store.Read(args.ContainerID, args.IfName); err != nil {
			rec = nil
		}
	}
	tr := endpoint.NewTracer()
	defer tr.Done("DEL")
	// The IPAM release is a separate process: run it while tearing down.
	ipamErr := make(chan error, 1)
	go func() {
		if conf.IPAM.Type == "" {
			ipamErr <- nil
			return
		}
		if err := ipam.ExecDel(conf.IPAM.Type, args.StdinData); err != nil {
			ipamErr <- endpoint.IPAMError(conf.IPAM.Type, err)
			return
		}
		ipamErr <- nil
	}()
	errs := endpoint.Remove(n, args.ContainerID, args.IfName, args.Netns, rec, endpoint.AllFeatures(), tr)
	tr.Mark("teardown")
	errs = errors.Join(errs, <-ipamErr)
	tr.Mark("ipam-wait")
	return errs // every error, one code (cniError)
}
