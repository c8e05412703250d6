package cni

import (
	"context"
	"errors"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// gcSeam is the sweep's test seam (endpoint.Sweep.Seam).
var gcSeam func(*state.Record)

// gc is the CNI GC verb: every attachment of this network that has a record
// but is not in cni.dev/valid-attachments is torn down and its IPs released;
// then what no attachment owns any more: temp files of killed record
// writes, veths handed off to an agent that is no longer running, link pins
// and hostPort entries of veths that are gone, and the IPAM plugin's own
// garbage.
func gc(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	n := conf.net
	if err := n.CheckDirs(); err != nil {
		return err
	}
	valid := make(map[string]bool)
	for _, a := range conf.ValidAttachments {
		valid[a.ContainerID+"/"+a.IfName] = true
	}
	// Complete and not valid, or Abandoned: half made by an ADD that died.
	// One whose ADD ended during this GC (Completed) stays: the runtime's
	// valid list, made before, cannot name it. The next GC decides.
	sweep := &endpoint.Sweep{Net: n, Conf: args.StdinData, CNIPath: args.Path, Valid: valid, Seam: gcSeam,
		Gone: func(_ *state.Record, st state.Status) (bool, error) { return st != state.Completed, nil }}
	recs, err := sweep.List()
	if err != nil {
		return err
	}
	_, errs := sweep.TearDownGone(recs)
	errs = errors.Join(errs, n.Store().RemoveStaleTemps())
	if !datapath.AgentAlive(n.PinDir) {
		// Veths handed off to an agent that is gone (see endpoint.Reap).
		_, err := endpoint.ReapAll(context.TODO(), n.PinDir, nil)
		errs = errors.Join(errs, err)
	}
	_, err = datapath.RemoveOrphanVethLinkPins(n.PinDir)
	errs = errors.Join(errs, err)
	if m, err := datapath.OpenMaps(n.PinDir); err == nil {
		_, perr := endpoint.PruneHostPorts(m)
		m.Close()
		errs = errors.Join(errs, perr)
	} else {
		errs = errors.Join(errs, endpoint.OpenError(n.PinDir, err))
	}
	if conf.IPAM.Type != "" {
		// The IPAM plugin may hold reservations we have no record of.
		if err := invoke.DelegateGC(context.TODO(), conf.IPAM.Type, args.StdinData, nil); err != nil {
			errs = errors.Join(errs, endpoint.IPAMError(conf.IPAM.Type, err))
		}
	}
	// Joined as they are: cniError answers the code of the first with a
	// kind (a foreign pin's 50), 999 when none has one.
	return errs
}
