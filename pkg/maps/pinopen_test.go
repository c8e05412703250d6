package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// TestLoadPinnedMapRaw: the pin opener without readlink opens the map
// pinned (same ID as ebpf.LoadPinnedMap's), a missing pin is
// os.ErrNotExist (optional maps rely on it), and a program pinned where a
// map is expected makes OpenPinned fail naming the pin, never a map; one
// of the maps OpenPinned opens at first use fails that use, naming it.
func TestLoadPinnedMapRaw(t *testing.T) {
	m := testMaps(t, DefaultSizing)
	p := filepath.Join(m.dir, nameEndpoints)
	got, err := loadPinnedMap(p)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	want, err := ebpf.LoadPinnedMap(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	gotID, err1 := mapID(got)
	wantID, err2 := mapID(want)
	if err1 != nil || err2 != nil || gotID != wantID || got.KeySize() != want.KeySize() || got.Type() != want.Type() {
		t.Fatalf("raw open: id %d (%v), type %v; LoadPinnedMap: id %d (%v), type %v", gotID, err1, got.Type(), wantID, err2, want.Type())
	}
	if _, err := loadPinnedMap(filepath.Join(m.dir, "no-such-map")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing pin: %v, want os.ErrNotExist", err)
	}

	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	for _, name := range []string{nameCT, nameLinks} {
		if err := os.Remove(filepath.Join(m.dir, name)); err != nil {
			t.Fatal(err)
		}
		clone, err := prog.Clone() // a second Pin of one handle would move its pin
		if err != nil {
			t.Fatal(err)
		}
		defer clone.Close()
		if err := clone.Pin(filepath.Join(m.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	lazy := &Maps{dir: m.dir, byName: map[string]*ebpf.Map{}, lazy: map[string]*ebpf.MapSpec{nameCT: pinnedShapes[nameCT]}}
	err = Guard(func() error { lazy.get(nameCT).MaxEntries(); return nil })
	var pe *PinError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), nameCT) {
		t.Fatalf("first use of a program pinned for %s: %v, want a *PinError naming it", nameCT, err)
	}
	o, err := OpenPinned(m.dir)
	if err == nil {
		o.Close()
		t.Fatal("OpenPinned took a pinned program for " + nameLinks)
	}
	if !strings.Contains(err.Error(), nameLinks) {
		t.Fatalf("error does not name the pin: %v", err)
	}
}

// TestOpenPinnedLazy: OpenPinned opens the maps every verb uses, the
// others at first use; a pin missing is its error (os.ErrNotExist: the
// node is set up by Ensure then), and Replacements opens them all.
func TestOpenPinnedLazy(t *testing.T) {
	m := testMaps(t, DefaultSizing)
	o, err := OpenPinned(m.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if len(o.byName) != len(eagerMaps) || o.byName[nameCT] != nil {
		t.Fatalf("OpenPinned opened %d maps, want the %d of eagerMaps", len(o.byName), len(eagerMaps))
	}
	if o.get(nameCT) == nil || o.byName[nameCT] == nil || o.lazy[nameCT] != nil {
		t.Fatal("cni_ct not opened at first use")
	}
	if err := o.CheckSizing(DefaultSizing); err != nil {
		t.Fatal(err)
	}
	if n := len(o.Replacements()); n != len(o.Names()) || len(o.lazy) != 0 {
		t.Fatalf("Replacements: %d maps of %d, %d left unopened", n, len(o.Names()), len(o.lazy))
	}
	if err := os.Remove(filepath.Join(m.dir, nameSNAT)); err != nil {
		t.Fatal(err)
	}
	if o, err := OpenPinned(m.dir); !errors.Is(err, os.ErrNotExist) || !strings.Contains(fmt.Sprint(err), nameSNAT) {
		if o != nil {
			o.Close()
		}
		t.Fatalf("OpenPinned without %s: %v, want os.ErrNotExist naming it", nameSNAT, err)
	}
}
