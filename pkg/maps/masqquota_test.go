package maps

import "testing"

// TestQuotaFor: whatever the pods hold within their quota (every
// attachment its reserve, the pool taken), cni_snat keeps the spare its LRU
// needs never to evict, on 2 and on 64 CPUs, at the default maxPods and at
// the bounds; a flooded pod holds at most its reserve and half the pool.
func TestQuotaFor(t *testing.T) {
	for _, c := range []struct{ pods, cpus int }{{110, 2}, {110, 64}, {1, 2}, {8192, 64}, {250, 8}} {
		s := Sizing{MaxPods: c.pods, HostPortsPerPod: 1}
		entries := int(s.entries()[nameSNAT])
		q := QuotaFor(entries, c.pods, c.cpus)
		att := c.pods * attachmentsPerPod
		most := int(q.Pool) + att*int(q.Reserve)
		t.Logf("maxPods %d, %d CPUs: %d flows, reserve %d, pool %d, pod max %d, most held %d", c.pods, c.cpus, entries/2, q.Reserve, q.Pool, q.PodMax, most)
		if q.PodMax == 0 || q.PodMax != q.Reserve+q.Pool/2 {
			t.Errorf("maxPods %d, %d CPUs: pod max %d, want reserve %d + pool %d / 2 (0 turns the quota off)", c.pods, c.cpus, q.PodMax, q.Reserve, q.Pool)
		}
		spare := entries/2 - most
		if spare < lruSpareFlows(c.cpus) && spare < entries/4 {
			t.Errorf("maxPods %d, %d CPUs: the pods may hold %d of %d flows, leaving %d spare, want %d (or half the table)", c.pods, c.cpus, most, entries/2, spare, lruSpareFlows(c.cpus))
		}
	}
}
