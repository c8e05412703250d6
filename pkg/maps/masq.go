package maps

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
)

// Go twins of the masquerade structs in bpf/lib/types.h, generated from BTF.
type (
	CIDRKey      = mapsObjCidrKey
	CIDRRefKey   = mapsObjCidrRefKey
	SNATKey      = mapsObjSnatKey
	SNATVal      = mapsObjSnatVal
	MasqStat     = mapsObjMasqStat
	MasqConfig   = mapsObjMasqConfig
	MasqShareKey = mapsObjMasqShareKey
)

// Names of the masquerade maps, as bpf/lib/maps.h declares them.
var (
	nameSNAT         = mapName(&specNames.CniSnat)
	nameClusterCIDRs = mapName(&specNames.CniClusterCidrs)
	nameClusterRefs  = mapName(&specNames.CniCidrRefs)
	nameMasqStats    = mapName(&specNames.CniMasqStats)
	nameMasqConfig   = mapName(&specNames.CniMasqConfig)
	nameMasqShare    = mapName(&specNames.CniMasqShare)
)

const (
	// EndpointFlagMasq is EP_F_MASQ in ep_info.flags: the pod's traffic to
	// destinations outside the cluster CIDRs is masqueraded.
	EndpointFlagMasq = 1 << 3
	snatDirFwd       = 0 // SNAT_DIR_FWD
	snatDirRev       = 1 // SNAT_DIR_REV
	// SNAT_F_SEQ (bpf/lib/tcpseq.h): a reverse TCP entry whose created_ns
	// holds the flow's sequence tracking, not a time.
	snatSeqTracked = 1 << 8
	// SNAT_F_PEER_FIN (bpf/lib/masq.h): a forward TCP entry whose seen_ns
	// low word holds the end of a FIN of the peer's waiting for the pod's ack.
	snatPeerFIN = 1 << 9
	// ProtoICMP and ProtoICMPv6: masquerade translates echo requests (the id is the port).
	ProtoICMP   uint8 = 1
	ProtoICMPv6 uint8 = 58
	// MasqRanges is MASQ_RANGES: how many port ranges cni_masq_config holds.
	MasqRanges = 4
)

func (s MasqStat) String() string {
	switch s {
	case mapsObjMasqStatMASQ_STAT_SNAT:
		return "snat"
	case mapsObjMasqStatMASQ_STAT_REVERSE:
		return "reverse"
	case mapsObjMasqStatMASQ_STAT_NEW:
		return "new"
	case mapsObjMasqStatMASQ_STAT_EXHAUSTED:
		return "drop_exhausted"
	case mapsObjMasqStatMASQ_STAT_NOT_NEW:
		return "not_new"
	case mapsObjMasqStatMASQ_STAT_ERROR:
		return "drop_error"
	case mapsObjMasqStatMASQ_STAT_ICMP_ERR_IN:
		return "icmp_error_in"
	case mapsObjMasqStatMASQ_STAT_ICMP_ERR_OUT:
		return "icmp_error_out"
	case mapsObjMasqStatMASQ_STAT_RECYCLED:
		return "recycled"
	case mapsObjMasqStatMASQ_STAT_POD_LIMIT:
		return "drop_pod_limit"
	case mapsObjMasqStatMASQ_STAT_EXPIRED:
		return "expired"
	}
	return fmt.Sprintf("stat%d", uint32(s))
}

// cidrKey builds the LPM key of a prefix (the family byte and its padding
// count as 32 bits of the prefix).
func cidrKey(p netip.Prefix) CIDRKey {
	k := CIDRKey{Prefixlen: uint32(32 + p.Bits()), Family: afInet}
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

func (k CIDRKey) prefix() netip.Prefix {
	var a netip.Addr
	if k.Family == afInet {
		a = netip.AddrFrom4([4]byte(k.Addr[:4]))
	} else {
		a = netip.AddrFrom16(k.Addr)
	}
	return netip.PrefixFrom(a, int(k.Prefixlen)-32)
}

// Masq is the masquerade family of the maps: the cluster CIDRs never
// masqueraded and their users (cni_cluster_cidrs, cni_cidr_refs), the flows
// (cni_snat), the port ranges and keys (cni_masq_config, cni_masq_keys), the
// pods' port shares and quota (cni_masq_share, cni_masq_pods,
// cni_masq_quota) and the counters (cni_masq_stats).
type Masq struct{ m *Maps }

// Masq returns the masquerade family of m.
func (m *Maps) Masq() Masq { return Masq{m} }

// CIDROwner names a user of cluster CIDRs (an attachment) by a hash of
// what identifies it; never 0, which stands for CIDRs inherited from an
// older layout.
func CIDROwner(parts ...string) uint64 {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	if o := binary.LittleEndian.Uint64(h[:8]); o != 0 {
		return o
	}
	return 1
}

// AcquireClusterCIDRs makes owner a user of prefixes, inserting into
// cni_cluster_cidrs the ones it lacks (destinations inside them are never
// masqueraded). All or nothing: when cni_cluster_cidrs (or cni_cidr_refs)
// has no room, the error wraps ErrFull, names the map and its size, and
// whatever this call added is gone again. Idempotent for an owner. Runs
// under a lock on the map directory, as ReleaseClusterCIDRs, so a CIDR
// one process adds is never removed by another releasing its last user.
func (ms Masq) AcquireClusterCIDRs(owner uint64, prefixes []netip.Prefix) error {
	unlock, err := ms.m.lock()
	if err != nil {
		return err
	}
	defer unlock()
	return ms.m.acquire(owner, prefixes)
}

// acquire is AcquireClusterCIDRs with the lock held.
func (m *Maps) acquire(owner uint64, prefixes []netip.Prefix) (err error) {
	trie, refs := m.get(nameClusterCIDRs), m.get(nameClusterRefs)
	have, err := m.Masq().ClusterCIDRs()
	if err != nil {
		return fmt.Errorf("read %s: %w", nameClusterCIDRs, err)
	}
	present := map[netip.Prefix]bool{}
	for _, p := range have {
		present[p] = true
	}
	var keys []CIDRKey
	missing := 0
	seen := map[netip.Prefix]bool{}
	for _, p := range prefixes {
		p = p.Masked()
		if seen[p] {
			continue
		}
		seen[p] = true
		keys = append(keys, cidrKey(p))
		if !present[p] {
			missing++
		}
	}
	if len(have)+missing > int(trie.MaxEntries()) {
		return fmt.Errorf("add %d cluster CIDRs to %s: %w: %s holds at most %d entries and has %d",
			missing, nameClusterCIDRs, ErrFull, nameClusterCIDRs, trie.MaxEntries(), len(have))
	}
	// Undo what this call added if anything fails: its refs, and the CIDRs
	// nobody else uses.
	var added []CIDRRefKey
	defer func() {
		if err != nil {
			err = errors.Join(err, m.dropRefs(added))
		}
	}()
	one := uint32(1)
	for _, k := range keys {
		// The ref first: a process killed in between leaves a ref (its
		// attachment's teardown drops it), never a CIDR nobody holds.
		rk := CIDRRefKey{Cidr: k, Owner: owner}
		switch err := refs.Update(&rk, &one, ebpf.UpdateNoExist); {
		case err == nil:
			added = append(added, rk)
		case errors.Is(err, ebpf.ErrKeyExist):
		default:
			return writeErr(refs, nameClusterRefs, "user of "+k.prefix().String(), err)
		}
		if err := trie.Update(&k, &one, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return writeErr(trie, nameClusterCIDRs, k.prefix().String(), err)
		}
	}
	return nil
}

// SetClusterCIDRs makes owner a user of exactly want, for a user whose
// wishes change (the agent following the cluster's nodes): it drops the
// uses not in want first (the CIDRs no other user holds go, making room),
// then acquires want, all or nothing as AcquireClusterCIDRs. It returns
// the CIDRs owner came to use and those it no longer uses. A CIDR another
// user (an attachment's configuration) holds stays whatever owner wants.
// An owner holding none and wanting none costs one scan and no lock.
func (ms Masq) SetClusterCIDRs(owner uint64, want []netip.Prefix) (gained, dropped []netip.Prefix, err error) {
	mine, err := ms.m.refsOf(owner)
	if err != nil || (len(mine) == 0 && len(want) == 0) {
		return nil, nil, err // nothing held, nothing wanted: no lock
	}
	unlock, err := ms.m.lock()
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	if mine, err = ms.m.refsOf(owner); err != nil {
		return nil, nil, err
	}
	wanted, held := map[netip.Prefix]bool{}, map[netip.Prefix]bool{}
	for _, p := range want {
		wanted[p.Masked()] = true
	}
	var stale []CIDRRefKey
	for _, r := range mine {
		p := r.Cidr.prefix()
		held[p] = true
		if !wanted[p] {
			stale = append(stale, r)
			dropped = append(dropped, p)
		}
	}
	if err := ms.m.dropRefs(stale); err != nil {
		return nil, dropped, err
	}
	if err := ms.m.acquire(owner, want); err != nil {
		return nil, dropped, err
	}
	for p := range wanted {
		if !held[p] {
			gained = append(gained, p)
		}
	}
	sortPrefixes(gained)
	sortPrefixes(dropped)
	return gained, dropped, nil
}

func sortPrefixes(ps []netip.Prefix) {
	sort.Slice(ps, func(i, j int) bool { return ps[i].String() < ps[j].String() })
}

// ReleaseClusterCIDRs drops every use owner made of cluster CIDRs and
// removes from cni_cluster_cidrs those no user holds any more; it returns
// them. Idempotent: an owner with no uses costs one scan of cni_cidr_refs
// and no lock.
func (ms Masq) ReleaseClusterCIDRs(owner uint64) ([]netip.Prefix, error) {
	mine, err := ms.m.refsOf(owner)
	if err != nil || len(mine) == 0 {
		return nil, err
	}
	unlock, err := ms.m.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if mine, err = ms.m.refsOf(owner); err != nil {
		return nil, err
	}
	var gone []netip.Prefix
	before, _ := ms.ClusterCIDRs()
	err = ms.m.dropRefs(mine)
	after, aerr := ms.ClusterCIDRs()
	if aerr == nil {
		left := map[netip.Prefix]bool{}
		for _, p := range after {
			left[p] = true
		}
		for _, p := range before {
			if !left[p] {
				gone = append(gone, p)
			}
		}
	}
	return gone, err
}

// ReleaseInheritedClusterCIDRs drops the cluster CIDRs an older layout
// left (owner 0, see MigrateFrom) once no attachment that could use them
// is left: cni_links, node-wide, has no entry but exceptIfindex's (the
// attachment being torn down; 0 for none). Those of attachments made since
// keep their own users. It returns whether it dropped any.
func (ms Masq) ReleaseInheritedClusterCIDRs(exceptIfindex int) (bool, error) {
	inherited, err := ms.m.refsOf(0)
	if err != nil || len(inherited) == 0 {
		return false, err
	}
	unlock, err := ms.m.lock()
	if err != nil {
		return false, err
	}
	defer unlock()
	busy := false
	if err := scan(ms.m.links, func(k *uint32, _ *LinkInfo) { busy = busy || int(*k) != exceptIfindex }); err != nil {
		return false, fmt.Errorf("scan %s: %w", nameLinks, err)
	}
	if busy {
		return false, nil
	}
	if inherited, err = ms.m.refsOf(0); err != nil {
		return false, err
	}
	return len(inherited) > 0, ms.m.dropRefs(inherited)
}

// refsOf lists owner's entries of cni_cidr_refs.
func (m *Maps) refsOf(owner uint64) ([]CIDRRefKey, error) {
	var out []CIDRRefKey
	err := scan(m.get(nameClusterRefs), func(k *CIDRRefKey, _ *uint32) {
		if k.Owner == owner {
			out = append(out, *k)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", nameClusterRefs, err)
	}
	return out, nil
}

// dropRefs deletes refs, then every CIDR among theirs that no ref holds
// any more. Call with the lock held.
func (m *Maps) dropRefs(refs []CIDRRefKey) error {
	if len(refs) == 0 {
		return nil
	}
	err := deleteKeys(m.get(nameClusterRefs), refs)
	used := map[CIDRKey]bool{}
	if serr := scan(m.get(nameClusterRefs), func(k *CIDRRefKey, _ *uint32) { used[k.Cidr] = true }); serr != nil {
		return errors.Join(err, fmt.Errorf("scan %s: %w", nameClusterRefs, serr))
	}
	for _, r := range refs {
		if used[r.Cidr] {
			continue
		}
		k := r.Cidr
		if derr := m.get(nameClusterCIDRs).Delete(&k); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
			err = errors.Join(err, fmt.Errorf("delete %s from %s: %w", k.prefix(), nameClusterCIDRs, derr))
		}
		used[r.Cidr] = true // once
	}
	return err
}

// ClusterCIDRsOf lists the cluster CIDRs owner uses.
func (ms Masq) ClusterCIDRsOf(owner uint64) (map[netip.Prefix]bool, error) {
	refs, err := ms.m.refsOf(owner)
	out := map[netip.Prefix]bool{}
	for _, r := range refs {
		out[r.Cidr.prefix()] = true
	}
	return out, err
}

// ClusterCIDRUsers counts the users of each cluster CIDR (0: inherited
// from an older layout counts as one).
func (ms Masq) ClusterCIDRUsers() (map[netip.Prefix]int, error) {
	out := map[netip.Prefix]int{}
	err := scan(ms.m.get(nameClusterRefs), func(k *CIDRRefKey, _ *uint32) { out[k.Cidr.prefix()]++ })
	return out, err
}

// ClusterCIDRs lists cni_cluster_cidrs.
func (ms Masq) ClusterCIDRs() ([]netip.Prefix, error) {
	var (
		out []netip.Prefix
		k   CIDRKey
		v   uint32
	)
	it := ms.m.get(nameClusterCIDRs).Iterate()
	for it.Next(&k, &v) {
		out = append(out, k.prefix())
	}
	return out, it.Err()
}

// SNATFlow is one masqueraded flow, decoded from its forward entry of cni_snat.
type SNATFlow struct {
	Proto   uint8
	Pod     netip.AddrPort // the pod's address and port (ICMP: echo id)
	Node    netip.AddrPort // what the peer sees
	Peer    netip.AddrPort
	Ifindex int
	Age     time.Duration // since creation
	Idle    time.Duration // since last use (second granularity)
	Reverse bool          // a reverse entry whose forward entry is gone
	Closing bool          // TCP RST, or a FIN each way, seen: expires 10 s after the last packet
	State   string        // FlowState's name: the flow is deleted once idle for FlowTimeout of it
	Flags   uint32
}

// snatBorn is when a forward entry was made: its created_ns, but for a TCP
// flow opened since fin21 (FLOW_F_STREAM, SNAT_F_ACKED in masq.h), whose low
// word holds the pod's highest end, its high word one 2^32 ns early
// (snat_stamp, snat_born): to within 4.3 s.
func snatBorn(proto uint8, v SNATVal) uint64 {
	if proto != ProtoTCP || v.Flags&flowStream == 0 {
		return v.CreatedNs
	}
	if hi := v.CreatedNs &^ 0xffffffff; hi != 0 {
		return hi + 1<<32
	}
	return 0
}

// snatFwdSeen is a forward entry's last use: its seen_ns, but while a FIN
// of the peer's waits on a TCP flow (SNAT_F_PEER_FIN), whose end is in its
// low word, the latest time its high word stands for (snat_fwd_seen).
func snatFwdSeen(proto uint8, v SNATVal) uint64 {
	if proto == ProtoTCP && v.Flags&snatPeerFIN != 0 {
		return v.SeenNs | 0xffffffff
	}
	return v.SeenNs
}

// ListSNAT returns the masqueraded flows (forward entries, plus reverse
// entries without one).
func (ms Masq) ListSNAT() ([]SNATFlow, error) {
	now := monotonicNow()
	type ent struct {
		k SNATKey
		v SNATVal
	}
	var all []ent
	err := scan(ms.m.get(nameSNAT), func(k *SNATKey, v *SNATVal) { all = append(all, ent{*k, *v}) })
	if err != nil {
		return nil, err
	}
	age := func(t uint64) time.Duration { return sinceNs(now, t) }
	fwd := map[[3]netip.AddrPort]bool{}
	var out []SNATFlow
	for _, e := range all {
		if e.k.Dir != snatDirFwd {
			continue
		}
		f := SNATFlow{
			Proto: e.k.Proto, Pod: addrPort(e.k.Addr, e.k.Family, e.k.Port), Peer: addrPort(e.k.PeerAddr, e.k.Family, e.k.PeerPort),
			Node: addrPort(e.v.Addr, e.k.Family, e.v.Port), Ifindex: int(e.v.Ifindex), Age: age(snatBorn(e.k.Proto, e.v)), Idle: age(snatFwdSeen(e.k.Proto, e.v)),
			Closing: e.v.Flags&flowClosing != 0, State: FlowState(e.k.Proto, uint32(e.v.Flags)), Flags: uint32(e.v.Flags),
		}
		fwd[[3]netip.AddrPort{f.Node, f.Peer, f.Pod}] = true
		out = append(out, f)
	}
	for _, e := range all {
		if e.k.Dir != snatDirRev {
			continue
		}
		f := SNATFlow{
			Proto: e.k.Proto, Node: addrPort(e.k.Addr, e.k.Family, e.k.Port), Peer: addrPort(e.k.PeerAddr, e.k.Family, e.k.PeerPort),
			Pod: addrPort(e.v.Addr, e.k.Family, e.v.Port), Ifindex: int(e.v.Ifindex), Age: age(e.v.CreatedNs), Idle: age(e.v.SeenNs),
			Reverse: true, Closing: e.v.Flags&flowClosing != 0, State: FlowState(e.k.Proto, uint32(e.v.Flags)), Flags: uint32(e.v.Flags),
		}
		if e.v.Flags&snatSeqTracked != 0 {
			f.Age = 0 // unknown: created_ns holds sequence numbers
		}
		if !fwd[[3]netip.AddrPort{f.Node, f.Peer, f.Pod}] {
			out = append(out, f)
		}
	}
	return out, nil
}

// DeleteSNATOf removes every cni_snat entry (both directions) made for the
// pod behind the host veth ifindex, and its port counts in cni_masq_share,
// and returns how many flow entries. A scan, as DeleteCTOf: the cost grows
// with the node's masqueraded flows, and the programs never use an entry
// whose ifindex is not the pod's anyway.
func (ms Masq) DeleteSNATOf(ifindex int) (int, error) {
	// Its count first: the programs count no new flow of a pod whose
	// endpoint entries are gone, and the flows deleted below are its.
	if err := ms.m.forgetMasqPod(ifindex); err != nil {
		return 0, err
	}
	var keys []SNATKey
	err := scan(ms.m.get(nameSNAT), func(k *SNATKey, v *SNATVal) {
		if int(v.Ifindex) == ifindex {
			keys = append(keys, *k)
		}
	})
	if err != nil {
		return 0, fmt.Errorf("scan %s: %w", nameSNAT, err)
	}
	if err := deleteKeys(ms.m.get(nameSNAT), keys); err != nil {
		return 0, fmt.Errorf("delete from %s: %w", nameSNAT, err)
	}
	var shares []MasqShareKey
	err = scan(ms.m.get(nameMasqShare), func(k *MasqShareKey, v *uint32) {
		if int(k.Ifindex) == ifindex {
			shares = append(shares, *k)
		}
	})
	if err != nil {
		return len(keys), fmt.Errorf("scan %s: %w", nameMasqShare, err)
	}
	return len(keys), deleteKeys(ms.m.get(nameMasqShare), shares)
}

// MasqPorts is cni_masq_config: the node ports masquerade allocates from
// (inclusive ranges) and the most of them one pod holds towards one
// destination (0: no limit).
type MasqPorts struct {
	Ranges   [][2]uint16 `json:"ranges"`
	PodLimit uint32      `json:"podLimit"`
}

// Size is how many ports the ranges hold.
func (p MasqPorts) Size() int {
	n := 0
	for _, r := range p.Ranges {
		n += int(r[1]) - int(r[0]) + 1
	}
	return n
}

func (p MasqPorts) String() string {
	var b strings.Builder
	for i, r := range p.Ranges {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d-%d", r[0], r[1])
	}
	return b.String()
}

func (p MasqPorts) value() (MasqConfig, error) {
	var c MasqConfig
	if len(p.Ranges) == 0 || len(p.Ranges) > MasqRanges {
		return c, fmt.Errorf("masquerade ports: %d ranges, want 1 to %d", len(p.Ranges), MasqRanges)
	}
	for i, r := range p.Ranges {
		if r[0] == 0 || r[1] < r[0] {
			return c, fmt.Errorf("masquerade ports: bad range %d-%d", r[0], r[1])
		}
		c.Lo[i] = r[0]
		c.Len[i] = uint16(int(r[1]) - int(r[0]) + 1) // at most 65535 ports
		c.Total += uint32(c.Len[i])
	}
	c.PodLimit = p.PodLimit
	return c, nil
}

// Config reads cni_masq_config; a node never configured has no ranges
// (the programs then use 61000-65535 without a pod limit).
func (ms Masq) Config() (MasqPorts, error) {
	var c MasqConfig
	zero := uint32(0)
	if err := ms.m.get(nameMasqConfig).Lookup(&zero, &c); err != nil {
		return MasqPorts{}, fmt.Errorf("read %s: %w", nameMasqConfig, err)
	}
	p := MasqPorts{PodLimit: c.PodLimit}
	for i := range c.Lo {
		if c.Len[i] != 0 {
			p.Ranges = append(p.Ranges, [2]uint16{c.Lo[i], uint16(int(c.Lo[i]) + int(c.Len[i]) - 1)})
		}
	}
	return p, nil
}

// SetConfig writes cni_masq_config when it differs from p.
func (ms Masq) SetConfig(p MasqPorts) error {
	want, err := p.value()
	if err != nil {
		return err
	}
	var cur MasqConfig
	zero := uint32(0)
	mp := ms.m.get(nameMasqConfig)
	if err := mp.Lookup(&zero, &cur); err == nil && cur == want {
		return nil
	}
	if err := mp.Put(&zero, &want); err != nil {
		return fmt.Errorf("write %s: %w", nameMasqConfig, err)
	}
	return nil
}

// MasqShare is how many ports one pod holds towards one destination.
type MasqShare struct {
	Proto       uint8
	Destination netip.AddrPort // port 0 for ICMP
	Ifindex     int
	Ports       int
}

// ListShares returns the non-zero counts of cni_masq_share.
func (ms Masq) ListShares() ([]MasqShare, error) {
	var out []MasqShare
	err := scan(ms.m.get(nameMasqShare), func(k *MasqShareKey, v *uint32) {
		if n := int32(*v); n > 0 {
			out = append(out, MasqShare{Proto: k.Proto, Destination: addrPort(k.PeerAddr, k.Family, k.PeerPort), Ifindex: int(k.Ifindex), Ports: int(n)})
		}
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", nameMasqShare, err)
	}
	return out, nil
}

// Stats returns the masquerade counters, summed over CPUs.
func (ms Masq) Stats() (map[string]uint64, error) {
	out := make(map[string]uint64)
	for i := 0; i < int(mapsObjMasqStatMASQ_STAT_MAX); i++ {
		k := uint32(i)
		var per []uint64
		if err := ms.m.get(nameMasqStats).Lookup(&k, &per); err != nil {
			return nil, fmt.Errorf("read %s: %w", nameMasqStats, err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[MasqStat(i).String()] = sum
	}
	return out, nil
}
