package maps

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
)

// TestTablePins: every table a verb makes is pinned, a replaced table's
// pin follows it, a dropped table's pin goes, and a pin left by a process
// killed between a table's entry and its pin (either order) is found stale
// and removed, while current pins stay.
func TestTablePins(t *testing.T) {
	m := testMaps(t, DefaultSizing)
	const idx = 7
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(m.StackFlows().AddPart(idx))
	must(m.Policy().AddFlowTables(idx))
	must(m.StackFlows().AddPart(idx)) // a retried ADD replaces the table
	pins := func() []string {
		var out []string
		filepath.WalkDir(filepath.Join(m.dir, "tables"), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && d.Name() == nameSFPool {
				return filepath.SkipDir // the pool's, made with the maps (sfpool_test.go)
			}
			if err == nil && !d.IsDir() {
				out = append(out, p)
			}
			return nil
		})
		return out
	}
	if got := pins(); len(got) != 4 {
		t.Fatalf("table pins after ADD: %v, want 4 (stack flows, two policy flow tables, fragments)", got)
	}
	if stale, err := m.StaleTablePins(); err != nil || len(stale) != 0 {
		t.Fatalf("stale pins with every table current: %v %v", stale, err)
	}
	n := 0
	must(m.eachInner(nameStackFlowParts, func([]byte, *ebpf.Map) error { n++; return nil }))
	if n != 1 {
		t.Errorf("opened %d stack-flow tables by pin, want 1", n)
	}

	// Killed after the entry went, before its pin.
	k := uint32(idx)
	must(m.byName[nameStackFlowParts].Delete(&k))
	// Killed after the pin, before the entry.
	orphan, err := ebpf.NewMap(&polFragPartSpec)
	must(err)
	defer orphan.Close()
	must(replacePin(orphan, innerPin(m.dir, namePolFragParts, keyBytes(uint32(idx+1)))))
	stale, err := m.StaleTablePins()
	must(err)
	want := []string{innerPin(m.dir, nameStackFlowParts, keyBytes(k)), innerPin(m.dir, namePolFragParts, keyBytes(uint32(idx+1)))}
	slices.Sort(stale)
	slices.Sort(want)
	if !slices.Equal(stale, want) {
		t.Fatalf("stale pins %v, want %v", stale, want)
	}
	for _, p := range stale {
		must(m.RemoveStaleTablePin(p))
	}
	if got := pins(); len(got) != 3 {
		t.Errorf("pins after removing the stale ones: %v, want the 3 policy tables'", got)
	}
	must(m.Policy().DeleteFlowTables(idx))
	if got := pins(); len(got) != 0 {
		t.Errorf("pins after the policy tables were dropped: %v", got)
	}
}

// TestMapID: the short info read gives the ID Map.Info does, for each of
// two maps (so not a constant), and a closed map's fd is an error.
func TestMapID(t *testing.T) {
	var ids []ebpf.MapID
	for range 2 {
		mp, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer mp.Close()
		info, err := mp.Info()
		if err != nil {
			t.Fatal(err)
		}
		want, ok := info.ID()
		if !ok {
			t.Fatal("Map.Info has no ID")
		}
		got, err := mapID(mp)
		if err != nil || got != want {
			t.Fatalf("mapID = %d, %v; Map.Info says %d", got, err, want)
		}
		ids = append(ids, got)
	}
	if ids[0] == ids[1] {
		t.Fatalf("two maps, one ID %d", ids[0])
	}
	mp, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	mp.Close()
	if _, err := mapID(mp); err == nil {
		t.Fatal("mapID of a closed map: no error")
	}
}
