package cni

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/vishvananda/netlink"
)

// Reconcile finds the attachments of a network whose host veth no longer
// exists in this netns (the pod's netns went away without a DEL reaching us,
// say) and tears each down as DEL would, IPAM release included. conf is the
// plugin's network configuration as a runtime would pass it; cniPath finds
// the IPAM plugin. With dryRun it only lists what it would remove.
func Reconcile(conf []byte, cniPath string, dryRun bool) ([]string, error) {
	c, err := parseConf(conf)
	if err != nil {
		return nil, err
	}
	if err := checkDirs(c); err != nil {
		return nil, err
	}
	recs, err := ListRecords(c.StateDir, c.Name)
	if err != nil {
		return nil, fmt.Errorf("read state directory %s: %w", c.StateDir, err)
	}
	var (
		done []string
		errs error
	)
	for _, r := range recs {
		what := fmt.Sprintf("attachment %s/%s of network %s (veth gone; IPs %v)", r.ContainerID, r.IfName, c.Name, r.IPs)
		switch {
		case r.Provisional:
			if recordBusy(c.StateDir, c.Name, r) {
				continue // an ADD is making it
			}
			// Its ADD died part way (the lock went with the process).
			what = fmt.Sprintf("attachment %s/%s of network %s (half made by an ADD that did not finish, pid %d)", r.ContainerID, r.IfName, c.Name, r.Pid)
		default:
			if _, err := netlink.LinkByName(HostIfName(r.ContainerID, r.IfName)); err == nil {
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
		if c.IPAM.Type != "" {
			args := &skel.CmdArgs{Path: cniPath, StdinData: conf}
			if err := ipamDelFor(c, args, r); err != nil {
				errs = errors.Join(errs, fmt.Errorf("release IPs of %s/%s: %w", r.ContainerID, r.IfName, err))
				continue
			}
		}
		if err := teardown(c, r.ContainerID, r.IfName, r.Netns, r, newTracer()); err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		done = append(done, what)
	}
	return done, errs
}

// ConfDirs returns the network name and the directories a network
// configuration uses, defaults applied.
func ConfDirs(conf []byte) (name, pinDir, stateDir string, err error) {
	c, err := parseConf(conf)
	if err != nil {
		return "", "", "", err
	}
	return c.Name, c.PinDir, c.StateDir, nil
}
