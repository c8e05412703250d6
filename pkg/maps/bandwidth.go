package maps

import (
	"errors"
	"fmt"
	"math"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Go twins of the bandwidth structs in bpf/lib/types.h.
type (
	BandwidthKey   = mapsObjBwKey
	BandwidthState = mapsObjBwState
)

var nameBandwidth = mapName(&specNames.CniBandwidth)

// Endpoint flags (ep_info.flags): which limits apply to the pod.
const (
	FlagBandwidthEgress  uint32 = 1 << 0
	FlagBandwidthIngress uint32 = 1 << 1
	// LinkFlagBandwidthKnown marks a cni_links entry whose
	// FlagBandwidthIngress says whether the pod has an ingress limit
	// (LI_F_BW_KNOWN): to_container looks up the others' buckets no more.
	LinkFlagBandwidthKnown uint32 = 1 << 31
)

// Limit is one direction's token bucket as configured.
type Limit struct {
	RateBps   uint64 // bits per second
	BurstBits uint64 // bucket depth, bits
	// QueueNs is the capacity of the ingress queue that drains the bucket,
	// in ns at the rate; 0: no queue. MarkNs is the backlog over which
	// packets entering it are marked CE if ECN-capable.
	QueueNs, MarkNs uint64
}

// bucket fills the map value for a limit, full, as of now.
func bucket(l Limit) (BandwidthState, error) {
	var s BandwidthState
	if l.RateBps == 0 {
		return s, errors.New("rate is zero")
	}
	bytesPerSec := float64(l.RateBps) / 8
	s.NsPerByte = uint64(math.Round(1e9 * 65536 / bytesPerSec))
	s.BurstNs = uint64(float64(l.BurstBits) * 1e9 / float64(l.RateBps))
	s.TokensNs = int64(s.BurstNs)
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return s, fmt.Errorf("read monotonic clock: %w", err)
	}
	s.LastNs = uint64(ts.Nano()) // bpf_ktime_get_ns() is CLOCK_MONOTONIC
	s.RateBps = l.RateBps
	s.BurstBits = l.BurstBits
	s.QueueNs = l.QueueNs
	s.MarkNs = l.MarkNs
	return s, nil
}

// Bandwidth is the bandwidth family of the maps: the token buckets of the
// pods' limits (cni_bandwidth) and the netns entries the pacing and the
// receive window read (cni_netns).
type Bandwidth struct{ m *Maps }

// Bandwidth returns the bandwidth family of m.
func (m *Maps) Bandwidth() Bandwidth { return Bandwidth{m} }

func (m *Maps) bandwidth() *ebpf.Map { return m.get(nameBandwidth) }

// PutLimit installs a full token bucket for one direction of a host veth.
func (b Bandwidth) PutLimit(ifindex int, dir Dir, l Limit) error {
	s, err := bucket(l)
	if err != nil {
		return err
	}
	k := BandwidthKey{Ifindex: uint32(ifindex), Dir: uint32(dir)}
	if err := b.m.bandwidth().Put(&k, &s); err != nil {
		return writeErr(b.m.bandwidth(), nameBandwidth, fmt.Sprintf("%s limit of ifindex %d", dir, ifindex), err)
	}
	return nil
}

// LookupLimit returns the configured limit of one direction; ok is false when
// the direction is unlimited.
func (b Bandwidth) LookupLimit(ifindex int, dir Dir) (l Limit, ok bool, err error) {
	var s BandwidthState
	k := BandwidthKey{Ifindex: uint32(ifindex), Dir: uint32(dir)}
	if err := b.m.bandwidth().Lookup(&k, &s); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return l, false, nil
		}
		return l, false, fmt.Errorf("read %s limit of ifindex %d: %w", dir, ifindex, err)
	}
	return Limit{RateBps: s.RateBps, BurstBits: s.BurstBits, QueueNs: s.QueueNs, MarkNs: s.MarkNs}, true, nil
}

// DeleteLimits removes both directions' buckets of a host veth; absent is fine.
func (b Bandwidth) DeleteLimits(ifindex int) error {
	var errs error
	for _, d := range []Dir{DirEgress, DirIngress} {
		k := BandwidthKey{Ifindex: uint32(ifindex), Dir: uint32(d)}
		if err := b.m.bandwidth().Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = errors.Join(errs, fmt.Errorf("delete %s limit of ifindex %d: %w", d, ifindex, err))
		}
	}
	return errs
}

// LimitEntry is one bucket as the dump shows it.
type LimitEntry struct {
	Ifindex uint32
	Dir     Dir
	Limit   Limit
	// TokensNs is the bucket's fill in ns of transmission at the rate, as of LastNs.
	TokensNs int64
}

// ListLimits returns every configured bucket.
func (b Bandwidth) ListLimits() ([]LimitEntry, error) {
	var (
		out []LimitEntry
		k   BandwidthKey
		s   BandwidthState
	)
	it := b.m.bandwidth().Iterate()
	for it.Next(&k, &s) {
		out = append(out, LimitEntry{Ifindex: k.Ifindex, Dir: Dir(k.Dir),
			Limit: Limit{RateBps: s.RateBps, BurstBits: s.BurstBits, QueueNs: s.QueueNs, MarkNs: s.MarkNs}, TokensNs: s.TokensNs})
	}
	return out, it.Err()
}

// NetnsInfo is the Go twin of struct netns_info.
type NetnsInfo = mapsObjNetnsInfo

var nameNetns = mapName(&specNames.CniNetns)

// FlagNetnsNode marks the node's own netns in cni_netns.
const FlagNetnsNode uint32 = 1 << 0

// PutNetns registers a netns (by cookie) as this node's: its pod's egress rate
// in bits per second (0: none), or FlagNetnsNode for the node itself.
func (b Bandwidth) PutNetns(cookie uint64, egressRateBps uint64, flags uint32) error {
	v := NetnsInfo{EgressRate: egressRateBps / 8, Flags: flags}
	if err := b.m.get(nameNetns).Put(&cookie, &v); err != nil {
		return writeErr(b.m.get(nameNetns), nameNetns, fmt.Sprintf("netns %d", cookie), err)
	}
	return nil
}

// EnsureNetns registers a pod's netns unless it is already (a pod with a
// second interface): the entry is the pod's, so a second interface only
// adds an egress rate or a receive window where the pod had none. rcvWnd is
// the receive window clamp in bytes of the pod's TCP sockets towards peers
// the node does not pace (0: none). created tells whether this call made the
// entry (an ADD that fails removes only what it made).
func (b Bandwidth) EnsureNetns(cookie uint64, egressRateBps uint64, rcvWnd uint32) (created bool, err error) {
	mp := b.m.get(nameNetns)
	for try := 0; ; try++ {
		var cur NetnsInfo
		err := mp.Lookup(&cookie, &cur)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			v := NetnsInfo{EgressRate: egressRateBps / 8, RcvWnd: rcvWnd}
			err = mp.Update(&cookie, &v, ebpf.UpdateNoExist)
			if err == nil {
				return true, nil
			}
			if errors.Is(err, ebpf.ErrKeyExist) && try < 3 {
				continue
			}
			return false, writeErr(mp, nameNetns, fmt.Sprintf("netns %d", cookie), err)
		}
		if err != nil {
			return false, fmt.Errorf("read netns %d from %s: %w", cookie, nameNetns, err)
		}
		changed := false
		if cur.EgressRate == 0 && egressRateBps != 0 {
			cur.EgressRate, changed = egressRateBps/8, true
		}
		if cur.RcvWnd == 0 && rcvWnd != 0 {
			cur.RcvWnd, changed = rcvWnd, true
		}
		if !changed {
			return false, nil
		}
		if err := mp.Update(&cookie, &cur, ebpf.UpdateExist); err != nil {
			return false, writeErr(mp, nameNetns, fmt.Sprintf("netns %d", cookie), err)
		}
		return false, nil
	}
}

// DeleteNetns forgets a netns; absent is fine.
func (b Bandwidth) DeleteNetns(cookie uint64) error {
	if err := b.m.get(nameNetns).Delete(&cookie); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete netns %d from %s: %w", cookie, nameNetns, err)
	}
	return nil
}

// ListNetns returns every registered netns by cookie.
func (b Bandwidth) ListNetns() (map[uint64]NetnsInfo, error) {
	out := make(map[uint64]NetnsInfo)
	var (
		k uint64
		v NetnsInfo
	)
	it := b.m.get(nameNetns).Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	return out, it.Err()
}
