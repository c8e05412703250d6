// Package mapstest is for tests only (by convention: no product package
// imports it, the exports lint checks that). It holds what the product never
// does to the maps and tests need to: a map by its C name, and writes that
// forge or damage state the way a crash, an older build or another tool
// would. The key encodings it needs are here, beside the generated types
// they fill, and TestEncodings holds them to the product's.
package mapstest

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Address families of the keys (AF_INET, AF_INET6).
const (
	afInet  = 2
	afInet6 = 10
)

// Map is the open map of m with that C name, nil when m has none.
func Map(m *maps.Maps, name string) *ebpf.Map { return m.Replacements()[name] }

// cidrKey is the cni_cluster_cidrs key of p: an LPM key whose length counts
// the family ahead of the address.
func cidrKey(p netip.Prefix) maps.CIDRKey {
	k := maps.CIDRKey{Prefixlen: uint32(32 + p.Bits()), Family: afInet}
	a := p.Masked().Addr()
	if a.Is4() {
		b := a.As4()
		copy(k.Addr[:], b[:])
	} else {
		k.Family = afInet6
		b := a.As16()
		copy(k.Addr[:], b[:])
	}
	return k
}

// PutClusterCIDR puts p into cni_cluster_cidrs with no user in
// cni_cidr_refs (as an older build left them, or to repair DeleteClusterCIDR).
func PutClusterCIDR(m *maps.Maps, p netip.Prefix) error {
	k, one := cidrKey(p), uint32(1)
	return Map(m, "cni_cluster_cidrs").Put(&k, &one)
}

// DeleteClusterCIDR removes p from cni_cluster_cidrs behind its users' back.
func DeleteClusterCIDR(m *maps.Maps, p netip.Prefix) error {
	k := cidrKey(p)
	return Map(m, "cni_cluster_cidrs").Delete(&k)
}

// SlotOfFlags is the stack-flow pool slot an address entry's flags carry (0:
// none): the inverse of maps.EndpointFlagsOfSlot.
func SlotOfFlags(flags uint32) uint32 {
	return flags >> bits.TrailingZeros32(maps.EndpointFlagsOfSlot(1))
}

// slotTable opens the table the pool holds at slot, by its ID.
func slotTable(m *maps.Maps, slot uint32) (*ebpf.Map, error) {
	pool := Map(m, "cni_sf_pool")
	if pool == nil || slot < 1 || slot > pool.MaxEntries() {
		return nil, fmt.Errorf("no slot %d in cni_sf_pool", slot)
	}
	idx, id := slot-1, uint32(0)
	if err := pool.Lookup(&idx, &id); err != nil {
		return nil, fmt.Errorf("read slot %d of cni_sf_pool: %w", slot, err)
	}
	return ebpf.NewMapFromID(ebpf.MapID(id))
}

// SlotRecords lists the records in the table of slot (what the pod holding
// it sent through the stack); Idle is left zero.
func SlotRecords(m *maps.Maps, slot uint32) ([]maps.StackFlow, error) {
	t, err := slotTable(m, slot)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	return tableRecords(t)
}

// PartRecords lists the records in the table of its own the pod behind the
// host veth ifindex has in cni_stack_flow_parts (no pool slot); Idle is
// left zero.
func PartRecords(m *maps.Maps, ifindex int) ([]maps.StackFlow, error) {
	k, id := uint32(ifindex), uint32(0)
	if err := Map(m, "cni_stack_flow_parts").Lookup(&k, &id); err != nil {
		return nil, fmt.Errorf("read the table of ifindex %d in cni_stack_flow_parts: %w", ifindex, err)
	}
	t, err := ebpf.NewMapFromID(ebpf.MapID(id))
	if err != nil {
		return nil, err
	}
	defer t.Close()
	return tableRecords(t)
}

// NoPartsFlag reads HP_CFG_SF_NO_PARTS (32, bpf/lib/types.h) of
// cni_hp_config: the programs skip cni_stack_flow_parts.
func NoPartsFlag(m *maps.Maps) (bool, error) {
	c, err := m.Node().Config()
	return c.Flags&32 != 0, err
}

func tableRecords(t *ebpf.Map) ([]maps.StackFlow, error) {
	var (
		out []maps.StackFlow
		k   maps.StackFlowKey
		v   maps.StackFlowVal
	)
	it := t.Iterate()
	for it.Next(&k, &v) {
		out = append(out, maps.StackFlow{Proto: k.Proto, Pod: addrPort(k.Addr, k.Family, k.Port),
			Peer: addrPort(k.PeerAddr, k.Family, k.PeerPort), Flags: v.Flags, Ifindex: int(v.Ifindex)})
	}
	return out, it.Err()
}

// PutSlotRecord writes one record into the table of slot as a program would
// (a record left by a pod killed mid-DEL). The slot must hold a table. It
// takes no pool lock (the product's layout of it is not a test's business):
// call it while no verb takes or fills slots.
func PutSlotRecord(m *maps.Maps, slot uint32, k maps.StackFlowKey, v maps.StackFlowVal) error {
	t, err := slotTable(m, slot)
	if err != nil {
		return err
	}
	defer t.Close()
	return t.Update(&k, &v, ebpf.UpdateAny)
}

// addrPort decodes an address and a port in network order.
func addrPort(a [16]uint8, family uint8, port uint16) netip.AddrPort {
	ip := netip.AddrFrom16(a)
	if family == afInet {
		ip = netip.AddrFrom4([4]byte(a[:4]))
	}
	var p [2]byte
	binary.NativeEndian.PutUint16(p[:], port)
	return netip.AddrPortFrom(ip, binary.BigEndian.Uint16(p[:]))
}

// SelfCIDRs is what cni_self_cidrs holds (this node's own pod CIDRs, as the
// agent wrote them); nil without the map.
func SelfCIDRs(m *maps.Maps) ([]netip.Prefix, error) {
	mp := Map(m, "cni_self_cidrs")
	if mp == nil {
		return nil, nil
	}
	var out []netip.Prefix
	var k [24]byte
	var v uint32
	it := mp.Iterate()
	for it.Next(&k, &v) {
		n := int(binary.LittleEndian.Uint32(k[0:4])) - 32
		var a netip.Addr
		switch k[4] {
		case afInet:
			a = netip.AddrFrom4([4]byte(k[8:12]))
		case afInet6:
			a = netip.AddrFrom16([16]byte(k[8:24]))
		default:
			return out, fmt.Errorf("cni_self_cidrs: family %d", k[4])
		}
		out = append(out, netip.PrefixFrom(a, n))
	}
	return out, it.Err()
}
