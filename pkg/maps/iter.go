package maps

import (
	"errors"

	"github.com/cilium/ebpf"
)

// scan calls fn for every entry of a hash map, in batches where the kernel
// supports them (one syscall per 4096 entries rather than two per entry).
func scan[K, V any](m *ebpf.Map, fn func(*K, *V)) error {
	// No bigger than the map: a DEL scans every pod's 256-entry stack-flow
	// table, and 4096-entry buffers for each were most of its allocations
	// (issue 30). A batch never needs more room than the map holds.
	chunk := 4096
	if n := int(m.MaxEntries()); n > 0 && n < chunk {
		chunk = n
	}
	var cursor ebpf.MapBatchCursor
	keys := make([]K, chunk)
	vals := make([]V, chunk)
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			fn(&keys[i], &vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			break
		}
		if err != nil {
			return err
		}
	}
	var (
		k K
		v V
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		fn(&k, &v)
	}
	return it.Err()
}

// deleteKeys removes keys in batches; keys already gone are fine.
func deleteKeys[K any](m *ebpf.Map, keys []K) error {
	if len(keys) == 0 {
		return nil
	}
	if _, err := m.BatchDelete(keys, nil); err == nil {
		return nil
	}
	// A batch stops at the first missing key (LRU eviction): delete one by one.
	var errs error
	for i := range keys {
		if err := m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = errors.Join(errs, err)
		}
	}
	return errs
}
