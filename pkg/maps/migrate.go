package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// Layout 1 pinned the same key and value structs as this layout under the
// same names but three: bw_state gained queue_ns and mark_ns (the ingress
// queue), which a layout 1 bucket lacks (0: it polices alone, as it did);
// ct_val gained seen_ns and a timer, snat_val a timer (flows copied with
// their timers unarmed, left to the agent's sweep). cni_masq_share (the
// per-pod port counts) starts empty: flows of layout 1 count for nobody.
// netns_info's pad became rcv_wnd, 0 in a layout 1 entry (no clamp). The
// rest changed in sizes and flags (maps sized from maxPods, cni_stats no
// longer preallocated) and cni_cidr_refs, which it lacked. So every other
// entry is copied as it is. A later layout that changes a struct adds its
// conversion here.

// bwStateV1 is bw_state of layout 1.
type bwStateV1 struct {
	Lock      uint32
	Pad       uint32
	NsPerByte uint64
	BurstNs   uint64
	TokensNs  int64
	LastNs    uint64
	RateBps   uint64
	BurstBits uint64
}

// copyBandwidthV1 copies layout 1's buckets, with no ingress queue.
func copyBandwidthV1(from, to *ebpf.Map, name string) (int, error) {
	return copyConverted[BandwidthKey](from, to, name, func(_ BandwidthKey, v bwStateV1) BandwidthState {
		return BandwidthState{NsPerByte: v.NsPerByte, BurstNs: v.BurstNs, TokensNs: v.TokensNs, LastNs: v.LastNs,
			RateBps: v.RateBps, BurstBits: v.BurstBits}
	})
}

// ctValV1 is ct_val of layout 1: no seen_ns, no timer.
type ctValV1 struct {
	OrigAddr, ClientAddr [16]uint8
	OrigPort, ClientPort uint16
	Ifindex, Flags, Pad  uint32
	CreatedNs            uint64
}

// snatValV1 is snat_val of layout 1: no timer.
type snatValV1 struct {
	Addr              [16]uint8
	Port, Flags       uint16
	Ifindex           uint32
	CreatedNs, SeenNs uint64
}

// copyCTV1 copies layout 1's hostPort flows as seen now (the agent's
// sweep, ExpireCT, ends them once idle past their timeout; the timer of a
// copied entry is not armed). Layout 1 kept no state (a flow lived until
// the LRU evicted it): a copy is an established flow (v1FlowState), not one
// whose handshake this build would end after 120 s idle.
func copyCTV1(from, to *ebpf.Map, name string) (int, error) {
	now := monotonicNow()
	return copyConverted[CTKey](from, to, name, func(k CTKey, v ctValV1) CTVal {
		return CTVal{OrigAddr: v.OrigAddr, ClientAddr: v.ClientAddr, OrigPort: v.OrigPort, ClientPort: v.ClientPort,
			Ifindex: v.Ifindex, Flags: v.Flags | uint32(v1FlowState(k.Proto, 0)), CreatedNs: v.CreatedNs, SeenNs: now}
	})
}

// Layout 1's snat_val flags (its masq.h): other bits than this layout's
// FLOW_F_*.
const (
	snatV1Closing = 1 << 0 // TCP RST, or a FIN each way
	snatV1FinOut  = 1 << 1 // TCP FIN from the pod
	snatV1FinIn   = 1 << 2 // TCP FIN from the peer
)

// v1FlowState is this layout's state of a flow layout 1 kept, with the
// lifetime layout 1 gave it: a TCP flow not closing 1 h idle (established
// here: 120 s before, which broke an old pod's idle connection), UDP 120 s
// (a stream here: 30 s before, 0 bits), ICMP 30 s; its FINs and closing
// carried over (layout 1's bits read as this layout's were "replied" for a
// FIN from the pod, "established" for one from the peer).
func v1FlowState(proto uint8, v1 uint16) uint16 {
	var n uint16
	if v1&snatV1FinOut != 0 {
		n |= flowFinOrig
	}
	if v1&snatV1FinIn != 0 {
		n |= flowFinReply
	}
	if v1&snatV1Closing != 0 {
		n |= flowClosing
	}
	switch proto {
	case ProtoTCP:
		n |= flowReplied | flowAssured
	case ProtoUDP:
		n |= flowReplied | flowStream
	}
	return n
}

// copySNATV1 copies layout 1's masqueraded flows (timer not armed), in
// this layout's flow states (v1FlowState), last used as they were.
func copySNATV1(from, to *ebpf.Map, name string) (int, error) {
	return copyConverted[SNATKey](from, to, name, func(k SNATKey, v snatValV1) SNATVal {
		return SNATVal{Addr: v.Addr, Port: v.Port, Flags: v1FlowState(k.Proto, v.Flags), Ifindex: v.Ifindex,
			CreatedNs: v.CreatedNs, SeenNs: v.SeenNs}
	})
}

// copyConverted copies every entry of a hash map of an older layout the
// target lacks, converting its value.
func copyConverted[K, O, N any](from, to *ebpf.Map, name string, conv func(K, O) N) (int, error) {
	var (
		k K
		v O
		n int
	)
	it := from.Iterate()
	for it.Next(&k, &v) {
		// By value: a per-CPU map's value is a slice, not a pointer to one.
		err := to.Update(&k, conv(k, v), ebpf.UpdateNoExist)
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
	var table []migrateCopier
	switch version {
	case 1:
		table = migrateV1()
	case 2:
		table = migrateV2()
	case 3, 4:
		table = m.migrateV3(dir, version == 4)
	default:
		return nil, fmt.Errorf("migrate maps of layout v%d at %s: this build (layout v%d) knows how to migrate layouts v1 to v4 only", version, dir, LayoutVersion)
	}
	out, errs := m.copyMaps(dir, version, table)
	if version == 1 {
		errs = errors.Join(errs, m.ownV1ClusterCIDRs())
	}
	return out, errs
}

// migrateCopier copies one map of an older layout into this one's.
type migrateCopier struct {
	name      string
	copy      func(from, to *ebpf.Map, name string) (int, error)
	valueSize uint32 // of the older layout, where it differs from this one's
}

// migrateV1 are the maps of layout v1 and how they are copied.
func migrateV1() []migrateCopier {
	return []migrateCopier{
		{nameEndpoints, copyHash[EndpointKey, EndpointInfo], 0},
		{nameLinks, copyHash[uint32, LinkInfo], 0},
		{nameStats, copyHash[StatsKey, []StatsVal], 0},
		{nameBandwidth, copyBandwidthV1, uint32(binary.Size(bwStateV1{}))},
		{nameNetns, copyHash[uint64, NetnsInfo], 0},
		{nameHostPorts, copyHash[HostPortKey, HostPortVal], 0},
		{nameCT, copyCTV1, uint32(binary.Size(ctValV1{}))},
		{nameNodeIPs, copyHash[EndpointKey, uint32], 0},
		{nameHPConfig, copyArray[NodeConfig], 0},
		{nameSockRNAT, copyHash[SockRNATKey, SockRNATVal], 0},
		{nameHPStats, copyPerCPUArray, 0},
		{nameSNAT, copySNATV1, uint32(binary.Size(snatValV1{}))},
		{nameClusterCIDRs, copyHash[CIDRKey, uint32], 0},
		{nameMasqStats, copyPerCPUArray, 0},
		{nameStackFlows, copyHash[StackFlowKey, StackFlowVal], 0},
	}
}

// migrateV2 are the maps of layout v2 and how they are copied.
func migrateV2() []migrateCopier {
	// v3 only added the event maps: every v2 map keeps its layout.
	// (A flow's timer is not copied, the kernel never copies one;
	// ExpireCT and ExpireSNAT end such flows.)
	return []migrateCopier{
		{nameEndpoints, copyHash[EndpointKey, EndpointInfo], 0},
		{nameLinks, copyHash[uint32, LinkInfo], 0},
		{nameStats, copyHash[StatsKey, []StatsVal], 0},
		{nameBandwidth, copyHash[BandwidthKey, BandwidthState], 0},
		{nameNetns, copyHash[uint64, NetnsInfo], 0},
		{nameHostPorts, copyHash[HostPortKey, HostPortVal], 0},
		{nameCT, copyHash[CTKey, CTVal], 0},
		{nameNodeIPs, copyHash[EndpointKey, uint32], 0},
		{nameHPConfig, copyArray[NodeConfig], 0},
		{nameSockRNAT, copyHash[SockRNATKey, SockRNATVal], 0},
		{nameHPStats, copyPerCPUArray, 0},
		{nameSNAT, copyHash[SNATKey, SNATVal], 0},
		{nameClusterCIDRs, copyHash[CIDRKey, uint32], 0},
		{nameClusterRefs, copyHash[CIDRRefKey, uint32], 0},
		{nameMasqStats, copyPerCPUArray, 0},
		{nameMasqConfig, copyArray[MasqConfig], 0},
		{nameMasqShare, copyHash[MasqShareKey, uint32], 0},
		{nameStackFlows, copyHash[StackFlowKey, StackFlowVal], 0},
	}
}

// migrateV3 are the maps of layouts v3 and v4 and how they are copied.
func (m *Maps) migrateV3(dir string, v4 bool) []migrateCopier {
	// v4 added the tunnel maps (cni_tun_nodes, cni_tun_cidrs) and two
	// drop reasons, v5 three more drop reasons: each resized cni_stats,
	// every other map keeps its layout. The ring buffer, the events' rate
	// state and the flows seen start anew (a flow is announced again).
	// From v4 the tunnel's peers and the links judging deferred egress
	// are copied too, so the trust rule knows the nodes before the agent
	// writes them again. So: v2's copiers, then v3's own maps.
	table := append(migrateV2(),
		migrateCopier{nameStackFlowParts, m.innerCopier(dir), 0},
		migrateCopier{nameEvConfig, copyArray[EventConfig], 0},
		migrateCopier{nameEvPods, copyHash[uint32, uint32], 0},
		migrateCopier{namePolState, copyHash[uint32, PolicyState], 0},
		migrateCopier{namePolAddrs, copyHash[PolicyAddrKey, PolicyAddrVal], 0},
		migrateCopier{namePolPorts, copyHash[PolicyPortKey, uint32], 0},
		migrateCopier{namePolCTParts, m.innerCopier(dir), 0},
		migrateCopier{namePolFragParts, m.innerCopier(dir), 0},
		// The pods' shares of cni_snat go with its flows (the quota
		// itself is derived from the sizing at Create).
		migrateCopier{nameMasqPods, copyHash[uint32, MasqPodVal], 0},
		migrateCopier{nameMasqKeys, copyArray[MasqKeysVal], 0},
		migrateCopier{namePolConfig, copyArray[PolicyConfig], 0})
	if v4 {
		table = append(table,
			migrateCopier{nameTunNodes, copyHash[EndpointKey, uint32], 0},
			migrateCopier{nameTunCIDRs, copyHash[CIDRKey, TunnelPeer], 0},
			migrateCopier{nameAfterLinks, copyHash[uint32, uint32], 0})
	}
	return table
}

// copyMaps copies each map of table pinned in dir (a map the older layout
// lacks is skipped) into this one's, counting the entries by name.
func (m *Maps) copyMaps(dir string, version int, table []migrateCopier) (map[string]int, error) {
	out := map[string]int{}
	var errs error
	for _, c := range table {
		p := filepath.Join(dir, c.name)
		from, err := ebpf.LoadPinnedMap(p, &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = errors.Join(errs, fmt.Errorf("open %s: %w", p, err))
			continue
		}
		to := m.get(c.name)
		wantValue := to.ValueSize()
		if c.valueSize != 0 {
			wantValue = c.valueSize
		}
		if from.KeySize() != to.KeySize() || from.ValueSize() != wantValue || from.Type() != to.Type() {
			from.Close()
			errs = errors.Join(errs, fmt.Errorf("%s of layout v%d is not what this build expects of a layout v%d map (%s, key %d, value %d)",
				p, version, version, from.Type(), from.KeySize(), from.ValueSize()))
			continue
		}
		n, err := c.copy(from, to, c.name)
		from.Close()
		out[c.name] = n
		errs = errors.Join(errs, err)
	}
	return out, errs
}

// ownV1ClusterCIDRs gives the v1 layout's cluster CIDRs their user:
// nobody's in particular.
func (m *Maps) ownV1ClusterCIDRs() error {
	var errs error
	cidrs, err := m.Masq().ClusterCIDRs()
	errs = errors.Join(errs, err)
	refs := m.get(nameClusterRefs)
	one := uint32(1)
	for _, p := range cidrs {
		k := CIDRRefKey{Cidr: cidrKey(p), Owner: 0}
		if err := refs.Update(&k, &one, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			errs = errors.Join(errs, writeErr(refs, nameClusterRefs, "user of "+p.String(), err))
		}
	}
	return errs
}

// copyHash copies every entry of a hash map (or LPM trie) the target lacks.
func copyHash[K, V any](from, to *ebpf.Map, name string) (int, error) {
	return copyConverted[K](from, to, name, func(_ K, v V) V { return v })
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

// innerCopier copies a map of maps of the older layout at dir: the new
// outer map holds the same tables (kernel objects, opened by their pins
// under dir, or by the IDs the old one lists for a layout that did not pin
// them), so their entries need no copy; each is pinned in this layout's
// directory. A table the process may not open (by ID, without
// CAP_SYS_ADMIN) fails the migration by name rather than losing the pod's
// flows unseen.
func (m *Maps) innerCopier(dir string) func(from, to *ebpf.Map, name string) (int, error) {
	return func(from, to *ebpf.Map, name string) (int, error) {
		es, err := innerEntries(from, name+" of the older layout")
		if err != nil {
			return 0, err
		}
		n := 0
		for _, e := range es {
			inner, err := openInner(dir, from, name, e.key, e.id)
			if errors.Is(err, os.ErrNotExist) {
				continue // gone meanwhile (its pod deleted)
			}
			if err != nil {
				return n, fmt.Errorf("copy %s of the older layout at %s: %w", name, dir, err)
			}
			err = m.putInner(name, e.key, inner, ebpf.UpdateNoExist)
			inner.Close()
			switch {
			case err == nil:
				n++
			case errors.Is(err, ebpf.ErrKeyExist):
			default:
				return n, writeErr(to, name, "an entry of the older layout", err)
			}
		}
		return n, nil
	}
}
