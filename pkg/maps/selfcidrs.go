package maps

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// nameSelfCIDRs is this node's own pod CIDRs (bpf/lib/maps.h
// cni_self_cidrs), optional within layout 5: from_uplink drops a packet off
// the wire whose source is in one of them (forged_pod_source).
var nameSelfCIDRs = mapName(&specNames.CniSelfCidrs)

// maxSelfCIDRs is MAX_SELF_CIDRS.
const maxSelfCIDRs = 16

// SyncSelfCIDRs makes cni_self_cidrs hold exactly cidrs, this node's own
// pod CIDRs as the agent knows them (its Node object's spec.podCIDRs, its
// entry of the peer list). Only the agent knows them: an IPAM range of a
// conflist may span nodes. New ones are written before stale ones go. A pin
// set without the map (an older build of the layout, before Create pinned
// it) is left alone.
func (m *Maps) SyncSelfCIDRs(cidrs []netip.Prefix) error {
	mp := m.get(nameSelfCIDRs)
	if mp == nil {
		return nil
	}
	want := map[CIDRKey]netip.Prefix{}
	for _, p := range cidrs {
		if !p.IsValid() {
			continue
		}
		if a := p.Addr(); a.Is4In6() {
			if p.Bits() < 96 {
				continue // not an IPv4 range
			}
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		want[cidrKey(p)] = p.Masked()
	}
	if len(want) > maxSelfCIDRs {
		return fmt.Errorf("%s: %d pod CIDRs of this node, at most %d: %w", nameSelfCIDRs, len(want), maxSelfCIDRs, ErrFull)
	}
	var errs error
	for k, p := range want {
		v := uint32(1)
		if err := mp.Update(&k, &v, ebpf.UpdateAny); err != nil {
			errs = errors.Join(errs, writeErr(mp, nameSelfCIDRs, "this node's pod CIDR "+p.String(), err))
		}
	}
	var stale []CIDRKey
	if err := scan(mp, func(k *CIDRKey, _ *uint32) {
		if _, ok := want[*k]; !ok {
			stale = append(stale, *k)
		}
	}); err != nil {
		return errors.Join(errs, fmt.Errorf("read %s: %w", nameSelfCIDRs, err))
	}
	for _, k := range stale {
		if err := mp.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = errors.Join(errs, fmt.Errorf("delete from %s: %w", nameSelfCIDRs, err))
		}
	}
	return errs
}
