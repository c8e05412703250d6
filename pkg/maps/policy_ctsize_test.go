package maps

import "testing"

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
