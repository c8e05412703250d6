package maps

import (
	"errors"
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
// map is expected makes OpenPinned fail naming the pin, never a map.
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
	if err := os.Remove(filepath.Join(m.dir, nameLinks)); err != nil {
		t.Fatal(err)
	}
	if err := prog.Pin(filepath.Join(m.dir, nameLinks)); err != nil {
		t.Fatal(err)
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
