package cni

import (
	"errors"
	"fmt"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ipam"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
)

// addWait is how long DEL waits for an ADD of the same attachment to end.
const addWait = 30 * time.Second

// Del is the CNI DEL verb: best effort and idempotent. It needs neither the
// netns nor the veth to exist, and succeeds when called again.
func Del(args *skel.CmdArgs) error {
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
	}
	if rec != nil && store.Busy(rec) {
		// An ADD of this attachment is still at work: tear down what it
		// ends with, not what it has made so far.
		if !store.WaitIdle(args.ContainerID, args.IfName, addWait) {
			return types.NewError(types.ErrTryAgainLater, fmt.Sprintf(
				"an ADD of CNI_CONTAINERID %q, CNI_IFNAME %q (pid %d) is still running after %s", args.ContainerID, args.IfName, rec.Pid, addWait), "")
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
	if errs != nil {
		var te *types.Error
		if errors.As(errs, &te) {
			return te
		}
		return types.NewError(types.ErrInternal, errs.Error(), "")
	}
	return nil
}
