package maps

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// HostPorts is the hostPort family of the maps (bpf/lib/hostport.h): the
// mappings (cni_hostports), the flows through them (cni_ct), the socket
// hooks' reverse entries (cni_sock_rnat) and the programs' counters.
type HostPorts struct{ m *Maps }

// HostPorts returns the HostPorts family of m.
func (m *Maps) HostPorts() HostPorts { return HostPorts{m} }

// Go twins of the hostPort structs in bpf/lib/types.h, generated from BTF.
type (
	HostPortKey  = mapsObjHostportKey
	HostPortVal  = mapsObjHostportVal
	CTKey        = mapsObjCtKey
	CTVal        = mapsObjCtVal
	SockRNATKey  = mapsObjSockRnatKey
	SockRNATVal  = mapsObjSockRnatVal
	HostPortStat = mapsObjHpStat
)

// Names of the hostPort maps, as bpf/lib/maps.h declares them.
var (
	nameHostPorts = mapName(&specNames.CniHostports)
	nameCT        = mapName(&specNames.CniCt)
	nameNodeIPs   = mapName(&specNames.CniNodeIps)
	nameHPConfig  = mapName(&specNames.CniHpConfig)
	nameSockRNAT  = mapName(&specNames.CniSockRnat)
	nameHPStats   = mapName(&specNames.CniHpStats)
	nameHPFrags   = mapName(&specNames.CniHpFrags) // optional within layout 5; read by no program of this build
	// The fragments' notes and counters, optional within layout 5: maps of
	// their own so cni_hp_frags and cni_hp_stats keep the shape pinned.
	nameHPFragNotes = mapName(&specNames.CniHpFragNotes)
	nameHPFragStats = mapName(&specNames.CniHpFragStats)
)

// Flag values shared with the C side (#defines there, so not in BTF).
const (
	// EndpointFlagHostPort is EP_F_HOSTPORT in ep_info.flags: the pod has
	// mappings, so from_container looks its replies up in cni_ct.
	EndpointFlagHostPort = 1 << 2
	ctFlagSNAT           = 1      // CT_F_SNAT
	ctFlagSeq            = 1 << 8 // CT_F_SEQ (bpf/lib/hostport.h): created_ns holds TCP sequence tracking
	hpConfigEnabled      = 1      // HP_CFG_ENABLED
	hpConfigFibNoSrc     = 2      // HP_CFG_FIB_NO_SRC
	hpConfigTunnel       = 4      // HP_CFG_TUNNEL
	hpConfigTunSelf      = 8      // HP_CFG_TUN_SELF
	hpConfigTunNoMAC     = 16     // HP_CFG_TUN_NO_MAC
	nodeIPUplinkSrc      = 0x80   // NODE_IP_UPLINK_SRC
)

// Protocols a mapping may use (IPPROTO_*).
const (
	ProtoTCP uint8 = unix.IPPROTO_TCP
	ProtoUDP uint8 = unix.IPPROTO_UDP
)

// ProtoName is "tcp" or "udp".
func ProtoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoICMP:
		return "icmp"
	case ProtoICMPv6:
		return "icmpv6"
	case 132:
		return "sctp"
	}
	return fmt.Sprintf("proto%d", p)
}

func (s HostPortStat) String() string {
	switch s {
	case mapsObjHpStatHP_STAT_DNAT_UPLINK:
		return "dnat_uplink"
	case mapsObjHpStatHP_STAT_DNAT_HAIRPIN:
		return "dnat_hairpin"
	case mapsObjHpStatHP_STAT_REPLY:
		return "reply"
	case mapsObjHpStatHP_STAT_SOCK:
		return "sock_rewrite"
	case mapsObjHpStatHP_STAT_CT_NEW:
		return "ct_new"
	case mapsObjHpStatHP_STAT_NO_FLOW:
		return "not_ours"
	case mapsObjHpStatHP_STAT_NO_ROUTE:
		return "drop_no_route"
	case mapsObjHpStatHP_STAT_ERROR:
		return "drop_error"
	case mapsObjHpStatHP_STAT_ICMP_ERR_IN:
		return "icmp_error_in"
	case mapsObjHpStatHP_STAT_ICMP_ERR_OUT:
		return "icmp_error_out"
	case mapsObjHpStatHP_STAT_EXPIRED:
		return "expired"
	}
	return fmt.Sprintf("stat%d", uint32(s))
}

const numHPStats = int(mapsObjHpStatHP_STAT_MAX)

// hpFragStatNames name cni_hp_frag_stats' counters (enum hp_frag_stat) in Stats.
var hpFragStatNames = map[mapsObjHpFragStat]string{
	mapsObjHpFragStatHP_FRAG_NOTED:   "frag_noted",
	mapsObjHpFragStatHP_FRAG_LATER:   "frag_later",
	mapsObjHpFragStatHP_FRAG_NO_NOTE: "frag_no_note",
}

// HostPort is one entry of cni_hostports, decoded.
type HostPort struct {
	// HostIP is the address the mapping listens on; nil means every node
	// address of Family (and, for the node's own sockets, 127.0.0.0/8 or ::1).
	HostIP   net.IP
	IPv6     bool
	Proto    uint8
	HostPort uint16
	PodIP    net.IP
	PodPort  uint16
	Ifindex  int // host veth of the pod
}

func (h HostPort) family() uint8 {
	if h.IPv6 {
		return afInet6
	}
	return afInet
}

// Key is the map key of the mapping.
func (h HostPort) Key() HostPortKey {
	k := HostPortKey{Family: h.family(), Proto: h.Proto, Port: htons(h.HostPort)}
	if h.HostIP != nil {
		putAddr(&k.Addr, h.HostIP)
	}
	return k
}

// Val is the map value of the mapping.
func (h HostPort) Val() HostPortVal {
	v := HostPortVal{PodPort: htons(h.PodPort), Ifindex: uint32(h.Ifindex)}
	putAddr(&v.PodAddr, h.PodIP)
	return v
}

// Listen names where the mapping listens: "10.0.0.1:80/tcp", "*:80/tcp", "[*]:80/udp".
func (h HostPort) Listen() string {
	host := "*"
	if h.HostIP != nil {
		host = h.HostIP.String()
	}
	if h.IPv6 {
		host = "[" + host + "]"
	}
	return fmt.Sprintf("%s:%d/%s", host, h.HostPort, ProtoName(h.Proto))
}

func decodeHostPort(k HostPortKey, v HostPortVal) HostPort {
	h := HostPort{
		IPv6: k.Family == afInet6, Proto: k.Proto, HostPort: ntohs(k.Port),
		PodIP: getAddr(v.PodAddr, k.Family), PodPort: ntohs(v.PodPort), Ifindex: int(v.Ifindex),
	}
	if k.Addr != ([16]uint8{}) {
		h.HostIP = getAddr(k.Addr, k.Family)
	}
	return h
}

// HostPortTakenError is returned by InsertHostPort when another pod holds the key.
type HostPortTakenError struct {
	Owner HostPort
}

func (e *HostPortTakenError) Error() string {
	return fmt.Sprintf("hostPort %s is already mapped to %s", e.Owner.Listen(),
		net.JoinHostPort(e.Owner.PodIP.String(), fmt.Sprint(e.Owner.PodPort)))
}

// Insert adds a mapping only if its key is free (BPF_NOEXIST, so of
// two concurrent ADDs exactly one wins). A taken key is a *HostPortTakenError.
func (hp HostPorts) Insert(h HostPort) error {
	mp := hp.m.get(nameHostPorts)
	k, v := h.Key(), h.Val()
	err := mp.Update(&k, &v, ebpf.UpdateNoExist)
	if err == nil {
		return nil
	}
	if errors.Is(err, ebpf.ErrKeyExist) {
		var cur HostPortVal
		if lerr := mp.Lookup(&k, &cur); lerr == nil {
			return &HostPortTakenError{Owner: decodeHostPort(k, cur)}
		}
		return &HostPortTakenError{Owner: h}
	}
	return writeErr(mp, nameHostPorts, "hostPort "+h.Listen(), err)
}

// Lookup returns the mapping stored under h's key; the error wraps
// ebpf.ErrKeyNotExist when there is none.
func (hp HostPorts) Lookup(h HostPort) (HostPort, error) {
	k := h.Key()
	var v HostPortVal
	if err := hp.m.get(nameHostPorts).Lookup(&k, &v); err != nil {
		return HostPort{}, err
	}
	return decodeHostPort(k, v), nil
}

// Delete removes h's key if it still leads to h's pod (same pod IP
// and host veth): another pod may own the key by now.
func (hp HostPorts) Delete(h HostPort) error {
	mp := hp.m.get(nameHostPorts)
	k := h.Key()
	var cur HostPortVal
	if err := mp.Lookup(&k, &cur); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("read hostPort %s: %w", h.Listen(), err)
	}
	want := h.Val()
	if cur.PodAddr != want.PodAddr || (h.Ifindex != 0 && cur.Ifindex != want.Ifindex) {
		return nil
	}
	if err := mp.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete hostPort %s from %s: %w", h.Listen(), nameHostPorts, err)
	}
	return nil
}

// List returns every mapping of the node.
func (hp HostPorts) List() ([]HostPort, error) {
	var out []HostPort
	err := scan(hp.m.get(nameHostPorts), func(k *HostPortKey, v *HostPortVal) {
		out = append(out, decodeHostPort(*k, *v))
	})
	return out, err
}

// Flow is one entry of cni_ct, decoded: a translated connection.
type Flow struct {
	Proto   uint8
	IPv6    bool
	Client  netip.AddrPort // who connected
	Dialled netip.AddrPort // what it connected to (node address or hostIP : hostPort)
	Pod     netip.AddrPort // where it went
	// Peer is whom the pod sees: the client, or (SNAT, a pod reaching its
	// own hostPort) the dialled address.
	Peer    netip.AddrPort
	SNAT    bool
	Ifindex int
	Age     time.Duration
	Idle    time.Duration // since the last packet (second granularity)
	// State is FlowState's name for it; the entry is deleted once idle
	// for FlowTimeout of that state.
	State string
	Flags uint32
}

func monotonicNow() uint64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
		return 0
	}
	return uint64(ts.Nano())
}

func decodeFlow(k CTKey, v CTVal, now uint64) Flow {
	f := Flow{
		Proto: k.Proto, IPv6: k.Family == afInet6,
		Client:  addrPort(v.ClientAddr, k.Family, v.ClientPort),
		Dialled: addrPort(v.OrigAddr, k.Family, v.OrigPort),
		Pod:     addrPort(k.PodAddr, k.Family, k.PodPort),
		Peer:    addrPort(k.PeerAddr, k.Family, k.PeerPort),
		SNAT:    v.Flags&ctFlagSNAT != 0,
		Ifindex: int(v.Ifindex),
		Age:     sinceNs(now, v.CreatedNs),
		Idle:    sinceNs(now, v.SeenNs),
		State:   FlowState(k.Proto, v.Flags),
		Flags:   v.Flags,
	}
	if k.Proto == ProtoTCP && v.Flags&ctFlagSeq != 0 {
		f.Age = 0 // unknown: created_ns holds sequence numbers
	}
	return f
}

// ListCT returns every translated flow the node remembers.
func (hp HostPorts) ListCT() ([]Flow, error) {
	now := monotonicNow()
	var out []Flow
	err := scan(hp.m.get(nameCT), func(k *CTKey, v *CTVal) {
		out = append(out, decodeFlow(*k, *v, now))
	})
	return out, err
}

// DeleteCTOf removes every cni_ct entry created for the pod behind the host
// veth ifindex, and returns how many. Entries are keyed by flow, so this
// scans the map: cost grows with the flows the node tracks (at most
// MAX_CT), never with the number of mappings. Each entry also carries the
// ifindex, and the programs ignore one whose ifindex is not the packet's,
// so a new pod given the same IP cannot use an entry this scan missed.
func (hp HostPorts) DeleteCTOf(ifindex int) (int, error) {
	var keys []CTKey
	err := scan(hp.m.get(nameCT), func(k *CTKey, v *CTVal) {
		if int(v.Ifindex) == ifindex {
			keys = append(keys, *k)
		}
	})
	if err != nil {
		return 0, fmt.Errorf("scan %s: %w", nameCT, err)
	}
	return len(keys), deleteKeys(hp.m.get(nameCT), keys)
}

// SockFlow is one entry of cni_sock_rnat: a node socket sent to a pod through a hostPort.
type SockFlow struct {
	Cookie  uint64
	Pod     netip.AddrPort // what the socket really talks to
	Dialled netip.AddrPort // what the process asked for
	IPv6    bool           // the socket's family (IPv4-mapped addresses count as IPv6)
	Ifindex int
}

// DeleteSockRNATOf removes the socket entries leading to the pod behind
// ifindex and returns them (their sockets may need closing).
func (hp HostPorts) DeleteSockRNATOf(ifindex int) ([]SockFlow, error) {
	var (
		keys []SockRNATKey
		out  []SockFlow
	)
	err := scan(hp.m.get(nameSockRNAT), func(k *SockRNATKey, v *SockRNATVal) {
		if int(v.Ifindex) == ifindex {
			keys = append(keys, *k)
			out = append(out, decodeSockFlow(*k, *v))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", nameSockRNAT, err)
	}
	return out, deleteKeys(hp.m.get(nameSockRNAT), keys)
}

func decodeSockFlow(k SockRNATKey, v SockRNATVal) SockFlow {
	return SockFlow{
		Cookie:  k.Cookie,
		Pod:     addrPort(k.Addr, k.Family, k.Port),
		Dialled: addrPort(v.Addr, k.Family, v.Port),
		IPv6:    k.Family == afInet6,
		Ifindex: int(v.Ifindex),
	}
}

// ListSockRNAT returns every socket entry.
func (hp HostPorts) ListSockRNAT() ([]SockFlow, error) {
	var out []SockFlow
	err := scan(hp.m.get(nameSockRNAT), func(k *SockRNATKey, v *SockRNATVal) {
		out = append(out, decodeSockFlow(*k, *v))
	})
	return out, err
}

// Stats returns the hostPort programs' counters, summed over CPUs.
func (hp HostPorts) Stats() (map[string]uint64, error) {
	out := make(map[string]uint64)
	for i := 0; i < numHPStats; i++ {
		k := uint32(i)
		var per []uint64
		if err := hp.m.get(nameHPStats).Lookup(&k, &per); err != nil {
			return nil, fmt.Errorf("read %s: %w", nameHPStats, err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[HostPortStat(i).String()] = sum
	}
	return out, hp.fragStats(out)
}

// fragStats adds cni_hp_frag_stats' counters to out (none where an older
// build of the layout pinned the maps without it).
func (hp HostPorts) fragStats(out map[string]uint64) error {
	m := hp.m.get(nameHPFragStats)
	if m == nil {
		return nil
	}
	for k, name := range hpFragStatNames {
		i := uint32(k)
		var per []uint64
		if err := m.Lookup(&i, &per); err != nil {
			return fmt.Errorf("read %s: %w", nameHPFragStats, err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[name] = sum
	}
	return nil
}

// Prune removes the mappings, flows and socket entries of pods
// whose host veth is gone (live says which ifindexes still exist), for GC
// after DELs that never came. It scans all three maps.
func (hp HostPorts) Prune(live func(ifindex int) bool) (int, error) {
	n := 0
	var hpKeys []HostPortKey
	err := scan(hp.m.get(nameHostPorts), func(k *HostPortKey, v *HostPortVal) {
		if !live(int(v.Ifindex)) {
			hpKeys = append(hpKeys, *k)
		}
	})
	if err == nil {
		err = deleteKeys(hp.m.get(nameHostPorts), hpKeys)
		n += len(hpKeys)
	}
	var ctKeys []CTKey
	if serr := scan(hp.m.get(nameCT), func(k *CTKey, v *CTVal) {
		if !live(int(v.Ifindex)) {
			ctKeys = append(ctKeys, *k)
		}
	}); serr != nil {
		return n, errors.Join(err, serr)
	}
	err = errors.Join(err, deleteKeys(hp.m.get(nameCT), ctKeys))
	n += len(ctKeys)
	var sKeys []SockRNATKey
	if serr := scan(hp.m.get(nameSockRNAT), func(k *SockRNATKey, v *SockRNATVal) {
		if !live(int(v.Ifindex)) {
			sKeys = append(sKeys, *k)
		}
	}); serr != nil {
		return n, errors.Join(err, serr)
	}
	err = errors.Join(err, deleteKeys(hp.m.get(nameSockRNAT), sKeys))
	return n + len(sKeys), err
}

// ExpireCT deletes the cni_ct entries idle past their state's timeout and
// returns how many. Each entry's own timer normally does this; under a
// burst of new flows the kernel can fail to allocate a timer (bpf_timer_init
// returns -ENOMEM; measured: most of 100000 short connections at ~6000/s on
// kernel 6.18), and such an entry would stay until the LRU pushes it out,
// taking quiet live flows with it. The datapath already treats these entries
// as absent; this frees their slots. An entry is re-read just before its
// delete and kept if a packet renewed it meanwhile.
func (hp HostPorts) ExpireCT() (int, error) {
	mp := hp.m.get(nameCT)
	now := monotonicNow()
	type stale struct {
		k    CTKey
		seen uint64
	}
	var cand []stale
	err := scan(mp, func(k *CTKey, v *CTVal) {
		if flowIdlePast(now, v.SeenNs, FlowTimeout(k.Proto, v.Flags)) {
			cand = append(cand, stale{*k, v.SeenNs})
		}
	})
	if err != nil {
		return 0, fmt.Errorf("scan %s: %w", nameCT, err)
	}
	n := 0
	for _, c := range cand {
		var v CTVal
		if err := mp.Lookup(&c.k, &v); err != nil || v.SeenNs != c.seen {
			continue // gone already, or renewed
		}
		if err := mp.Delete(&c.k); err == nil {
			n++
		}
	}
	return n, nil
}

// flowIdlePast is the programs' flow_expired: idle for longer than timeout.
func flowIdlePast(now, seen uint64, timeout time.Duration) bool {
	return now > seen && now-seen > uint64(timeout)
}
