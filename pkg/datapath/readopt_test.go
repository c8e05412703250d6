package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// TestReadoptNamesUnique: readoptMaps finds a map by the kernel's name of
// it, cut to 15 characters; two pinned maps whose names share those would
// be taken for each other.
func TestReadoptNamesUnique(t *testing.T) {
	seen := map[string]string{}
	for _, n := range maps.PinnedNames() {
		k := kernelProgName(n)
		if other, ok := seen[k]; ok {
			t.Errorf("maps %s and %s share the kernel name %s: readoptMaps would pin one for the other", other, n, k)
		}
		seen[k] = n
	}
}

// TestReadoptOwnPinDirOnly: two pin directories on one node (tests, the
// bench). With one's maps directory removed entirely, Ensure pins again the
// maps its own programs use, never the other directory's, and leaves the
// other's alone.
func TestReadoptOwnPinDirOnly(t *testing.T) {
	a := testDatapath(t)
	b := secondDatapath(t)
	ids := func(dp *Datapath) map[string]ebpf.MapID {
		out := map[string]ebpf.MapID{}
		for _, n := range maps.PinnedNames() {
			info, err := mapstest.Map(dp.Maps, n).Info()
			must(t, err)
			out[n], _ = info.ID()
		}
		return out
	}
	wantA, wantB := ids(a), ids(b)
	must(t, os.RemoveAll(MapsDir(a.PinRoot)))
	again, err := Ensure(a.PinRoot, maps.DefaultSizing)
	if err != nil {
		t.Fatalf("Ensure with the maps directory removed: %v", err)
	}
	defer again.Close()
	got := ids(again)
	for _, n := range []string{"cni_endpoints", "cni_links", "cni_stats"} { // the core programs' maps
		if got[n] != wantA[n] {
			t.Errorf("%s: pinned map %d; the directory's programs use %d", n, got[n], wantA[n])
		}
	}
	for n, id := range got {
		for m, other := range wantB {
			if id == other {
				t.Errorf("%s of the first directory is the second's %s (map %d)", n, m, id)
			}
		}
	}
	bAgain, err := Open(b.PinRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer bAgain.Close()
	for n, id := range ids(bAgain) {
		if id != wantB[n] {
			t.Errorf("the second directory's %s changed: map %d, was %d", n, id, wantB[n])
		}
	}
}

// secondDatapath is another pin directory beside testDatapath's.
func secondDatapath(t *testing.T) *Datapath {
	t.Helper()
	dir := filepath.Join(BPFFSRoot, fmt.Sprintf("ebpf-cni-unit-%s-b-%d", t.Name(), os.Getpid()))
	os.RemoveAll(dir)
	t.Cleanup(func() { os.RemoveAll(dir) })
	dp, err := Ensure(dir, maps.DefaultSizing)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dp.Close)
	return dp
}

// TestLeanWrongSizeRefused: a sized map (MaxEntries 0 in pkg/maps' table:
// OpenPinned takes the pin's) pinned in our place with our shape but
// another size is opened by neither OpenLean nor EnsureLean, which open
// the maps a verb uses when it first uses them: its first use fails
// naming the map (a *maps.PinError the verbs return), never writes to it.
// A configuration of another sizing is refused by EnsureLean
// (cni_links and cni_hostports carry it).
func TestLeanWrongSizeRefused(t *testing.T) {
	dp := testDatapath(t)
	ours := mapstest.Map(dp.Maps, "cni_ct")
	p := filepath.Join(MapsDir(dp.PinRoot), "cni_ct")
	must(t, os.Remove(p))
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ours.Type(), KeySize: ours.KeySize(), ValueSize: ours.ValueSize(),
		MaxEntries: ours.MaxEntries() / 2, Flags: ours.Flags()})
	must(t, err)
	must(t, m.Pin(p))
	m.Close()
	got, err := EnsureLean(dp.PinRoot, maps.DefaultSizing)
	if err != nil {
		t.Fatalf("EnsureLean of a node with cni_ct of another size: %v", err)
	}
	defer got.Close()
	err = maps.Guard(func() error { mapstest.Map(got.Maps, "cni_ct"); return nil })
	var pe *maps.PinError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "cni_ct") {
		t.Errorf("first use of cni_ct: %v; want a *maps.PinError naming cni_ct", err)
	}
	other := maps.Sizing{MaxPods: maps.DefaultMaxPods + 1, HostPortsPerPod: maps.DefaultHostPortsPerPod}
	if got, err := EnsureLean(dp.PinRoot, other); err == nil {
		got.Close()
		t.Fatal("EnsureLean opened a node sized otherwise")
	} else if !maps.IsSizingError(err) {
		t.Errorf("EnsureLean with maxPods %d: %v; want a *maps.SizingError", other.MaxPods, err)
	}
}
