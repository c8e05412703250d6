package maps

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
)

// TestPolicyCTTableEntries: the flow tables' size leaves the kernel's LRU
// batches room for 127 live flows (polCTTableEntries): t*cpus + 127 <=
// entries, with t the batch the kernel takes (clamp(entries/cpus/2, 1,
// 128) since 6.16, else 128 up to the old kernels' bound).
func TestPolicyCTTableEntries(t *testing.T) {
	for _, cpus := range []int{1, 2, 3, 7, 8, 64, 127, 128, 129, 192, 1024} {
		e := int(polCTTableEntries(cpus, true))
		batch := min(max(e/cpus/2, 1), 128)
		if 127+cpus*batch > e {
			t.Errorf("6.16+, %d CPUs: %d entries, batches of %d: %d live flows may be evicted", cpus, e, batch, 127+cpus*batch-e)
		}
		old := int(polCTTableEntries(cpus, false))
		if cpus <= 7 && 127+cpus*128 > old {
			t.Errorf("before 6.16, %d CPUs: %d entries do not hold 127 live flows", cpus, old)
		}
		if old > polCTTableOldMax || e < 256 {
			t.Errorf("%d CPUs: %d and %d entries, out of bounds", cpus, e, old)
		}
	}
	for _, c := range []struct {
		rel  string
		want bool
	}{{"6.18.44-fc-v509", true}, {"6.16.0", true}, {"7.0.1", true}, {"6.15.9-200.fc42.x86_64", false}, {"5.14.0-427.el9.x86_64", false}, {"junk", false}} {
		if got := kernelAtLeast(c.rel, 6, 16); got != c.want {
			t.Errorf("kernelAtLeast(%q, 6, 16) = %v, want %v", c.rel, got, c.want)
		}
	}
}

// TestPolicyFlowTablesSized: ADD's tables are of polCTTableEntries on this
// node, beside a table of 128 an older build put in the same outer map
// (the object's template: the previous release's size), which stays.
func TestPolicyFlowTablesSized(t *testing.T) {
	m := testMaps(t, DefaultSizing)
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&polCTPartSpec)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	oldKey := PolicyCTPartKey{Ifindex: 7, Opener: uint32(DirEgress)}
	if err := m.putInners(innerSet(namePolCTParts, []PolicyCTPartKey{oldKey}, []*ebpf.Map{old}))[0]; err != nil {
		t.Fatalf("an older build's table of 128: %v", err)
	}
	if err := m.Policy().AddFlowTables(8); err != nil {
		t.Fatal(err)
	}
	want := map[PolicyCTPartKey]uint32{oldKey: 128,
		{Ifindex: 8, Opener: uint32(DirEgress)}:  polCTTableEntries(cpus, lruBatchClamped()),
		{Ifindex: 8, Opener: uint32(DirIngress)}: polCTTableEntries(cpus, lruBatchClamped())}
	got := map[PolicyCTPartKey]uint32{}
	if err := m.eachPolicyFlowTable(func(k PolicyCTPartKey, tb *ebpf.Map) error {
		got[k] = tb.MaxEntries()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("tables by key and size: %v, want %v", got, want)
	}
}
