package maps

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sort"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Usage is one pinned map's size, fill and kernel memory, as `ebpf-agent
// status`, the metrics and the memory benchmark report them.
type Usage struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	KeySize    uint32 `json:"keySize"`
	ValueSize  uint32 `json:"valueSize"`
	MaxEntries uint32 `json:"maxEntries"`
	Flags      uint32 `json:"flags"`
	// Entries in use; -1 for arrays, whose every slot always exists.
	Entries int `json:"entries"`
	// Memlock is what the kernel charges for the map now (fdinfo memlock:
	// since 6.4 the map's own accounting, map_mem_usage).
	Memlock uint64 `json:"memlockBytes"`
	// CPUs is the node's possible CPUs, which per-CPU parts scale with.
	CPUs int `json:"possibleCPUs"`
	// InnerMemlock: a map of maps' tables (cni_stack_flow_parts',
	// cni_pol_ct_parts'), which its own memlock does not count: each is
	// charged on its own.
	InnerMemlock uint64 `json:"innerMemlockBytes,omitempty"`

	typ       ebpf.MapType
	innerEach uint64        // memlock of one table, measured on this node
	inner     *ebpf.MapSpec // a table's spec (innerSpecs)
}

// Fill is Entries over MaxEntries; 0 for arrays.
func (u Usage) Fill() float64 {
	if u.Entries < 0 || u.MaxEntries == 0 {
		return 0
	}
	return float64(u.Entries) / float64(u.MaxEntries)
}

// FullWarn is the fill above which status warns about a map.
const FullWarn = 0.9

// Projected is the map's memlock on a node with cpus possible CPUs, with
// the map as full as now, or full (every entry used; for maps that are not
// preallocated this is the most they can cost). It is the measured memlock
// plus the difference of the kernel's accounting between the two states
// (see model), so the kernel's fixed overheads, which the model does not
// know, cancel out.
func (u Usage) Projected(cpus int, full bool) uint64 {
	n := u.Entries
	if full || n < 0 {
		n = int(u.MaxEntries)
	}
	d := int64(u.model(cpus, n)) - int64(u.model(u.CPUs, max(u.Entries, 0)))
	return uint64(int64(u.Memlock)+d) + u.innerAt(cpus)*uint64(max(n, 0))
}

// innerAt is the memlock of one table of a map of maps on a node with cpus
// possible CPUs: the one measured, scaled by the model (a preallocated
// table costs the same whatever its entries).
func (u Usage) innerAt(cpus int) uint64 {
	if u.innerEach == 0 {
		return 0
	}
	in := Usage{KeySize: u.inner.KeySize, ValueSize: u.inner.ValueSize, MaxEntries: u.inner.MaxEntries, typ: u.inner.Type}
	at := in
	at.MaxEntries = innerSpecAt(u.Name, cpus).MaxEntries // the flow tables grow with the CPUs
	return uint64(int64(u.innerEach) - int64(in.model(u.CPUs, 0)) + int64(at.model(cpus, 0)))
}

// Kernel accounting constants (x86_64/arm64) the model needs; the test
// reading real maps checks them against the kernel it runs on.
const (
	htabElemSize      = 48 // sizeof(struct htab_elem) up to the key
	htabBucketSize    = 16 // sizeof(struct bucket)
	htabLockCount     = 8  // HASHTAB_MAP_LOCK_COUNT ints per CPU
	llistNodeSize     = 8  // sizeof(struct llist_node)
	ptrSize           = 8
	lpmTrieNodeHeader = 24 // sizeof(struct lpm_trie_node) before data
)

// model is the part of the kernel's memory accounting of the map
// (htab_map_mem_usage, array_map_mem_usage, trie_mem_usage in kernel 6.x)
// that depends on the CPU count and the entries; the fixed size of the
// map's own struct is left out (Projected and the test add it back).
func (u Usage) model(cpus, entries int) uint64 {
	c, n := uint64(cpus), uint64(entries)
	key, val := round8(u.KeySize), round8(u.ValueSize)
	max := uint64(u.MaxEntries)
	switch u.typ {
	case ebpf.Hash, ebpf.PerCPUHash, ebpf.LRUHash, ebpf.LRUCPUHash, ebpf.HashOfMaps:
		percpu := u.typ == ebpf.PerCPUHash || u.typ == ebpf.LRUCPUHash
		lru := u.typ == ebpf.LRUHash || u.typ == ebpf.LRUCPUHash
		b := htabBucketSize*roundPow2(max) + 4*htabLockCount*c
		elem := htabElemSize + key
		if percpu {
			elem += ptrSize
		} else {
			elem += val
		}
		if u.Flags&unix.BPF_F_NO_PREALLOC == 0 {
			num := max
			if !percpu && !lru {
				num += c // one spare element per CPU
			}
			b += elem * num
			if percpu {
				b += val * c * num
			} else if !lru {
				b += ptrSize * c
			}
			return b
		}
		b += (elem + llistNodeSize) * n
		if percpu {
			b += (llistNodeSize+ptrSize)*n + val*c*n
		}
		return b
	case ebpf.Array, ebpf.ArrayOfMaps: // a pointer to each table, in 8 bytes
		return max * val
	case ebpf.PerCPUArray:
		return max*ptrSize + max*val*c
	case ebpf.LPMTrie:
		return (lpmTrieNodeHeader + uint64(u.KeySize) - 4 + uint64(u.ValueSize)) * n
	case ebpf.RingBuf:
		// The data pages, and two page pointers each (mapped twice, so a
		// record wrapping around reads contiguously).
		return max + max/4096*2*ptrSize
	}
	return 0
}

func round8(v uint32) uint64 { return (uint64(v) + 7) &^ 7 }

func roundPow2(v uint64) uint64 {
	if v <= 1 {
		return 1
	}
	return 1 << bits.Len64(v-1)
}

// Usage reads every map's size, entries and memlock.
func (m *Maps) Usage() ([]Usage, error) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, err
	}
	var (
		out  []Usage
		errs error
	)
	for _, name := range m.Names() {
		u, err := usageOf(m.dir, name, m.get(name), cpus)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, errs
}

func usageOf(dir, name string, mp *ebpf.Map, cpus int) (Usage, error) {
	info, err := mp.Info()
	if err != nil {
		return Usage{}, fmt.Errorf("%s: %w", name, err)
	}
	// 0 reads as "not reported"; tcx needs a kernel that reports it, so 0
	// is what an empty map that is not preallocated charges (an LPM trie).
	mem, _ := info.Memlock()
	u := Usage{Name: name, Type: mp.Type().String(), KeySize: mp.KeySize(), ValueSize: mp.ValueSize(),
		MaxEntries: mp.MaxEntries(), Flags: mp.Flags(), Memlock: mem, CPUs: cpus, typ: mp.Type(), Entries: -1}
	switch mp.Type() {
	// No keys to count. An array of maps too: its every slot exists (the
	// pool's, cni_sf_pool, each holds a table from setup on; cni_sf_slots
	// counts the taken ones), so counted keys read as a full map.
	case ebpf.Array, ebpf.PerCPUArray, ebpf.RingBuf, ebpf.ArrayOfMaps:
	default:
		if u.Entries, err = countKeys(mp); err != nil {
			return Usage{}, fmt.Errorf("count entries of %s: %w", name, err)
		}
	}
	if _, ok := innerSpecs[name]; ok {
		u.inner = innerSpecAt(name, cpus)
		if err := u.addInner(dir, mp); err != nil {
			return Usage{}, fmt.Errorf("tables of %s: %w", name, err)
		}
	}
	return u, nil
}

// innerSpecAt is the spec of the tables the verbs put in map of maps name
// on a node of cpus possible CPUs: innerSpecs', but for the policy flow
// tables' size (polCTTableSpec).
func innerSpecAt(name string, cpus int) *ebpf.MapSpec {
	if name == namePolCTParts {
		return polCTTableSpec(cpus)
	}
	return innerSpecs[name]
}

// innerSpecs are the tables of each map of maps, as the object declares
// them and the verbs create them (the policy flow tables larger:
// innerSpecAt).
var innerSpecs = map[string]*ebpf.MapSpec{nameStackFlowParts: &stackFlowPartSpec, namePolCTParts: &polCTPartSpec, namePolFragParts: &polFragPartSpec,
	nameSFPool: &stackFlowPartSpec}

// addInner sums the memlock of a map of maps' tables (opened by their pins
// under dir), and measures one (a probe table when there is none). A table
// that cannot be opened is an error: a sum without it would understate.
func (u *Usage) addInner(dir string, mp *ebpf.Map) error {
	es, err := innerEntries(mp, u.Name)
	if err != nil {
		return err
	}
	for _, e := range es {
		t, err := openInner(dir, mp, u.Name, e.key, e.id)
		if errors.Is(err, os.ErrNotExist) {
			continue // dropped meanwhile
		}
		if err != nil {
			return err
		}
		if info, err := t.Info(); err == nil {
			mem, _ := info.Memlock()
			u.InnerMemlock += mem
			u.innerEach = mem
		}
		t.Close()
	}
	if u.innerEach == 0 {
		t, err := ebpf.NewMap(u.inner)
		if err != nil {
			return err
		}
		defer t.Close()
		info, err := t.Info()
		if err != nil {
			return err
		}
		u.innerEach, _ = info.Memlock()
	}
	return nil
}

// countKeys walks a map's keys (no values: per-CPU ones would be copied
// for every CPU).
func countKeys(m *ebpf.Map) (int, error) {
	key := make([]byte, m.KeySize())
	next := make([]byte, m.KeySize())
	var cur any // nil: the first key
	n := 0
	for n <= int(m.MaxEntries()) {
		if err := m.NextKey(cur, next); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return n, nil
			}
			return 0, err
		}
		n++
		copy(key, next)
		cur = key
	}
	return n, nil
}

// Footprint sums the maps' memlock on a node with cpus possible CPUs: with
// the entries they have now, and with every map full. With the pool of
// stack-flow tables (sfpool.go) pinned, a pod gets a table of its own in
// cni_stack_flow_parts only when no slot is free, and the pool has one per
// attachment: those are counted as they are, not full (a table per
// attachment in all, as before the pool).
func Footprint(us []Usage, cpus int) (now, full uint64) {
	pool := false
	for _, u := range us {
		pool = pool || u.Name == nameSFPool
	}
	for _, u := range us {
		now += u.Projected(cpus, false)
		full += u.Projected(cpus, !(pool && u.Name == nameStackFlowParts))
	}
	return now, full
}
