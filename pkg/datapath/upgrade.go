package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
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
	rep, err := dp.upgradeLocked(force, func() error {
		if err := copyOld(); err != nil {
			return &MigrationError{Err: err}
		}
		return nil
	})
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

// upgradeLocked is Upgrade with the pin directory locked. beforeSwap (if
// any) runs once every program the swap needs is loaded, right before the
// first link moves: a copy of an older layout's flows made there ages only
// for the swap, not for the verifier's seconds (a minute on a loaded
// node: the copies of UDP flows, whose use the old programs refresh in the
// old maps only, had expired when the uplink moved, and the replies of the
// old pods' masqueraded flows went to the node untranslated).
func (dp *Datapath) upgradeLocked(force bool, beforeSwap func() error) (UpgradeReport, error) {
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
	need := map[string]bool{}
	for _, p := range coreProgramsOf(dp.PinRoot) {
		need[p.Name] = true
	}
	links, errs := openOurLinks(dp.PinRoot, paths, &rep, need)
	defer func() {
		for _, pl := range links {
			pl.l.Close()
		}
	}()

	uplinks, upFilters, err := uplinksToUpgrade(dp.PinRoot, need)
	errs = errors.Join(errs, err)

	progs := catalogOf(need)
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
	dp.replaceCore(loaded)
	defer func() {
		for _, p := range progs {
			if p.Scope != ScopeHostVeth && p.Name != progSockOps.Name {
				loaded[p.Name].Close()
			}
		}
	}()
	if err := dp.readyToSwap(beforeSwap); err != nil {
		return rep, errors.Join(errs, err)
	}

	// The uplinks first: this build's host veth programs leave the
	// masquerade to the uplink's egress program (builds before it had none:
	// their host veth programs translated), so it must run before any pod
	// runs them, or the pod's egress leaves untranslated. Its ingress
	// program moves too. Old host veth programs meanwhile send what they
	// translated themselves, which the egress program leaves alone (its
	// source is no pod's). Without the uplinks, no pod moves.
	if err := dp.upgradeUplinks(uplinks, loaded); err != nil {
		return rep, errors.Join(errs, fmt.Errorf("before moving the pods: %w", err))
	}
	errs = errors.Join(errs, swapLinks(links, loaded, &rep), swapFilters(loaded, upFilters, &rep))
	// Program pins of other builds are no longer referenced by any link or
	// filter we own; they stay while any could not be moved.
	if errs == nil {
		removeOtherBuilds(dp.PinRoot, &rep)
	}
	return rep, errs
}

// readyToSwap runs beforeSwap (if any), then clears EP_F_SF_NONE where
// another build's programs are pinned and says whether any pod has a
// table in cni_stack_flow_parts: after the copy, which brings the older
// build's address entries and tables.
func (dp *Datapath) readyToSwap(beforeSwap func() error) error {
	if beforeSwap != nil {
		if err := beforeSwap(); err != nil {
			return err
		}
	}
	if err := clearStackFlowsNoneFromOtherBuild(dp); err != nil {
		return err
	}
	// An older build's tables (copied in by a migration, or put by its
	// verbs) count before this build's programs run: with none, theirs
	// skip the map (HP_CFG_SF_NO_PARTS).
	return dp.Maps.StackFlows().SyncNoParts()
}

// clearStackFlowsNoneFromOtherBuild takes EP_F_SF_NONE off every address
// entry when programs of another build are pinned (an upgrade, or a
// rollback and forth): their to_container records flows without clearing
// it. Before any pod runs this build's from_container, which trusts it.
func clearStackFlowsNoneFromOtherBuild(dp *Datapath) error {
	for _, p := range ProgramPins(dp.PinRoot) {
		if !p.Current {
			_, err := dp.Maps.StackFlows().ClearNone()
			return err
		}
	}
	return nil
}

// upgradeUplinks puts this build's uplink programs on the uplinks, then
// lists them as the links judging deferred egress policy, before any pod
// runs this build's from_container (which defers only to them): a pin set
// of an older build may lack them.
func (dp *Datapath) upgradeUplinks(uplinks map[string]int, loaded map[string]*ebpf.Program) error {
	for name, idx := range uplinks {
		for _, p := range uplinkPrograms() {
			if err := ensureUplinkHook(dp.PinRoot, p, loaded[p.Name], name, idx); err != nil {
				return err
			}
		}
	}
	return dp.Maps.Policy().SyncAfterLinks(maps.AfterLinkUplink, upgradedUplinks(uplinks))
}

// upgradedUplinks are the ifindexes of the uplinks an upgrade leaves
// with this build's programs: the pinned tcx links' and the cls_bpf
// filters'.
func upgradedUplinks(uplinks map[string]int) []int {
	var idx []int
	for _, i := range uplinks {
		idx = append(idx, i)
	}
	if fs, err := UplinkFilters(); err == nil {
		for _, f := range fs {
			idx = append(idx, f.Ifindex)
		}
	}
	return idx
}

// uplinksToUpgrade finds the uplinks an earlier build set up, with pinned
// links (name -> ifindex) or cls_bpf filters (tcx missing or forced off):
// this build's every uplink program goes on them (an earlier build may not
// have had them all), so it adds those programs to need.
func uplinksToUpgrade(pinRoot string, need map[string]bool) (uplinks map[string]int, filters bool, err error) {
	uplinks = uplinksInUse(pinRoot)
	upFilters, err := UplinkFilters()
	if len(uplinks) > 0 || len(upFilters) > 0 {
		for _, p := range uplinkPrograms() {
			need[p.Name] = true
		}
	}
	return uplinks, len(upFilters) > 0, err
}

// replaceCore makes dp run the core programs of loaded, closing its old ones.
func (dp *Datapath) replaceCore(loaded map[string]*ebpf.Program) {
	old := []*ebpf.Program{dp.FromContainer, dp.ToContainer, dp.SockOps}
	dp.setCore(loaded)
	for _, p := range old {
		p.Close()
	}
}

// catalogOf is the catalogue's programs named in need, in its order.
func catalogOf(need map[string]bool) []Program {
	var progs []Program
	for _, p := range catalog {
		if need[p.Name] {
			progs = append(progs, p)
		}
	}
	return progs
}

// swapFilters points the host veths' cls_bpf filters, and the uplinks'
// when uplinkFilters, at this build's programs.
func swapFilters(loaded map[string]*ebpf.Program, uplinkFilters bool, rep *UpgradeReport) error {
	var errs error
	rep.Filters, rep.FiltersSwap, errs = upgradeFilters(loaded)
	if uplinkFilters {
		seen, swapped, uerr := upgradeUplinkFilters(loaded)
		rep.Filters += seen
		rep.FiltersSwap += swapped
		errs = errors.Join(errs, uerr)
	}
	return errs
}

// removeOtherBuilds removes the program pins of other builds.
func removeOtherBuilds(pinRoot string, rep *UpgradeReport) {
	for _, p := range ProgramPins(pinRoot) {
		if !p.Current {
			if err := os.Remove(p.Path); err == nil {
				rep.RemovedProgs = append(rep.RemovedProgs, p.Name)
			}
		}
	}
}

// openOurLinks opens the link pins (paths) that run programs of ours, and
// adds those programs to need.
func openOurLinks(pinRoot string, paths []string, rep *UpgradeReport, need map[string]bool) ([]pinnedLink, error) {
	var (
		links []pinnedLink
		errs  error
	)
	for _, path := range paths {
		pl, err := openOurLink(pinRoot, path, rep)
		if err != nil {
			errs = errors.Join(errs, err)
		} else if pl != nil {
			need[pl.prog.Name] = true
			links = append(links, *pl)
		}
	}
	return links, errs
}

// openOurLink opens a link pin and finds the program of ours it runs; nil
// (and counted as defunct) when its device is gone.
func openOurLink(pinRoot, path string, rep *UpgradeReport) (*pinnedLink, error) {
	name := filepath.Base(path)
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return nil, fmt.Errorf("open link pin %s: %w", path, err)
	}
	rep.Links++
	info, err := l.Info()
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("link %s: %w", name, err)
	}
	if tcx := info.TCX(); tcx != nil && tcx.Ifindex == 0 {
		rep.Defunct = append(rep.Defunct, name) // device gone
		l.Close()
		return nil, nil
	}
	old, err := programByID(pinRoot, info.Program)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("program of link %s: %w", name, err)
	}
	oi, err := old.Info()
	old.Close()
	if err != nil {
		l.Close()
		return nil, err
	}
	p, ok := programOf(oi.Name, linkAttachType(info))
	if !ok {
		l.Close()
		return nil, fmt.Errorf("link %s runs %q, which this build does not have", name, oi.Name)
	}
	return &pinnedLink{l, name, p}, nil
}

// swapLinks points each link at this build's program (loaded) unless it
// runs it already.
func swapLinks(links []pinnedLink, loaded map[string]*ebpf.Program, rep *UpgradeReport) error {
	var errs error
	pausepoint("upgrade-link")
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
		pausepoint("upgrade-link")
	}
	return errs
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
