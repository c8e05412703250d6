package maps

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// nameNodeIPsGone is cni_node_ips_gone (bpf/lib/maps.h): the monotonic
// time up to which a masquerade mapping may hold a node address the node
// has lost since it was made. masq_known checks only those mappings
// against cni_node_ips, not every packet of every flow (issue 30).
var nameNodeIPsGone = mapName(&specNames.CniNodeIpsGone)

// nodeIPsGoneMargin covers what is decided from the old addresses while
// the removal is being written: a mapping whose source came from an
// uplink source entry that SyncUplinkSources replaces after SyncNodeIPs.
const nodeIPsGoneMargin = time.Second

// markNodeIPsGone sets cni_node_ips_gone a margin past now. Called before
// an address leaves cni_node_ips, so that no mapping of it goes unchecked
// in between. A pin set without the map (an older build of the layout)
// has no program that reads it: nothing to write.
func (m *Maps) markNodeIPsGone() error {
	mp := m.get(nameNodeIPsGone)
	if mp == nil {
		return nil
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return fmt.Errorf("read the monotonic clock for %s: %w", nameNodeIPsGone, err)
	}
	v, zero := uint64(ts.Nano())+uint64(nodeIPsGoneMargin), uint32(0)
	if err := mp.Put(&zero, &v); err != nil {
		return fmt.Errorf("write %s: %w", nameNodeIPsGone, err)
	}
	return nil
}

// initNodeIPsGone writes the map when it was never written (just pinned).
// Beside a cni_snat made with it, which holds no mapping: 1, before any
// mapping. Beside an older build's cni_snat, whose mappings were checked at
// every packet: marked, so they still are.
func (m *Maps) initNodeIPsGone(freshSNAT bool) error {
	mp := m.get(nameNodeIPsGone)
	if mp == nil {
		return nil
	}
	var cur uint64
	zero := uint32(0)
	if err := mp.Lookup(&zero, &cur); err != nil {
		return fmt.Errorf("read %s: %w", nameNodeIPsGone, err)
	}
	if cur != 0 {
		return nil
	}
	if !freshSNAT {
		return m.markNodeIPsGone()
	}
	one := uint64(1)
	if err := mp.Put(&zero, &one); err != nil {
		return fmt.Errorf("write %s: %w", nameNodeIPsGone, err)
	}
	return nil
}
