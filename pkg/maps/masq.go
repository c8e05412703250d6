package maps

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
)

// Go twins of the masquerade structs in bpf/lib/types.h, generated from BTF.
type (
	CIDRKey      = mapsObjCidrKey
	SNATKey      = mapsObjSnatKey
	SNATVal      = mapsObjSnatVal
	MasqStat     = mapsObjMasqStat
	MasqConfig   = mapsObjMasqConfig
	MasqShareKey = mapsObjMasqShareKey
)

// Names of the masquerade maps, as bpf/lib/maps.h declares them.
const (
	nameSNAT         = "cni_snat"
	nameClusterCIDRs = "cni_cluster_cidrs"
	nameMasqStats    = "cni_masq_stats"
	nameMasqConfig   = "cni_masq_config"
	nameMasqShare    = "cni_masq_share"
)

const (
	// EndpointFlagMasq is EP_F_MASQ in ep_info.flags: the pod's traffic to
	// destinations outside the cluster CIDRs is masqueraded.
	EndpointFlagMasq = 1 << 3
	snatDirFwd       = 0 // SNAT_DIR_FWD
	snatDirRev       = 1 // SNAT_DIR_REV
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

// Who put an entry into cni_cluster_cidrs: its value (the datapath reads
// only the key).
const (
	// ClusterCIDRByConfig: an ADD with ipMasq (its clusterCIDRs, or the
	// pod's subnets). Never removed: other pods of the network rely on it.
	ClusterCIDRByConfig uint32 = 1
	// ClusterCIDRByAgent: the agent (--cluster-cidrs, or every Node's pod
	// CIDRs), which removes its own entries when they are no longer wanted.
	ClusterCIDRByAgent uint32 = 2
)

// AddClusterCIDRs adds prefixes to cni_cluster_cidrs (idempotent), as
// configuration: destinations inside them are never masqueraded.
func (m *Maps) AddClusterCIDRs(prefixes []netip.Prefix) error {
	for _, p := range prefixes {
		k := cidrKey(p)
		v := ClusterCIDRByConfig
		if err := m.byName[nameClusterCIDRs].Put(&k, &v); err != nil {
			return writeErr(m.byName[nameClusterCIDRs], nameClusterCIDRs, p.String(), err)
		}
	}
	return nil
}

// SyncAgentClusterCIDRs makes the agent's entries of cni_cluster_cidrs
// exactly want: it adds what is missing (an entry the configuration put
// there already stays the configuration's) and removes its own entries
// not in want, never one the configuration put there.
func (m *Maps) SyncAgentClusterCIDRs(want []netip.Prefix) (added, removed []netip.Prefix, err error) {
	cc := m.byName[nameClusterCIDRs]
	wanted := map[netip.Prefix]bool{}
	for _, p := range want {
		p = p.Masked()
		if wanted[p] {
			continue
		}
		wanted[p] = true
		k, v := cidrKey(p), ClusterCIDRByAgent
		switch err := cc.Update(&k, &v, ebpf.UpdateNoExist); {
		case err == nil:
			added = append(added, p)
		case !errors.Is(err, ebpf.ErrKeyExist):
			return added, removed, writeErr(cc, nameClusterCIDRs, p.String(), err)
		}
	}
	have, err := m.clusterCIDRs()
	if err != nil {
		return added, removed, err
	}
	for p, owner := range have {
		if owner != ClusterCIDRByAgent || wanted[p] {
			continue
		}
		k := cidrKey(p)
		if err := cc.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return added, removed, fmt.Errorf("map %s: remove %s: %w", nameClusterCIDRs, p, err)
		}
		removed = append(removed, p)
	}
	return added, removed, nil
}

// DeleteClusterCIDR removes one prefix (tools and tests).
func (m *Maps) DeleteClusterCIDR(p netip.Prefix) error {
	k := cidrKey(p)
	return m.byName[nameClusterCIDRs].Delete(&k)
}

// ClusterCIDRs lists cni_cluster_cidrs.
func (m *Maps) ClusterCIDRs() ([]netip.Prefix, error) {
	have, err := m.clusterCIDRs()
	out := make([]netip.Prefix, 0, len(have))
	for p := range have {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, err
}

// ClusterCIDROwners is cni_cluster_cidrs with who put each entry there
// (ClusterCIDRByConfig, ClusterCIDRByAgent).
func (m *Maps) ClusterCIDROwners() (map[netip.Prefix]uint32, error) { return m.clusterCIDRs() }

func (m *Maps) clusterCIDRs() (map[netip.Prefix]uint32, error) {
	var (
		out = map[netip.Prefix]uint32{}
		k   CIDRKey
		v   uint32
	)
	it := m.byName[nameClusterCIDRs].Iterate()
	for it.Next(&k, &v) {
		var a netip.Addr
		if k.Family == afInet {
			a = netip.AddrFrom4([4]byte(k.Addr[:4]))
		} else {
			a = netip.AddrFrom16(k.Addr)
		}
		out[netip.PrefixFrom(a, int(k.Prefixlen)-32)] = v
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

// ListSNAT returns the masqueraded flows (forward entries, plus reverse
// entries without one).
func (m *Maps) ListSNAT() ([]SNATFlow, error) {
	now := monotonicNow()
	type ent struct {
		k SNATKey
		v SNATVal
	}
	var all []ent
	err := scan(m.byName[nameSNAT], func(k *SNATKey, v *SNATVal) { all = append(all, ent{*k, *v}) })
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
			Node: addrPort(e.v.Addr, e.k.Family, e.v.Port), Ifindex: int(e.v.Ifindex), Age: age(e.v.CreatedNs), Idle: age(e.v.SeenNs),
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
		if !fwd[[3]netip.AddrPort{f.Node, f.Peer, f.Pod}] {
			out = append(out, f)
		}
	}
	return out, nil
}

// CountSNATOfIP counts cni_snat entries (both directions) of a pod address.
func (m *Maps) CountSNATOfIP(ip net.IP) (int, error) {
	want := [16]uint8{}
	putAddr(&want, ip)
	n := 0
	err := scan(m.byName[nameSNAT], func(k *SNATKey, v *SNATVal) {
		if (k.Dir == snatDirFwd && k.Addr == want) || (k.Dir == snatDirRev && v.Addr == want) {
			n++
		}
	})
	return n, err
}

// DeleteSNATOf removes every cni_snat entry (both directions) made for the
// pod behind the host veth ifindex, and its port counts in cni_masq_share,
// and returns how many flow entries. A scan, as DeleteCTOf: the cost grows
// with the node's masqueraded flows, and the programs never use an entry
// whose ifindex is not the pod's anyway.
func (m *Maps) DeleteSNATOf(ifindex int) (int, error) {
	var keys []SNATKey
	err := scan(m.byName[nameSNAT], func(k *SNATKey, v *SNATVal) {
		if int(v.Ifindex) == ifindex {
			keys = append(keys, *k)
		}
	})
	if err != nil {
		return 0, fmt.Errorf("scan %s: %w", nameSNAT, err)
	}
	if err := deleteKeys(m.byName[nameSNAT], keys); err != nil {
		return 0, fmt.Errorf("delete from %s: %w", nameSNAT, err)
	}
	var shares []MasqShareKey
	err = scan(m.byName[nameMasqShare], func(k *MasqShareKey, v *uint32) {
		if int(k.Ifindex) == ifindex {
			shares = append(shares, *k)
		}
	})
	if err != nil {
		return len(keys), fmt.Errorf("scan %s: %w", nameMasqShare, err)
	}
	return len(keys), deleteKeys(m.byName[nameMasqShare], shares)
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

// MasqConfig reads cni_masq_config; a node never configured has no ranges
// (the programs then use 61000-65535 without a pod limit).
func (m *Maps) MasqConfig() (MasqPorts, error) {
	var c MasqConfig
	zero := uint32(0)
	if err := m.byName[nameMasqConfig].Lookup(&zero, &c); err != nil {
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

// SetMasqConfig writes cni_masq_config when it differs from p.
func (m *Maps) SetMasqConfig(p MasqPorts) error {
	want, err := p.value()
	if err != nil {
		return err
	}
	var cur MasqConfig
	zero := uint32(0)
	mp := m.byName[nameMasqConfig]
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

// ListMasqShares returns the non-zero counts of cni_masq_share.
func (m *Maps) ListMasqShares() ([]MasqShare, error) {
	var out []MasqShare
	err := scan(m.byName[nameMasqShare], func(k *MasqShareKey, v *uint32) {
		if n := int32(*v); n > 0 {
			out = append(out, MasqShare{Proto: k.Proto, Destination: addrPort(k.PeerAddr, k.Family, k.PeerPort), Ifindex: int(k.Ifindex), Ports: int(n)})
		}
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", nameMasqShare, err)
	}
	return out, nil
}

// MasqStats returns the masquerade counters, summed over CPUs.
func (m *Maps) MasqStats() (map[string]uint64, error) {
	out := make(map[string]uint64)
	for i := 0; i < int(mapsObjMasqStatMASQ_STAT_MAX); i++ {
		k := uint32(i)
		var per []uint64
		if err := m.byName[nameMasqStats].Lookup(&k, &per); err != nil {
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
