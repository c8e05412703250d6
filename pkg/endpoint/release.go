package endpoint

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// afterList is a test seam: it runs between Reconcile's listing of the
// records and its look at each.
var afterList = func() {}

// ReleaseIPAM runs the IPAM plugin's DEL for a recorded attachment, as its
// DEL would, for callers that have no CNI_* of it (GC, the agent). conf is
// the network configuration the IPAM plugin reads on stdin; cniPath is
// where it is found (CNI_PATH).
func ReleaseIPAM(n *Network, conf []byte, cniPath string, r *state.Record) error {
	if n.IPAMType == "" {
		return nil
	}
	plugin, err := invoke.FindInPath(n.IPAMType, filepath.SplitList(cniPath))
	if err != nil {
		return err
	}
	a := &invoke.Args{Command: "DEL", ContainerID: r.ContainerID, IfName: r.IfName, Path: cniPath, NetNS: r.Netns}
	return invoke.ExecPluginWithoutResult(context.TODO(), plugin, conf, a, nil)
}

// Reconcile finds the attachments of a network whose host veth no longer
// exists in this netns (the pod's netns went away without a DEL reaching
// us, say), or that an ADD killed part way left, and tears each down as
// DEL would, IPAM release included. conf is the network configuration as
// a runtime would pass it; cniPath finds the IPAM plugin. With dryRun it
// only lists what it would remove.
func Reconcile(n *Network, conf []byte, cniPath string, dryRun bool) ([]string, error) {
	if err := n.CheckDirs(); err != nil {
		return nil, err
	}
	store := n.Store()
	recs, err := store.List()
	if err != nil {
		return nil, fmt.Errorf("read state directory %s: %w", n.StateDir, err)
	}
	var (
		done []string
		errs error
	)
	afterList()
	for _, r := range recs {
		st, now, err := store.Recheck(r)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		switch st {
		case state.Adding, state.Gone:
			continue
		}
		r = now
		what := fmt.Sprintf("attachment %s/%s of network %s (veth gone; IPs %v)", r.ContainerID, r.IfName, n.Name, r.IPs)
		if st == state.Abandoned {
			// Its ADD died part way (the lock went with the process).
			what = fmt.Sprintf("attachment %s/%s of network %s (half made by an ADD that did not finish, pid %d)", r.ContainerID, r.IfName, n.Name, r.Pid)
		} else {
			// Complete, or Completed (its ADD ended after the listing):
			// gone only when its veth is.
			if _, err := netlinksafe.LinkByName(state.HostIfName(r.ContainerID, r.IfName)); err == nil {
				continue
			} else {
				var nf netlink.LinkNotFoundError
				if !errors.As(err, &nf) {
					errs = errors.Join(errs, err)
					continue
				}
			}
		}
		if dryRun {
			done = append(done, what)
			continue
		}
		if ok, err := TearDownJudged(n, st, r, conf, cniPath, nil); err != nil {
			errs = errors.Join(errs, err)
		} else if ok {
			done = append(done, what)
		}
	}
	return done, errs
}

// TearDownJudged releases the IPs of an attachment GC or Reconcile judged
// gone (st from state.Store.Recheck) and tears it down; false when an
// abandoned claim is someone else's by now. The claim is held meanwhile
// (state.Store.Hold): a DEL and a new ADD of the attachment cannot come
// between and lose the new one. before, if set, runs once it is held (a
// test seam).
func TearDownJudged(n *Network, st state.Status, r *state.Record, conf []byte, cniPath string, before func(*state.Record)) (bool, error) {
	if st == state.Abandoned {
		release, ok, err := n.Store().Hold(r)
		if err != nil || !ok {
			return false, err
		}
		defer release()
	}
	if before != nil {
		before(r)
	}
	if err := ReleaseIPAM(n, conf, cniPath, r); err != nil {
		return false, fmt.Errorf("release IPs of %s/%s: %w", r.ContainerID, r.IfName, err) // the record stays: the next look retries
	}
	if err := Remove(n, r.ContainerID, r.IfName, r.Netns, r, AllFeatures(), nil); err != nil {
		return false, fmt.Errorf("tear down %s/%s: %w", r.ContainerID, r.IfName, err)
	}
	return true, nil
}
