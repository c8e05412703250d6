package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// UpgradeReport says what Upgrade did.
type UpgradeReport struct {
	Links        int      `json:"links"`                 // pinned links looked at
	Replaced     int      `json:"replaced"`              // links now running this build's program
	Filters      int      `json:"filters"`               // cls_bpf filters of host veths in tc mode (or waiting for tcx) looked at
	FiltersSwap  int      `json:"filtersSwapped"`        // of those, swapped to this build's program
	Defunct      []string `json:"defunct"`               // link pins whose device is gone (left for reconcile)
	RemovedProgs []string `json:"removedProgs"`          // program pins of other builds, unpinned
	RemovedMaps  []string `json:"removedMaps,omitempty"` // map directories of older layouts, unpinned
}

// pinnedLink is a link Upgrade may have to move.
type pinnedLink struct {
	l    link.Link
	name string // base name of its pin
	prog Program
}

// programOf finds the catalogue's program a link runs, by the name the
// kernel reports (cilium/ebpf recovers the full name from BTF where it can;
// else the kernel's first 15 characters, which cni_sock_connect4 and
// cni_sock_connect6 share: the link's attach type tells them apart).
func programOf(name string, attach ebpf.AttachType) (Program, bool) {
	for _, p := range catalog {
		if p.Name == name {
			return p, true
		}
	}
	for _, p := range catalog {
		if kernelProgName(p.Name) == name && p.Attach == attach {
			return p, true
		}
	}
	return Program{}, false
}

// linkAttachType is the hook of a tcx or cgroup link.
func linkAttachType(info *link.Info) ebpf.AttachType {
	if t := info.TCX(); t != nil {
		return ebpf.AttachType(t.AttachType)
	}
	if c := info.Cgroup(); c != nil {
		return ebpf.AttachType(c.AttachType)
	}
	return ebpf.AttachNone
}

// Upgrade makes every pinned link of the node (host veths' and the node
// hooks') and every cls_bpf filter of a host veth (attachMode tc, or
// waiting for the agent to move it to tcx) run this build's programs,
// swapping each in place: link.Update for links, a filter replace for
// filters; the kernel replaces the program of a live tcx or cgroup link
// and of a cls_bpf filter atomically, so no packet sees a detached hook. force reloads this build's
// programs first even when they are pinned already (new program IDs), which
// exercises the same swap.
func (dp *Datapath) Upgrade(force bool) (UpgradeReport, error) {
	unlock, err := lockDir(dp.PinRoot)
	if err != nil {
		return UpgradeReport{}, err
	}
	defer unlock()
	// Maps of an older layout left by a migration that stopped before
	// unpinning them: links may still run the old programs over them (an
	// older build's ADD in flight, or one after the kill), so what they
	// hold is copied in before the links move and again after (what the
	// old programs wrote meanwhile), as the migration does.
	older := olderLayouts(dp.PinRoot)
	copyOld := func() error {
		var errs error
		for _, o := range older {
			if _, err := dp.Maps.MigrateFrom(o.dir, o.version); err != nil {
				errs = errors.Join(errs, fmt.Errorf("copy the maps of layout v%d at %s: %w", o.version, o.dir, err))
			}
		}
		return errs
	}
	if err := copyOld(); err != nil {
		return UpgradeReport{}, &MigrationError{Err: err}
	}
	rep, err := dp.upgradeLocked(force)
	if err == nil {
		err = copyOld()
	}
	if err == nil {
		// No link runs a program of the older layouts' any more.
		for _, o := range older {
			if rerr := os.RemoveAll(o.dir); rerr != nil {
				err = errors.Join(err, fmt.Errorf("remove the maps of layout v%d at %s: %w", o.version, o.dir, rerr))
			} else {
				rep.RemovedMaps = append(rep.RemovedMaps, filepath.Base(o.dir))
			}
		}
	}
	return rep, err
}

// upgradeLocked is Upgrade with the pin directory locked.
func (dp *Datapath) upgradeLocked(force bool) (UpgradeReport, error) {
	var rep UpgradeReport
	if err := migratePacingPin(dp.PinRoot); err != nil {
		return rep, err
	}
	// The links lock from the first look at the links to the last swap:
	// the agent moving a veth to tcx attaches the program its filter runs,
	// which must not change under it, and a veth it moved after the look
	// (new links, its filters gone) would be swapped by neither list and
	// keep the old programs (TestAgentRestartAndUpgradeWithoutLoss, once
	// ADD without an agent left every pod for the agent to move).
	unlockLinks, err := LockLinks(dp.PinRoot)
	if err != nil {
		return rep, err
	}
	defer unlockLinks()
	paths, err := pinnedLinks(dp.PinRoot)
	if err != nil {
		return rep, err
	}
	// Which links run which of our programs, and which programs that takes.
	var (
		links []pinnedLink
		errs  error
	)
	defer func() {
		for _, pl := range links {
			pl.l.Close()
		}
	}()
	need := map[string]bool{}
	for _, p := range coreProgramsOf(dp.PinRoot) {
		need[p.Name] = true
	}
	for _, path := range paths {
		name := filepath.Base(path)
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			errs = errors.Join(errs, fmt.Errorf("open link pin %s: %w", path, err))
			continue
		}
		rep.Links++
		info, err := l.Info()
		if err != nil {
			l.Close()
			errs = errors.Join(errs, fmt.Errorf("link %s: %w", name, err))
			continue
		}
		if tcx := info.TCX(); tcx != nil && tcx.Ifindex == 0 {
			rep.Defunct = append(rep.Defunct, name) // device gone
			l.Close()
			continue
		}
		old, err := ebpf.NewProgramFromID(info.Program)
		if err != nil {
			l.Close()
			errs = errors.Join(errs, fmt.Errorf("program of link %s: %w", name, err))
			continue
		}
		oi, err := old.Info()
		old.Close()
		if err != nil {
			l.Close()
			errs = errors.Join(errs, err)
			continue
		}
		p, ok := programOf(oi.Name, linkAttachType(info))
		if !ok {
			l.Close()
			errs = errors.Join(errs, fmt.Errorf("link %s runs %q, which this build does not have", name, oi.Name))
			continue
		}
		need[p.Name] = true
		links = append(links, pinnedLink{l, name, p})
	}

	// Uplinks an earlier build set up: this build's every uplink program
	// goes on them (an earlier build may not have had them all). Uplinks on
	// cls_bpf filters (tcx missing or forced off) have no pin.
	uplinks := uplinksInUse(dp.PinRoot)
	upFilters, err := UplinkFilters()
	if err != nil {
		errs = errors.Join(errs, err)
	}
	if len(uplinks) > 0 || len(upFilters) > 0 {
		for _, p := range uplinkPrograms() {
			need[p.Name] = true
		}
	}

	var progs []Program
	for _, p := range catalog {
		if need[p.Name] {
			progs = append(progs, p)
		}
	}
	mode := loadMissing
	if force {
		mode = reloadAll
	}
	loaded, err := loadPrograms(dp.PinRoot, dp.Maps, progs, mode)
	if err != nil {
		return rep, errors.Join(errs, err)
	}
	// dp runs this build's core programs from now on (fresh instances
	// after force); the others are closed when done.
	old := []*ebpf.Program{dp.FromContainer, dp.ToContainer, dp.SockOps}
	dp.setCore(loaded)
	for _, p := range old {
		p.Close()
	}
	defer func() {
		for _, p := range progs {
			if p.Scope != ScopeHostVeth && p.Name != progSockOps.Name {
				loaded[p.Name].Close()
			}
		}
	}()

	// The uplinks first: this build's host veth programs leave the
	// masquerade to the uplink's egress program (builds before it had none:
	// their host veth programs translated), so it must run before any pod
	// runs them, or the pod's egress leaves untranslated. Its ingress
	// program moves too. Old host veth programs meanwhile send what they
	// translated themselves, which the egress program leaves alone (its
	// source is no pod's). Without the uplinks, no pod moves.
	for name, idx := range uplinks {
		for _, p := range uplinkPrograms() {
			if err := ensureUplinkHook(dp.PinRoot, p, loaded[p.Name], name, idx); err != nil {
				return rep, errors.Join(errs, fmt.Errorf("before moving the pods: %w", err))
			}
		}
	}
	for _, pl := range links {
		next := loaded[pl.prog.Name]
		want, err := progID(next)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		info, err := pl.l.Info()
		if err == nil && info.Program == want {
			continue
		}
		if err := pl.l.Update(next); err != nil {
			errs = errors.Join(errs, fmt.Errorf("update link %s: %w", pl.name, err))
		} else {
			rep.Replaced++
		}
	}

	var ferr error
	rep.Filters, rep.FiltersSwap, ferr = upgradeFilters(loaded)
	errs = errors.Join(errs, ferr)
	if len(upFilters) > 0 {
		seen, swapped, uerr := upgradeUplinkFilters(loaded)
		rep.Filters += seen
		rep.FiltersSwap += swapped
		errs = errors.Join(errs, uerr)
	}

	// Program pins of other builds are no longer referenced by any link or
	// filter we own; they stay while any could not be moved.
	if errs == nil {
		for _, p := range ProgramPins(dp.PinRoot) {
			if !p.Current {
				if err := os.Remove(p.Path); err == nil {
					rep.RemovedProgs = append(rep.RemovedProgs, p.Name)
				}
			}
		}
	}
	return rep, errs
}

// uplinksInUse are the uplinks whose ingress hook a build of ours attached
// and pinned, still attached to a device: name -> ifindex.
func uplinksInUse(pinRoot string) map[string]int {
	out := map[string]int{}
	for name, path := range uplinkPins(pinRoot, progFromUplink) {
		info, err := pinnedLinkInfo(path)
		if err != nil || info.TCX() == nil || info.TCX().Ifindex == 0 {
			continue
		}
		out[name] = int(info.TCX().Ifindex)
	}
	return out
}
