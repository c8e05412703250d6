package maps

import (
	"testing"

	"github.com/cilium/ebpf"
)

// TestStatsReset: Reset deletes every counter of one host veth, those
// present and absent alike (an absent key is no error),
// and leaves another veth's.
func TestStatsReset(t *testing.T) {
	m := testMaps(t, Sizing{MaxPods: 1, HostPortsPerPod: 1})
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	put := func(idx uint32, d, r uint8) {
		t.Helper()
		k := StatsKey{Ifindex: idx, Dir: d, Reason: r}
		if err := m.stats.Put(&k, make([]StatsVal, cpus)); err != nil {
			t.Fatal(err)
		}
	}
	has := func(idx uint32, d, r uint8) bool {
		k := StatsKey{Ifindex: idx, Dir: d, Reason: r}
		v := make([]StatsVal, cpus)
		return m.stats.Lookup(&k, &v) == nil
	}
	put(7, 0, 0)
	put(7, 1, uint8(numReasons-1))
	put(8, 0, 0)
	if err := m.Stats().Reset(7); err != nil {
		t.Fatalf("Reset(7): %v", err)
	}
	if has(7, 0, 0) || has(7, 1, uint8(numReasons-1)) {
		t.Fatal("a counter of ifindex 7 outlived Reset(7)")
	}
	if !has(8, 0, 0) {
		t.Fatal("Reset(7) deleted a counter of ifindex 8")
	}
	if err := m.Stats().Reset(7); err != nil {
		t.Fatalf("Reset(7) again, nothing left: %v", err)
	}
}
