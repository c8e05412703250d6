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

// A Sweep tears down the attachments of a network that are gone, each as
// DEL would, IPAM release included: those an ADD killed part way left
// (abandoned claims) and the complete ones Gone judges gone. GC and the
// agent's reconcile (and uninstall, record by record) differ only in Gone.
type Sweep struct {
	Net     *Network
	Conf    []byte // the network configuration as a runtime passes it (the IPAM plugin reads it)
	CNIPath string // where the IPAM plugin is found (CNI_PATH)
	// Valid names the attachments ("containerID/ifname") the runtime says
	// exist (GC's cni.dev/valid-attachments): never looked at.
	Valid map[string]bool
	// Gone judges an attachment no ADD is at work on, as rechecked after the
	// listing (state.Store.Recheck): st is Complete, Completed (its ADD
	// ended after the listing) or Abandoned. nil: every one is gone.
	Gone   func(r *state.Record, st state.Status) (bool, error)
	DryRun bool // only list what would be torn down
	// Seam is the test seam: it runs after the listing (with nil) and, for
	// each attachment to tear down, once its claim is held (state.Store.Hold).
	Seam func(*state.Record)
}

// Run sweeps the network: it lists the records, judges each and tears the
// gone ones down, returning what it tore down (or, DryRun, would).
func (s *Sweep) Run() ([]string, error) {
	recs, err := s.List()
	if err != nil {
		return nil, err
	}
	return s.TearDownGone(recs)
}

// List lists the network's records.
func (s *Sweep) List() ([]*state.Record, error) {
	recs, err := s.Net.Store().List()
	if err != nil {
		return nil, Errorf(ErrIO, "read state directory %s: %w", s.Net.StateDir, err)
	}
	return recs, nil
}

// TearDownGone judges each listed record again and tears the gone ones down.
func (s *Sweep) TearDownGone(recs []*state.Record) ([]string, error) {
	store := s.Net.Store()
	var (
		done []string
		errs error
	)
	s.seam(nil)
	for _, r := range recs {
		if s.Valid[r.ContainerID+"/"+r.IfName] {
			continue
		}
		st, now, err := store.Recheck(r)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		if st == state.Adding || st == state.Gone {
			continue
		}
		if s.Gone != nil {
			if gone, err := s.Gone(now, st); err != nil || !gone {
				errs = errors.Join(errs, err)
				continue
			}
		}
		what := fmt.Sprintf("attachment %s/%s of network %s (veth gone; IPs %v)", now.ContainerID, now.IfName, s.Net.Name, now.IPs)
		if st == state.Abandoned {
			// Its ADD died part way (the lock went with the process).
			what = fmt.Sprintf("attachment %s/%s of network %s (half made by an ADD that did not finish, pid %d)", now.ContainerID, now.IfName, s.Net.Name, now.Pid)
		}
		if s.DryRun {
			done = append(done, what)
			continue
		}
		if ok, err := s.TearDown(now, st); err != nil {
			errs = errors.Join(errs, err)
		} else if ok {
			done = append(done, what)
		}
	}
	return done, errs
}

func (s *Sweep) seam(r *state.Record) {
	if s.Seam != nil {
		s.Seam(r)
	}
}

// TearDown releases the IPs of an attachment judged gone (st from
// state.Store.Recheck) and tears it down; false when an abandoned claim is
// someone else's by now. The claim is held meanwhile (state.Store.Hold): a
// DEL and a new ADD of the attachment cannot come between and lose the new
// one.
func (s *Sweep) TearDown(r *state.Record, st state.Status) (bool, error) {
	if st == state.Abandoned {
		release, ok, err := s.Net.Store().Hold(r)
		if err != nil || !ok {
			return false, err
		}
		defer release()
	}
	s.seam(r)
	if err := ReleaseIPAM(s.Net, s.Conf, s.CNIPath, r); err != nil {
		return false, fmt.Errorf("release IPs of %s/%s: %w", r.ContainerID, r.IfName, err) // the record stays: the next look retries
	}
	id := ID{ContainerID: r.ContainerID, IfName: r.IfName, Netns: r.Netns}
	if err := forget(s.Net, id, tearDown(s.Net, id, r, nil)); err != nil {
		return false, fmt.Errorf("tear down %s/%s: %w", r.ContainerID, r.IfName, err)
	}
	return true, nil
}

// Reconcile is the agent's sweep of a network: an attachment is gone when
// its host veth no longer exists in this netns (the pod's netns went away
// without a DEL reaching us, say), or an ADD killed part way left it.
// conf is the network configuration as a runtime would pass it; cniPath
// finds the IPAM plugin. With dryRun it only lists what it would remove.
func Reconcile(n *Network, conf []byte, cniPath string, dryRun bool) ([]string, error) {
	if err := n.CheckDirs(); err != nil {
		return nil, err
	}
	return reconcileSweep(n, conf, cniPath, dryRun).Run()
}

// reconcileSweep is Reconcile's Sweep.
func reconcileSweep(n *Network, conf []byte, cniPath string, dryRun bool) *Sweep {
	return &Sweep{Net: n, Conf: conf, CNIPath: cniPath, DryRun: dryRun,
		Gone: func(r *state.Record, st state.Status) (bool, error) { return vethGone(n.Name, r, st) }}
}

// vethGone: an abandoned claim is gone; a complete attachment (or one
// whose ADD ended after the listing) only when its host veth is: no link
// has its name, or the one that has is another tool's, made since
// (replacedLink).
func vethGone(network string, r *state.Record, st state.Status) (bool, error) {
	if st == state.Abandoned {
		return true, nil
	}
	l, err := netlinksafe.LinkByName(state.HostIfName(r.ContainerID, r.IfName))
	if err == nil && !replacedLink(l, r, network, r.ContainerID, r.IfName) {
		return false, nil
	}
	var nf netlink.LinkNotFoundError
	if err != nil && !errors.As(err, &nf) {
		return false, err
	}
	// Not under its name: an operator may have renamed it (the pod lives
	// on; attack26 saw a live pod's record and lease released), and
	// changed its alias too (recordedVeth, as CHECK and DEL judge it;
	// attack28: reconcile released a live pod's record, lease and entries).
	if r.HostIfindex != 0 {
		if l, err := netlink.LinkByIndex(r.HostIfindex); err == nil &&
			renamedHostVeth(nil, l, r, network) {
			return false, nil
		}
	}
	return true, nil
}
