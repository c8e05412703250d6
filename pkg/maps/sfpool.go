package maps

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The node's pool of stack-flow tables (issue 30): putting a table into a
// map of maps waits out an RCU grace period (the kernel's
// maybe_wait_bpf_programs, 5-15 ms), which issue 28's per-pod tables cost
// every ADD. The pool's tables are made and put once per node, in one
// batched update (one grace period), when the maps are created; ADD then
// takes a free slot through cni_sf_slots (ifindex to slot), a plain hash
// whose writes wait for nothing, and writes the slot into the pod's
// address entries, which the programs hold already (bpf/lib/stackflow.h).

// Slots count from 1 (0 stands for none in an address entry): slot n is
// the pool's index n-1.
var (
	nameSFPool  = mapName(&specNames.CniSfPool)  // slot-1 → table (ARRAY_OF_MAPS)
	nameSFSlots = mapName(&specNames.CniSfSlots) // host veth ifindex → slot
)

// sfSlotShift is EP_SF_SLOT_SHIFT of bpf/lib/types.h: the slot's place in
// ep_info.flags.
const sfSlotShift = 16

// EndpointFlagsOfSlot is what an address entry's flags carry for slot.
func EndpointFlagsOfSlot(slot uint32) uint32 { return slot << sfSlotShift }

// poolSlots is how many slots the pool has (0 when this node's maps were
// pinned by a build before it: those ADDs make tables one at a time).
func (m *Maps) poolSlots() uint32 {
	p, s := m.get(nameSFPool), m.get(nameSFSlots)
	if p == nil || s == nil {
		return 0
	}
	return p.MaxEntries()
}

// validSlot: slot names a table of the pool.
func (m *Maps) validSlot(slot uint32) bool { return slot >= 1 && slot <= m.poolSlots() }

// fillSFPool puts a table into every empty slot of the pool, in one
// batched update: the node's single grace period for them. Each table is
// pinned first (the agent opens them by pin, see inner.go). A fill cut
// short leaves either pins without an entry (StaleTablePins) or empty
// slots, which the next fill (Create, or a TakeSlot finding its slot
// empty) fills. Under the tables' lock.
func (m *Maps) fillSFPool() error {
	n := m.poolSlots()
	if n == 0 {
		return nil
	}
	pool := m.get(nameSFPool)
	var (
		keys   []uint32
		fds    []uint32
		tables []*ebpf.Map
	)
	defer func() {
		for _, t := range tables {
			t.Close() // the pins and the pool hold them from here
		}
	}()
	for slot := uint32(1); slot <= n; slot++ {
		var id uint32
		idx := slot - 1
		if err := pool.Lookup(&idx, &id); err == nil {
			continue
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("read slot %d of %s: %w", slot, nameSFPool, err)
		}
		t, err := ebpf.NewMap(&stackFlowPartSpec)
		if err != nil {
			return fmt.Errorf("create the stack-flow table of slot %d of %s: %w", slot, nameSFPool, err)
		}
		tables = append(tables, t)
		if err := replacePin(t, innerPin(m.dir, nameSFPool, keyBytes(idx))); err != nil {
			return err
		}
		keys = append(keys, idx)
		fds = append(fds, uint32(t.FD()))
	}
	if len(keys) == 0 {
		return nil
	}
	if _, err := pool.BatchUpdate(keys, fds, nil); err != nil {
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("put %d tables into %s: %w", len(keys), nameSFPool, err)
		}
		// No batch (an older kernel): one grace period per table, once per node.
		for i := range keys {
			if err := pool.Update(&keys[i], tables[i], ebpf.UpdateAny); err != nil {
				return fmt.Errorf("put the table of slot %d into %s: %w", keys[i]+1, nameSFPool, err)
			}
		}
	}
	return nil
}

// FillPool fills the pool's empty slots (Create does; tests and repairs),
// under the tables' lock (the agent's removal of stale pins takes it).
func (s StackFlows) FillPool() error {
	if s.m.poolSlots() == 0 {
		return nil
	}
	if err := os.MkdirAll(innerDir(s.m.dir, nameSFPool), 0o700); err != nil {
		return fmt.Errorf("create the pin directory of %s's tables: %w", nameSFPool, err)
	}
	unlock, err := innerLock(s.m.dir, true)
	if err != nil {
		return err
	}
	defer unlock()
	return s.m.fillSFPool()
}

// TakeSlot gives the pod behind the host veth ifindex a table of the pool,
// emptied, and returns its slot for the pod's address entries; it waits
// for no grace period. The slot ifindex holds already is taken again (a
// retried ADD, or a reused ifindex whose DEL was cut short). With every
// slot taken, one whose ifindex is no live veth (alive) is taken back (a
// DEL killed before it freed it). 0 and no error: no pool on this node's
// maps, or every slot is a live pod's; the caller makes a table of its
// own (StackFlows.AddPart), as before the pool.
func (s StackFlows) TakeSlot(ifindex int, alive func(ifindex int) bool) (uint32, error) {
	slot, err := s.pickSlot(ifindex, alive)
	if err != nil || slot == 0 {
		return 0, err
	}
	// Emptied before any entry names it: a pod never sees another's
	// records. Outside the pool's lock (issue 30: 100 ADDs at once queued
	// behind each other's scan and deletes there): the slot is this
	// ifindex's from the update on, and nothing else takes it while the
	// veth lives (a DEL killed before the clear leaves it to the next take,
	// which clears it).
	if err := s.m.clearSlot(slot); err != nil {
		return 0, err
	}
	return slot, nil
}

// pickSlot finds the slot for ifindex and records it in cni_sf_slots,
// under the pool's lock: a lookup, a batched scan and an update.
func (s StackFlows) pickSlot(ifindex int, alive func(ifindex int) bool) (uint32, error) {
	n := s.m.poolSlots()
	if n == 0 {
		return 0, nil
	}
	slots := s.m.get(nameSFSlots)
	unlock, err := poolLock(s.m.dir)
	if err != nil {
		return 0, err
	}
	defer unlock()
	k := uint32(ifindex)
	var slot uint32
	if err := slots.Lookup(&k, &slot); err == nil && s.m.validSlot(slot) {
		return slot, nil
	}
	// slot → ifindex, a slice: no hash map built of every live pod's entry
	// at each ADD (issue 30, round 13).
	owner := make([]uint32, n+1)
	if err := scan(slots, func(k, v *uint32) {
		if s.m.validSlot(*v) {
			owner[*v] = *k
		}
	}); err != nil {
		return 0, fmt.Errorf("scan %s: %w", nameSFSlots, err)
	}
	slot = 0
	// From a place the ifindex picks: ADDs rarely probe the same slots.
	for i, start := uint32(0), uint32(ifindex)%n; i < n; i++ {
		if c := 1 + (start+i)%n; owner[c] == 0 {
			slot = c
			break
		}
	}
	if slot == 0 {
		for c := uint32(1); c <= n; c++ {
			if idx := owner[c]; idx != 0 && int(idx) != ifindex && !alive(int(idx)) {
				stale := idx
				if err := slots.Delete(&stale); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return 0, fmt.Errorf("take back slot %d of gone ifindex %d from %s: %w", c, idx, nameSFSlots, err)
				}
				slot = c
				break
			}
		}
	}
	if slot == 0 {
		return 0, nil
	}
	if err := slots.Update(&k, &slot, ebpf.UpdateAny); err != nil {
		return 0, writeErr(slots, nameSFSlots, fmt.Sprintf("the slot of ifindex %d", ifindex), err)
	}
	return slot, nil
}

// poolLock serialises the takes and frees of slots across processes: a
// lock of its own, so that an ADD taking a slot never waits behind a
// policy ADD holding the tables' lock (innerLock) over a grace period.
// Lock order: the pool's, then the tables' (poolTable's fill).
func poolLock(dir string) (func(), error) {
	d := innerDir(dir, nameSFPool)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return nil, fmt.Errorf("create the pin directory of %s's tables: %w", nameSFPool, err)
	}
	fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s for locking: %w", d, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", d, err)
	}
	return func() { unix.Close(fd) }, nil
}

// poolTable opens the table of slot by its pin, filling the pool first
// when the slot is empty (a fill cut short), and pinning it again when its
// pin is gone (an agent's reconcile took a fill's pin for stale between
// the pin and the update): by ID, which the plugin, as root, may. By the
// slot's holder or under the pool's lock (see clearSlot).
func (m *Maps) poolTable(slot uint32) (*ebpf.Map, error) {
	pool := m.get(nameSFPool)
	var id uint32
	idx := slot - 1
	err := pool.Lookup(&idx, &id)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		unlock, lerr := innerLock(m.dir, true)
		if lerr != nil {
			return nil, lerr
		}
		err = m.fillSFPool()
		unlock()
		if err != nil {
			return nil, err
		}
		err = pool.Lookup(&idx, &id)
	}
	if err != nil {
		return nil, fmt.Errorf("read slot %d of %s: %w", slot, nameSFPool, err)
	}
	p := innerPin(m.dir, nameSFPool, keyBytes(idx))
	t, ok, err := loadInnerPin(p, ebpf.MapID(id))
	if err != nil || ok {
		return t, err
	}
	t, err = ebpf.NewMapFromID(ebpf.MapID(id))
	if errors.Is(err, os.ErrPermission) {
		return nil, fmt.Errorf("the table of slot %d of %s (map %d): %w", slot, nameSFPool, id, ErrInnerUnreachable)
	}
	if err != nil {
		return nil, fmt.Errorf("open the table of slot %d of %s (map %d): %w", slot, nameSFPool, id, err)
	}
	if err := replacePin(t, p); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// clearSlot deletes every record of slot's table: by the slot's holder
// (TakeSlot, once the slot is recorded as its), or under the pool's lock.
func (m *Maps) clearSlot(slot uint32) error {
	t, err := m.poolTable(slot)
	if err != nil {
		return err
	}
	defer t.Close()
	var keys []StackFlowKey
	if err := scan(t, func(k *StackFlowKey, _ *StackFlowVal) { keys = append(keys, *k) }); err != nil {
		return fmt.Errorf("scan the table of slot %d of %s: %w", slot, nameSFPool, err)
	}
	if err := deleteKeys(t, keys); err != nil {
		return fmt.Errorf("empty the table of slot %d of %s: %w", slot, nameSFPool, err)
	}
	return nil
}

// freeSlot empties the table of the slot ifindex holds and frees the slot
// (emptied first: the slot is free only once nothing of the pod is left in
// it; a DEL killed between leaves the slot to TakeSlot's taking back).
func (m *Maps) freeSlot(ifindex int) error {
	if m.poolSlots() == 0 {
		return nil
	}
	slots := m.get(nameSFSlots)
	unlock, err := poolLock(m.dir)
	if err != nil {
		return err
	}
	defer unlock()
	k := uint32(ifindex)
	var slot uint32
	if err := slots.Lookup(&k, &slot); errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("read the slot of ifindex %d from %s: %w", ifindex, nameSFSlots, err)
	}
	if m.validSlot(slot) {
		if err := m.clearSlot(slot); err != nil {
			return err
		}
	}
	if err := slots.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("free the slot of ifindex %d in %s: %w", ifindex, nameSFSlots, err)
	}
	return nil
}

// SlotOf is the slot ifindex holds (0: none).
func (s StackFlows) SlotOf(ifindex int) (uint32, error) {
	if s.m.poolSlots() == 0 {
		return 0, nil
	}
	k, slot := uint32(ifindex), uint32(0)
	if err := s.m.get(nameSFSlots).Lookup(&k, &slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, fmt.Errorf("read the slot of ifindex %d from %s: %w", ifindex, nameSFSlots, err)
	}
	return slot, nil
}

// Slots lists the taken slots: ifindex → slot.
func (s StackFlows) Slots() (map[int]uint32, error) {
	out := map[int]uint32{}
	if s.m.poolSlots() == 0 {
		return out, nil
	}
	if err := scan(s.m.get(nameSFSlots), func(k, v *uint32) { out[int(*k)] = *v }); err != nil {
		return nil, fmt.Errorf("scan %s: %w", nameSFSlots, err)
	}
	return out, nil
}

// eachTakenTable calls fn with the table of every taken slot (opened by
// pin, closed after fn).
func (m *Maps) eachTakenTable(fn func(slot uint32, t *ebpf.Map) error) error {
	taken, err := m.StackFlows().Slots()
	if err != nil {
		return err
	}
	pool := m.get(nameSFPool)
	for _, slot := range taken {
		var id uint32
		idx := slot - 1
		if !m.validSlot(slot) || pool.Lookup(&idx, &id) != nil {
			continue // empty: nothing recorded there
		}
		t, err := openInner(m.dir, pool, nameSFPool, keyBytes(idx), ebpf.MapID(id))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		err = fn(slot, t)
		t.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
