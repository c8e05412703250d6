package maps

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// BenchmarkPolicyFlowTables: a networkPolicy pod's ADD step (setPending:
// its two flow tables and its fragment table put into maps of maps, then
// the pending state) and its DEL step (DeleteOf: the tables taken out).
// Each put or delete of a map of maps' entry waits out an RCU grace period
// (the kernel's maybe_wait_bpf_programs); a batched one waits once.
func BenchmarkPolicyFlowTables(b *testing.B) {
	m := testMaps(b, DefaultSizing)
	b.Run("ADD", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			idx := 1000 + i%100
			if err := setPending(m.Policy(), idx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := m.Policy().DeleteOf(idx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("DEL", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			idx := 1000 + i%100
			b.StopTimer()
			if err := setPending(m.Policy(), idx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if err := m.Policy().DeleteOf(idx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestPolicyFlowTablesBatched: the two flow tables go in and out in one
// batch each. A retried ADD replaces both (new tables, pins current); a DEL
// that finds one of them already gone (a DEL killed half-way) drops the
// other and leaves no pin.
func TestPolicyFlowTablesBatched(t *testing.T) {
	m := testMaps(t, DefaultSizing)
	const idx = 9
	outer := m.byName[namePolCTParts]
	ids := func() map[uint32]uint32 {
		out := map[uint32]uint32{}
		for _, o := range polCTOpeners {
			var id uint32
			k := PolicyCTPartKey{Ifindex: idx, Opener: o}
			if err := outer.Lookup(&k, &id); err == nil {
				out[o] = id
			}
		}
		return out
	}
	if err := m.Policy().AddFlowTables(idx); err != nil {
		t.Fatal(err)
	}
	first := ids()
	if err := m.Policy().AddFlowTables(idx); err != nil {
		t.Fatal(err)
	}
	second := ids()
	if len(first) != 2 || len(second) != 2 || first[0] == second[0] || first[1] == second[1] {
		t.Fatalf("tables after ADD %v, after the retry %v: want two, both replaced", first, second)
	}
	if stale, err := m.StaleTablePins(); err != nil || len(stale) != 0 {
		t.Fatalf("stale pins after the retried ADD: %v %v", stale, err)
	}
	k := PolicyCTPartKey{Ifindex: idx, Opener: polCTOpeners[0]}
	if err := outer.Delete(&k); err != nil {
		t.Fatal(err)
	}
	if err := m.Policy().DeleteFlowTables(idx); err != nil {
		t.Fatalf("DEL with one table already gone: %v", err)
	}
	if got := ids(); len(got) != 0 {
		t.Fatalf("tables left after DEL: %v", got)
	}
	ents, err := os.ReadDir(innerDir(m.dir, namePolCTParts))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("pins left after DEL: %v", ents)
	}
}

// TestPolicyFlowTablesFullOuter: ADD's flow tables meet a cni_pol_ct_parts
// with one free slot (issue 23, rst8 item 4). The batch puts the first
// table and fails on the second; the ADD fails, and must leave nothing of
// the interface: neither table in the outer map (the first one there,
// unpinned, is a table no DEL scan of the pins finds), nor its fragment
// table, nor a pin. Once two slots are free, the retried ADD puts both
// tables and their pins.
func TestPolicyFlowTablesFullOuter(t *testing.T) {
	m := testMaps(t, Sizing{MaxPods: 2, HostPortsPerPod: 1})
	outer := m.byName[namePolCTParts]
	filler, err := ebpf.NewMap(&polCTPartSpec)
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	var fill []PolicyCTPartKey
	for i := 0; i < int(outer.MaxEntries())-1; i++ {
		k := PolicyCTPartKey{Ifindex: uint32(50000 + i), Opener: polCTOpeners[0]}
		if err := outer.Update(&k, filler, ebpf.UpdateAny); err != nil {
			t.Fatalf("fill slot %d of %d: %v", i, outer.MaxEntries(), err)
		}
		fill = append(fill, k)
	}
	const idx = 9
	left := func() []string { return policyTablesLeft(m, idx) }
	if err := setPending(m.Policy(), idx); err == nil {
		t.Fatal("ADD with one free slot for two tables: no error")
	} else if !strings.Contains(err.Error(), namePolCTParts) {
		t.Errorf("ADD's error %q does not name %s", err, namePolCTParts)
	}
	if got := left(); len(got) != 0 {
		t.Fatalf("the failed ADD left %v", got)
	}
	if _, ok, err := m.Policy().StateOf(idx); err != nil || ok {
		t.Fatalf("the failed ADD left a state (%v, %v)", ok, err)
	}
	for _, k := range fill[:2] {
		if err := outer.Delete(&k); err != nil {
			t.Fatal(err)
		}
	}
	if err := setPending(m.Policy(), idx); err != nil {
		t.Fatalf("the retried ADD with two free slots: %v", err)
	}
	if got := left(); len(got) != 6 {
		t.Fatalf("after the retried ADD: %v, want both flow tables, the fragment table and their pins", got)
	}
	if stale, err := m.StaleTablePins(); err != nil || len(stale) != 0 {
		t.Fatalf("stale pins after the retried ADD: %v %v", stale, err)
	}
}

// policyTablesLeft names what of interface idx's policy tables is there:
// each flow table and the fragment table in its outer map, and their pins.
func policyTablesLeft(m *Maps, idx uint32) []string {
	var out []string
	outer := m.byName[namePolCTParts]
	for _, o := range polCTOpeners {
		k := PolicyCTPartKey{Ifindex: idx, Opener: o}
		var id uint32
		if err := outer.Lookup(&k, &id); err == nil {
			out = append(out, fmt.Sprintf("flow table %d", o))
		}
		if _, err := os.Stat(innerPin(m.dir, namePolCTParts, keyBytes(k))); err == nil {
			out = append(out, fmt.Sprintf("flow table %d's pin", o))
		}
	}
	fk := idx
	var id uint32
	if err := m.byName[namePolFragParts].Lookup(&fk, &id); err == nil {
		out = append(out, "fragment table")
	}
	if _, err := os.Stat(innerPin(m.dir, namePolFragParts, keyBytes(fk))); err == nil {
		out = append(out, "fragment table's pin")
	}
	return out
}

// TestPolicyFlowTablesFullFragOuter: ADD's fragment table meets a full
// cni_pol_frag_parts. Its update runs beside the flow tables' batch, which
// succeeds: the ADD fails naming the fragment tables' map and leaves
// nothing of the interface (the flow tables and their pins go again).
// Once a slot is free, the retried ADD puts all three.
func TestPolicyFlowTablesFullFragOuter(t *testing.T) {
	m := testMaps(t, Sizing{MaxPods: 2, HostPortsPerPod: 1})
	outer := m.byName[namePolFragParts]
	filler, err := ebpf.NewMap(&polFragPartSpec)
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	var fill []uint32
	for i := 0; i < int(outer.MaxEntries()); i++ {
		k := uint32(50000 + i)
		if err := outer.Update(&k, filler, ebpf.UpdateAny); err != nil {
			t.Fatalf("fill slot %d of %d: %v", i, outer.MaxEntries(), err)
		}
		fill = append(fill, k)
	}
	const idx = 9
	if err := setPending(m.Policy(), idx); err == nil {
		t.Fatal("ADD with no free slot for its fragment table: no error")
	} else if !strings.Contains(err.Error(), namePolFragParts) {
		t.Errorf("ADD's error %q does not name %s", err, namePolFragParts)
	}
	if got := policyTablesLeft(m, idx); len(got) != 0 {
		t.Fatalf("the failed ADD left %v", got)
	}
	if _, ok, err := m.Policy().StateOf(idx); err != nil || ok {
		t.Fatalf("the failed ADD left a state (%v, %v)", ok, err)
	}
	if err := outer.Delete(&fill[0]); err != nil {
		t.Fatal(err)
	}
	if err := setPending(m.Policy(), idx); err != nil {
		t.Fatalf("the retried ADD with a free slot: %v", err)
	}
	if got := policyTablesLeft(m, idx); len(got) != 6 {
		t.Fatalf("after the retried ADD: %v, want both flow tables, the fragment table and their pins", got)
	}
	if stale, err := m.StaleTablePins(); err != nil || len(stale) != 0 {
		t.Fatalf("stale pins after the retried ADD: %v %v", stale, err)
	}
}

// setPending is a networkPolicy ADD's step in the maps: the interface's
// tables (made while IPAM runs), then its pending state.
func setPending(pl Policy, ifindex int) error {
	if err := pl.AddFlowTables(ifindex); err != nil {
		return err
	}
	return pl.MarkPending(ifindex)
}
