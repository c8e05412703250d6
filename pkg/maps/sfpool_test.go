package maps

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"testing"
)

// TestSFPool: Create fills every slot of the pool with a pinned table (no
// stale pin); TakeSlot gives an ifindex the same slot again (a retried
// ADD) and others other slots, always emptied; DeleteOf empties and frees
// it; with every slot taken a live pod's slot is never taken, a gone
// veth's is (emptied); a slot a fill cut short left empty is filled when
// taken.
func TestSFPool(t *testing.T) {
	m := testMaps(t, Sizing{MaxPods: 1, HostPortsPerPod: 1}) // 2 attachments: 2 slots
	sf := m.StackFlows()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := m.poolSlots(); n != 2 {
		t.Fatalf("pool of %d slots at maxPods 1, want 2", n)
	}
	for idx := uint32(0); idx < 2; idx++ {
		var id uint32
		if err := m.byName[nameSFPool].Lookup(&idx, &id); err != nil {
			t.Fatalf("slot %d empty after Create: %v", idx+1, err)
		}
	}
	if stale, err := m.StaleTablePins(); err != nil || len(stale) != 0 {
		t.Fatalf("stale pins after Create: %v %v", stale, err)
	}
	alive := func(int) bool { return true }
	s7, err := sf.TakeSlot(7, alive)
	must(err)
	rec := func(slot uint32, b byte) {
		t.Helper()
		k := StackFlowKey{Family: 2, Proto: 6, Port: 1000}
		k.Addr[0] = b
		must(sf.putSlotRecord(slot, k, StackFlowVal{Ifindex: 99, Flags: StackFlowPeerPod}))
	}
	count := func(slot uint32) int {
		t.Helper()
		fs, err := sf.listSlot(slot)
		must(err)
		return len(fs)
	}
	rec(s7, 1)
	again, err := sf.TakeSlot(7, alive)
	must(err)
	if again != s7 || count(s7) != 0 {
		t.Fatalf("retried take of ifindex 7: slot %d (first %d), %d records left, want the same slot, emptied", again, s7, count(s7))
	}
	s8, err := sf.TakeSlot(8, alive)
	must(err)
	if s8 == 0 || s8 == s7 {
		t.Fatalf("ifindex 8 got slot %d, 7 holds %d", s8, s7)
	}
	if s, err := sf.TakeSlot(9, alive); err != nil || s != 0 {
		t.Fatalf("a third take with two live holders: slot %d, %v; want none (the caller makes its own table)", s, err)
	}
	rec(s8, 2)
	_, err = sf.DeleteOf(8)
	must(err)
	if s, _ := sf.SlotOf(8); s != 0 || count(s8) != 0 {
		t.Fatalf("after DeleteOf(8): slot %d held, %d records left", s, count(s8))
	}
	// 7's veth is gone without a DEL (killed), its table written since.
	rec(s7, 3)
	s9, err := sf.TakeSlot(9, func(i int) bool { return i != 7 })
	must(err)
	s10, err := sf.TakeSlot(10, func(i int) bool { return i != 7 })
	must(err)
	if s9 != s8 || s10 != s7 || count(s7) != 0 {
		t.Fatalf("takes 9, 10 with 7 gone: slots %d, %d (free %d, gone 7's %d), %d records left in 7's", s9, s10, s8, s7, count(s7))
	}
	if s, _ := sf.SlotOf(7); s != 0 {
		t.Errorf("gone ifindex 7 still holds slot %d", s)
	}
	// A fill cut short: the pool lacks slot s9's table.
	idx := s9 - 1
	must(m.byName[nameSFPool].Delete(&idx))
	_, err = sf.DeleteOf(9)
	must(err)
	s11, err := sf.TakeSlot(11, alive)
	must(err)
	var id uint32
	if s11 != s9 || m.byName[nameSFPool].Lookup(&idx, &id) != nil {
		t.Fatalf("take of an emptied slot: got %d, want %d with its table put again", s11, s9)
	}
	if _, err := sf.listSlot(s11); err != nil {
		t.Fatal(err)
	}
	parts, err := sf.Parts()
	must(err)
	if len(parts) != 2 {
		t.Errorf("Parts with 10 and 11 holding slots: %v", parts)
	}
	// A pin an agent's reconcile took for stale (between a fill's pin and
	// its update): the table is pinned again when its slot is taken.
	_, err = sf.DeleteOf(11)
	must(err)
	pin := innerPin(m.dir, nameSFPool, keyBytes(s11-1))
	must(os.Remove(pin))
	s12, err := sf.TakeSlot(12, alive)
	must(err)
	if _, serr := os.Stat(pin); s12 != s11 || serr != nil {
		t.Fatalf("take of a slot whose pin went: slot %d (want %d), pin %v", s12, s11, serr)
	}
	if stale, err := m.StaleTablePins(); err != nil || len(stale) != 0 {
		t.Errorf("stale pins after the re-pin: %v %v", stale, err)
	}
}

// TestSFPoolRacingTakes: ADDs taking slots at once (each its own lock
// handle, as separate processes have) never share one, even when their
// ifindexes start the search at the same slot.
func TestSFPoolRacingTakes(t *testing.T) {
	m := testMaps(t, DefaultSizing)
	const n = 64
	slots := make([]uint32, n)
	errs := make(chan error, n)
	idx := func(i int) int { return 100 + i*int(m.poolSlots()) } // one start slot for all
	for i := 0; i < n; i++ {
		go func(i int) {
			s, err := m.StackFlows().TakeSlot(idx(i), func(int) bool { return true })
			slots[i] = s
			errs <- err
		}(i)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	seen := map[uint32]int{}
	for i, s := range slots {
		if s == 0 {
			t.Errorf("ifindex %d got no slot of %d", idx(i), m.poolSlots())
		}
		if j, dup := seen[s]; dup {
			t.Errorf("ifindexes %d and %d share slot %d", idx(j), idx(i), s)
		}
		seen[s] = i
	}
	held, err := m.StackFlows().Slots()
	if err != nil || len(held) != n {
		t.Errorf("%d slots held after %d takes (%v)", len(held), n, err)
	}
}

// listSlot returns the records in the table of slot (what the pod holding
// it sent through the stack).
func (s StackFlows) listSlot(slot uint32) ([]StackFlow, error) {
	if !s.m.validSlot(slot) {
		return nil, fmt.Errorf("no slot %d in %s (%d slots)", slot, nameSFPool, s.m.poolSlots())
	}
	pool, idx := s.m.byName[nameSFPool], slot-1
	var id uint32
	if err := pool.Lookup(&idx, &id); err != nil {
		return nil, fmt.Errorf("read slot %d of %s: %w", slot, nameSFPool, err)
	}
	t, err := openInner(s.m.dir, pool, nameSFPool, keyBytes(idx), ebpf.MapID(id))
	if err != nil {
		return nil, err
	}
	defer t.Close()
	return listStackFlows(t, nameSFPool)
}

// putSlotRecord writes one record into the table of slot, as a program
// would, under the pool's lock.
func (s StackFlows) putSlotRecord(slot uint32, k StackFlowKey, v StackFlowVal) error {
	unlock, err := poolLock(s.m.dir)
	if err != nil {
		return err
	}
	defer unlock()
	t, err := s.m.poolTable(slot)
	if err != nil {
		return err
	}
	defer t.Close()
	return t.Update(&k, &v, ebpf.UpdateAny)
}
