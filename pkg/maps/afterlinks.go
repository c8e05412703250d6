package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// nameAfterLinks is cni_after_links (bpf/lib/maps.h): the links whose
// egress program judges a pod's deferred egress NetworkPolicy after the
// stack. from_container judges a denied packet at once when its route
// leaves by any other link (bpf/lib/policy.h, pol_unjudged_after).
var nameAfterLinks = mapName(&specNames.CniAfterLinks)

// AfterLink is what judges on a link (a value bit of cni_after_links).
type AfterLink uint32

const (
	AfterLinkUplink AfterLink = 1 // to_uplink (AFTER_LINK_UPLINK)
	AfterLinkTunnel AfterLink = 2 // cni_to_tunnel (AFTER_LINK_TUNNEL)
)

// SyncAfterLinks makes the links with bit kind in cni_after_links exactly
// ifindexes, leaving other bits alone: the new ones are written before
// stale ones go, so a link that stays is never missing in between. A pin
// set of an older build of the layout may lack the map: then nothing is
// written (its programs do not read it). A full map is an error wrapping
// ErrFull naming it.
func (pl Policy) SyncAfterLinks(kind AfterLink, ifindexes []int) error {
	mp := pl.m.get(nameAfterLinks)
	if mp == nil {
		return nil
	}
	want := map[uint32]bool{}
	var errs error
	for _, idx := range ifindexes {
		k := uint32(idx)
		want[k] = true
		var v uint32
		if err := mp.Lookup(&k, &v); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = errors.Join(errs, fmt.Errorf("read %s: %w", nameAfterLinks, err))
			continue
		}
		if v&uint32(kind) != 0 {
			continue
		}
		v |= uint32(kind)
		if err := mp.Update(&k, &v, ebpf.UpdateAny); err != nil {
			errs = errors.Join(errs, writeErr(mp, nameAfterLinks, fmt.Sprintf("link %d", idx), err))
		}
	}
	type entry struct{ k, v uint32 }
	var stale []entry
	if err := scan(mp, func(k *uint32, v *uint32) {
		if *v&uint32(kind) != 0 && !want[*k] {
			stale = append(stale, entry{*k, *v &^ uint32(kind)})
		}
	}); err != nil {
		errs = errors.Join(errs, fmt.Errorf("read %s: %w", nameAfterLinks, err))
	}
	for _, e := range stale {
		var err error
		if e.v == 0 {
			err = mp.Delete(&e.k)
		} else {
			err = mp.Update(&e.k, &e.v, ebpf.UpdateAny)
		}
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = errors.Join(errs, fmt.Errorf("update %s: link %d: %w", nameAfterLinks, e.k, err))
		}
	}
	return errs
}
