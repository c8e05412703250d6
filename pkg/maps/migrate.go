package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// Layout 1 pinned the same key and value structs as this layout under the
// same names; what changed is sizes and flags (maps sized from maxPods,
// cni_stats no longer preallocated) and cni_cidr_refs, which it lacked. So
// its entries are copied as they are. A later layout that changes a struct
// adds its conversion here.

// MigrateFrom copies into m the entries of the maps an older build pinned
// in dir with layout version, so the attachments it made keep working once
// their links run this build's programs (see datapath.Ensure). An entry m
// has already is kept (this build's state wins), so it can run twice: once
// before the links move and once after, for what the old programs wrote
// meanwhile. Counters (per-CPU arrays) are copied only into a zero slot,
// never added twice. The cluster CIDRs of the old layout get owner 0: no
// attachment's teardown removes them. A map of the new layout too small
// for the old entries is an error wrapping ErrFull that names it and its
// size. It returns how many entries it copied per map.
func (m *Maps) MigrateFrom(dir string, version int) (map[string]int, error) {
	if version != 1 {
		return nil, fmt.Errorf("migrate maps of layout v%d at %s: this build (layout v%d) knows how to migrate layout v1 only", version, dir, LayoutVersion)
	}
	out := map[string]int{}
	var errs error
	for _, c := range []struct {
		name string
		copy func(from, to *ebpf.Map, name string) (int, error)
	}{
		{nameEndpoints, copyHash[EndpointKey, EndpointInfo]},
		{nameLinks, copyHash[uint32, LinkInfo]},
		{nameStats, copyHash[StatsKey, []StatsVal]},
		{nameBandwidth, copyHash[BandwidthKey, BandwidthState]},
		{nameNetns, copyHash[uint64, NetnsInfo]},
		{nameHostPorts, copyHash[HostPortKey, HostPortVal]},
		{nameCT, copyHash[CTKey, CTVal]},
		{nameNodeIPs, copyHash[EndpointKey, uint32]},
		{nameHPConfig, copyArray[HostPortConfig]},
		{nameSockRNAT, copyHash[SockRNATKey, SockRNATVal]},
		{nameHPStats, copyPerCPUArray},
		{nameSNAT, copyHash[SNATKey, SNATVal]},
		{nameClusterCIDRs, copyHash[CIDRKey, uint32]},
		{nameMasqStats, copyPerCPUArray},
		{nameStackFlows, copyHash[StackFlowKey, StackFlowVal]},
	} {
		p := filepath.Join(dir, c.name)
		from, err := ebpf.LoadPinnedMap(p, &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = errors.Join(errs, fmt.Errorf("open %s: %w", p, err))
			continue
		}
		to := m.byName[c.name]
		if from.KeySize() != to.KeySize() || from.ValueSize() != to.ValueSize() || from.Type() != to.Type() {
			from.Close()
			errs = errors.Join(errs, fmt.Errorf("%s of layout v%d is not what layout v%d expects of it (%s, key %d, value %d)",
				p, version, version, from.Type(), from.KeySize(), from.ValueSize()))
			continue
		}
		n, err := c.copy(from, to, c.name)
		from.Close()
		out[c.name] = n
		errs = errors.Join(errs, err)
	}
	// The old layout's cluster CIDRs: nobody's in particular.
	cidrs, err := m.ClusterCIDRs()
	errs = errors.Join(errs, err)
	refs := m.byName[nameClusterRefs]
	one := uint32(1)
	for _, p := range cidrs {
		k := CIDRRefKey{Cidr: cidrKey(p), Owner: 0}
		if err := refs.Update(&k, &one, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			errs = errors.Join(errs, writeErr(refs, nameClusterRefs, "user of "+p.String(), err))
		}
	}
	return out, errs
}

// copyHash copies every entry of a hash map (or LPM trie) the target lacks.
func copyHash[K, V any](from, to *ebpf.Map, name string) (int, error) {
	var (
		k K
		v V
		n int
	)
	it := from.Iterate()
	for it.Next(&k, &v) {
		err := to.Update(&k, v, ebpf.UpdateNoExist)
		switch {
		case err == nil:
			n++
		case errors.Is(err, ebpf.ErrKeyExist):
		default:
			return n, writeErr(to, name, "an entry of the older layout", err)
		}
	}
	if err := it.Err(); err != nil {
		return n, fmt.Errorf("read %s of the older layout: %w", name, err)
	}
	return n, nil
}

// copyArray copies the slots of an array whose target slot is still zero.
func copyArray[V comparable](from, to *ebpf.Map, name string) (int, error) {
	n := 0
	var zero V
	for i := uint32(0); i < from.MaxEntries() && i < to.MaxEntries(); i++ {
		var old, cur V
		if err := from.Lookup(&i, &old); err != nil {
			return n, fmt.Errorf("read %s[%d] of the older layout: %w", name, i, err)
		}
		if err := to.Lookup(&i, &cur); err != nil {
			return n, fmt.Errorf("read %s[%d]: %w", name, i, err)
		}
		if cur != zero || old == zero {
			continue
		}
		if err := to.Put(&i, &old); err != nil {
			return n, writeErr(to, name, fmt.Sprintf("slot %d", i), err)
		}
		n++
	}
	return n, nil
}

// copyPerCPUArray copies the per-CPU counters of each slot whose target
// counters are all zero.
func copyPerCPUArray(from, to *ebpf.Map, name string) (int, error) {
	n := 0
	for i := uint32(0); i < from.MaxEntries() && i < to.MaxEntries(); i++ {
		var old, cur []uint64
		if err := from.Lookup(&i, &old); err != nil {
			return n, fmt.Errorf("read %s[%d] of the older layout: %w", name, i, err)
		}
		if err := to.Lookup(&i, &cur); err != nil {
			return n, fmt.Errorf("read %s[%d]: %w", name, i, err)
		}
		if sum(cur) != 0 || sum(old) == 0 {
			continue
		}
		if err := to.Put(&i, old); err != nil {
			return n, writeErr(to, name, fmt.Sprintf("slot %d", i), err)
		}
		n++
	}
	return n, nil
}

func sum(v []uint64) uint64 {
	var s uint64
	for _, x := range v {
		s += x
	}
	return s
}
