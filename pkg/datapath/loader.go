package datapath

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// loadMode says what loadPrograms may do about a program that is not pinned.
type loadMode int

const (
	openPinned  loadMode = iota // only open pins; a missing one is an error wrapping os.ErrNotExist
	loadMissing                 // open pins, load and pin the missing ones (pin directory locked)
	reloadAll                   // load fresh instances (new IDs) and replace the pins (pin directory locked)
)

// loadPrograms is the one load-and-pin path: the first ADD (Ensure), the
// node hooks and Upgrade all come through here. It returns this build's
// programs by name. Each object is loaded once, with every map it uses
// replaced by the pinned one (programs never own maps), and the programs
// of it that were asked for are pinned under progs/.
func loadPrograms(pinRoot string, m *maps.Maps, progs []Program, mode loadMode) (_ map[string]*ebpf.Program, err error) {
	out := make(map[string]*ebpf.Program, len(progs))
	defer func() {
		if err != nil {
			closePrograms(out)
		}
	}()
	var (
		objs    []*object // in catalogue order
		missing = map[*object][]Program{}
	)
	for _, p := range progs {
		if mode != reloadAll {
			path := progPin(pinRoot, p)
			prog, err := ebpf.LoadPinnedProgram(path, nil)
			if err == nil {
				out[p.Name] = prog
				continue
			}
			if mode == openPinned {
				return nil, fmt.Errorf("open pinned program %s: %w", path, err)
			}
		}
		o := p.obj.in(pinRoot)
		if missing[o] == nil {
			objs = append(objs, o)
		}
		missing[o] = append(missing[o], p)
	}
	for _, o := range objs {
		if err := loadObject(pinRoot, m, o, missing[o], mode == reloadAll, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// loadObject loads one object and pins the programs of it named in progs
// (replacing existing pins when replace), adding them to out.
func loadObject(pinRoot string, m *maps.Maps, o *object, progs []Program, replace bool, out map[string]*ebpf.Program) error {
	spec, err := o.load()
	if err != nil {
		return fmt.Errorf("parse embedded object %s: %w", o.name, err)
	}
	pinned := m.Replacements()
	repl := make(map[string]*ebpf.Map, len(spec.Maps))
	for name, ms := range spec.Maps {
		if pinned[name] == nil {
			return fmt.Errorf("object %s uses map %s, which pkg/maps does not pin", o.name, name)
		}
		repl[name] = pinned[name]
		// The node's sizing, not the object's placeholder (SIZED in maps.h).
		ms.MaxEntries = pinned[name].MaxEntries()
	}
	pausepoint("load-" + o.name) // the verifier, which takes seconds on a loaded node
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("load object %s: %+w", o.name, ve) // the whole verifier log, still errors.As-able
		}
		return fmt.Errorf("load object %s: %w", o.name, err)
	}
	defer coll.Close()
	for _, p := range progs {
		prog := coll.DetachProgram(p.Name)
		if prog == nil {
			return fmt.Errorf("embedded object %s lacks program %s", o.name, p.Name)
		}
		path := progPin(pinRoot, p)
		if err := mkdirFor(path); err != nil {
			prog.Close()
			return err
		}
		if replace {
			os.Remove(path)
		}
		if err := prog.Pin(path); err != nil {
			prog.Close()
			return fmt.Errorf("pin program %s at %s: %w", p.Name, path, err)
		}
		out[p.Name] = prog
	}
	return nil
}

func closePrograms(progs map[string]*ebpf.Program) {
	for _, p := range progs {
		p.Close()
	}
}
