package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// UpgradeReport says what Upgrade did.
type UpgradeReport struct {
	Links        int      `json:"links"`        // pinned links looked at
	Replaced     int      `json:"replaced"`     // links now running this build's program
	Defunct      []string `json:"defunct"`      // link pins whose device is gone (left for reconcile)
	RemovedProgs []string `json:"removedProgs"` // program pins of other builds, unpinned
}

// programsByName maps the kernel's (possibly truncated) program names to this
// build's programs.
func (dp *Datapath) programsByName() map[string]*ebpf.Program {
	out := make(map[string]*ebpf.Program)
	for i, p := range programs() {
		prog := *dp.progSlots()[i]
		if prog == nil {
			continue
		}
		// The kernel keeps 15 characters (BPF_OBJ_NAME_LEN); cilium/ebpf
		// recovers the full name from BTF where it can. Know both.
		out[p.name] = prog
		if len(p.name) > 15 {
			out[p.name[:15]] = prog
		}
	}
	return out
}

// reload loads fresh instances of this build's programs (new program IDs)
// and re-pins them, for Upgrade(force).
func (dp *Datapath) reload() error {
	for i, p := range programs() {
		spec, err := p.load()
		if err != nil {
			return fmt.Errorf("parse embedded program %s: %w", p.name, err)
		}
		repl := make(map[string]*ebpf.Map)
		for name := range spec.Maps {
			repl[name] = dp.Maps.Map(name)
		}
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
		if err != nil {
			return fmt.Errorf("load program %s: %w", p.name, err)
		}
		prog := coll.DetachProgram(p.name)
		coll.Close()
		path := progPinPath(dp.PinRoot, p)
		os.Remove(path)
		if err := prog.Pin(path); err != nil {
			prog.Close()
			return fmt.Errorf("pin program %s: %w", path, err)
		}
		slot := dp.progSlots()[i]
		(*slot).Close()
		*slot = prog
	}
	return nil
}

// Upgrade makes every pinned link of the node run this build's programs,
// swapping each in place with link.Update: the kernel replaces the program of
// a live tcx or cgroup link atomically, so no packet sees a detached hook.
// force reloads this build's programs first even when they are pinned
// already (new program IDs), which exercises the same swap.
func (dp *Datapath) Upgrade(force bool) (UpgradeReport, error) {
	var rep UpgradeReport
	unlock, err := lockDir(dp.PinRoot)
	if err != nil {
		return rep, err
	}
	defer unlock()
	if force {
		if err := dp.reload(); err != nil {
			return rep, err
		}
	}
	byName := dp.programsByName()
	wanted := make(map[ebpf.ProgramID]bool)
	for _, p := range byName {
		if id, err := progID(p); err == nil {
			wanted[id] = true
		}
	}

	ents, err := os.ReadDir(filepath.Join(dp.PinRoot, "links"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return rep, err
	}
	var errs error
	for _, e := range ents {
		path := filepath.Join(dp.PinRoot, "links", e.Name())
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			errs = errors.Join(errs, fmt.Errorf("open link pin %s: %w", path, err))
			continue
		}
		rep.Links++
		info, err := l.Info()
		if err != nil {
			l.Close()
			errs = errors.Join(errs, fmt.Errorf("link %s: %w", e.Name(), err))
			continue
		}
		if tcx := info.TCX(); tcx != nil && tcx.Ifindex == 0 {
			rep.Defunct = append(rep.Defunct, e.Name()) // device gone
			l.Close()
			continue
		}
		if wanted[info.Program] {
			l.Close()
			continue
		}
		old, err := ebpf.NewProgramFromID(info.Program)
		if err != nil {
			l.Close()
			errs = errors.Join(errs, fmt.Errorf("program of link %s: %w", e.Name(), err))
			continue
		}
		oi, err := old.Info()
		old.Close()
		if err != nil {
			l.Close()
			errs = errors.Join(errs, err)
			continue
		}
		next, ok := byName[oi.Name]
		if !ok {
			l.Close()
			errs = errors.Join(errs, fmt.Errorf("link %s runs %q, which this build does not have", e.Name(), oi.Name))
			continue
		}
		if err := l.Update(next); err != nil {
			errs = errors.Join(errs, fmt.Errorf("update link %s: %w", e.Name(), err))
		} else {
			rep.Replaced++
		}
		l.Close()
	}

	// Program pins of other builds are no longer referenced by any link we own.
	current := CurrentProgramPins()
	pents, _ := os.ReadDir(filepath.Join(dp.PinRoot, "progs"))
	for _, e := range pents {
		if current[e.Name()] || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if errs == nil { // keep old programs pinned while any link could not be moved
			if err := os.Remove(filepath.Join(dp.PinRoot, "progs", e.Name())); err == nil {
				rep.RemovedProgs = append(rep.RemovedProgs, e.Name())
			}
		}
	}
	return rep, errs
}

// CurrentProgramPins names the program pins (base names under <pinDir>/progs)
// of this build: host-veth, sock_ops, uplink and socket-hook programs.
func CurrentProgramPins() map[string]bool {
	out := make(map[string]bool)
	for _, p := range programs() {
		out[filepath.Base(progPinPath("", p))] = true
	}
	out[filepath.Base(progPinPath("", progDef{"cni_from_uplink", loadFromUplink, _FromUplinkBytes}))] = true
	out[filepath.Base(progPinPath("", progDef{"cni_to_uplink", loadToUplink, _ToUplinkBytes}))] = true
	for _, h := range sockHooks {
		out[filepath.Base(progPinPath("", progDef{h.prog, loadSock, _SockBytes}))] = true
	}
	return out
}
