package maps

import "testing"

// BenchmarkStackFlowTable: ADD's step of a pod's own stack-flow table,
// made for it (AddPart: a map-of-maps update, which waits out an RCU
// grace period) against a slot of the node's pool (TakeSlot: hash writes,
// no wait), and DEL's (DeleteOf, which for a table made for the pod is a
// map-of-maps delete, another wait). Run with -count to alternate them.
func BenchmarkStackFlowTable(b *testing.B) {
	m := testMaps(b, DefaultSizing)
	alive := func(int) bool { return true }
	for _, c := range []struct {
		name string
		add  func(idx int) error
	}{
		{"own-table", func(idx int) error { return m.StackFlows().AddPart(idx) }},
		{"pool-slot", func(idx int) error { _, err := m.StackFlows().TakeSlot(idx, alive); return err }},
	} {
		b.Run(c.name+"/ADD", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				idx := 1000 + i%100
				if err := c.add(idx); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if _, err := m.StackFlows().DeleteOf(idx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
		b.Run(c.name+"/DEL", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				idx := 1000 + i%100
				b.StopTimer()
				if err := c.add(idx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if _, err := m.StackFlows().DeleteOf(idx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
