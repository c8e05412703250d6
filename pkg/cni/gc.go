package cni

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// GC is the CNI GC verb: every attachment of this network that has a record
// but is not in cni.dev/valid-attachments is torn down and its IPs released.
func GC(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := checkDirs(conf); err != nil {
		return err
	}
	valid := make(map[string]bool)
	for _, a := range conf.ValidAttachments {
		valid[a.ContainerID+"/"+a.IfName] = true
	}
	recs, err := ListRecords(conf.StateDir, conf.Name)
	if err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("read state directory %s: %v", conf.StateDir, err), "")
	}
	var errs error
	for _, r := range recs {
		if valid[r.ContainerID+"/"+r.IfName] || recordBusy(conf.StateDir, conf.Name, r) {
			continue // in use, or an ADD is still making it
		}
		if conf.IPAM.Type != "" {
			if err := ipamDelFor(conf, args, r); err != nil {
				errs = errors.Join(errs, fmt.Errorf("release IPs of %s/%s: %w", r.ContainerID, r.IfName, err))
				continue // keep the record so the next GC retries
			}
		}
		if err := teardown(conf, r.ContainerID, r.IfName, r.Netns, r, newTracer()); err != nil {
			errs = errors.Join(errs, fmt.Errorf("tear down %s/%s: %w", r.ContainerID, r.IfName, err))
		}
	}
	errs = errors.Join(errs, removeStaleTemps(recordDir(conf.StateDir, conf.Name)))
	errs = errors.Join(errs, removeOrphanLinkPins(conf.PinDir))
	errs = errors.Join(errs, pruneHostPorts(conf.PinDir))
	if conf.IPAM.Type != "" {
		// The IPAM plugin may hold reservations we have no record of.
		if err := invoke.DelegateGC(context.TODO(), conf.IPAM.Type, args.StdinData, nil); err != nil {
			errs = errors.Join(errs, ipamError(conf.IPAM.Type, err))
		}
	}
	if errs != nil {
		return types.NewError(types.ErrInternal, errs.Error(), "")
	}
	return nil
}

// ipamDelFor runs the IPAM plugin's DEL for an attachment other than the
// (absent) one in the environment of a GC call.
func ipamDelFor(conf *NetConf, args *skel.CmdArgs, r *Record) error {
	paths := filepath.SplitList(args.Path)
	plugin, err := invoke.FindInPath(conf.IPAM.Type, paths)
	if err != nil {
		return err
	}
	a := &invoke.Args{Command: "DEL", ContainerID: r.ContainerID, IfName: r.IfName, Path: args.Path, NetNS: r.Netns}
	return invoke.ExecPluginWithoutResult(context.TODO(), plugin, args.StdinData, a, nil)
}

// removeStaleTemps drops the temp files of record writes that a killed
// plugin left between creating and renaming them (seconds old at most
// while a plugin is alive).
func removeStaleTemps(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var errs error
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".tmp") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Minute {
			if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = errors.Join(errs, err)
			}
		}
	}
	return errs
}

// removeOrphanLinkPins drops link pins whose host veth no longer exists.
func removeOrphanLinkPins(pinRoot string) error {
	ents, err := os.ReadDir(filepath.Join(pinRoot, "links"))
	if err != nil {
		return nil
	}
	var errs error
	for _, e := range ents {
		name := e.Name()
		i := strings.LastIndexByte(name, '_')
		if i <= 0 {
			continue
		}
		if _, err := netlink.LinkByName(name[:i]); err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				errs = errors.Join(errs, datapath.RemoveLinkPins(pinRoot, name[:i]))
			}
		}
	}
	return errs
}

// Status is the CNI STATUS verb: error 50 when the datapath cannot be used.
func Status(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := checkDirs(conf); err != nil {
		return err
	}
	dp, err := datapath.Ensure(conf.PinDir)
	if err != nil {
		return types.NewError(errPluginNotAvailable, fmt.Sprintf("datapath at %s is not usable: %v", conf.PinDir, err), "")
	}
	dp.Close()
	if conf.IPAM.Type != "" {
		if err := invoke.DelegateStatus(context.TODO(), conf.IPAM.Type, args.StdinData, nil); err != nil {
			return ipamError(conf.IPAM.Type, err)
		}
	}
	return nil
}

// pruneHostPorts drops hostPort mappings and flows of host veths that no
// longer exist. A pod being added has its veth before its mappings, so a
// concurrent ADD never loses its entries to this.
func pruneHostPorts(pinRoot string) error {
	dp, err := datapath.Open(pinRoot)
	if err != nil {
		return nil // never set up
	}
	defer dp.Close()
	_, err = dp.Maps.PruneHostPorts(func(ifindex int) bool {
		if ifindex == 0 {
			return false
		}
		_, err := netlink.LinkByIndex(ifindex)
		var nf netlink.LinkNotFoundError
		return !errors.As(err, &nf)
	})
	return err
}
