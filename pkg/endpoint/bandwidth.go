package endpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// ethHeaderLen is what a frame adds to the MTU.
const ethHeaderLen = 14

// BandwidthConf is the bandwidth capability, in bits per second and bits, as
// the reference bandwidth plugin defines it (ingress = into the pod). Kept
// as raw JSON so that decoding never fails (DEL must clean up whatever it is
// given) and validation names a bad field exactly: a string, even "1000", is
// not a number (the reference plugin refuses it too).
type BandwidthConf struct {
	IngressRate  json.RawMessage `json:"ingressRate,omitempty"`
	IngressBurst json.RawMessage `json:"ingressBurst,omitempty"`
	EgressRate   json.RawMessage `json:"egressRate,omitempty"`
	EgressBurst  json.RawMessage `json:"egressBurst,omitempty"`
}

// bandwidth is the Feature of per-pod rate limits (bpf/lib/bandwidth.h):
// a token bucket per direction of the host veth, TCP pacing by the node's
// sock_ops hook, and for an ingress limit a queue on the host veth with the
// pod's receive window clamped (bandwidth_queue.go).
type bandwidth struct {
	conf   *BandwidthConf
	limits limits // set by Validate
}

func (b *bandwidth) Validate() (err error) {
	b.limits, err = parseBandwidth(b.conf)
	return err
}

// Install puts the ingress queue on the host veth, the buckets before the
// endpoint entries whose flags point at them, and the pacing hook on the
// node with the first limit. The veth's deletion removes the queue.
func (b *bandwidth) Install(a *Attachment) error {
	l := b.limits
	if l.egress == nil && l.ingress == nil {
		return nil
	}
	idx, m := a.Ifindex, a.DP.Maps
	if err := l.queueIngress(a.hostLink); err != nil {
		return netlinkError(err)
	}
	a.OnUndo(func() error { return m.Bandwidth().DeleteLimits(idx) })
	if err := l.install(m, idx); err != nil {
		return mapError(err)
	}
	a.Flags |= l.endpointFlags()
	if l.egress != nil {
		a.EgressRateBps = l.egress.RateBps
	}
	a.RcvWnd = l.rcvWnd(a.hostLink.Attrs().MTU)
	if err := a.DP.EnsurePacing(a.Net.CgroupRoot); err != nil {
		return internal("bandwidth: %w", err)
	}
	a.Trace.Mark("bandwidth")
	return nil
}

func (b *bandwidth) Check(a *Attachment) error {
	l := b.limits
	host, err := netlink.LinkByIndex(a.Ifindex)
	if err != nil {
		return checkError("host veth %s: %w", a.HostIf, err)
	}
	if err := l.checkQueue(a.DP.Maps, host); err != nil {
		return checkError("%w", err)
	}
	if err := l.check(a.DP.Maps, a.Ifindex, a.HostIf); err != nil {
		return checkError("%w", err)
	}
	return nil
}

// Teardown drops the buckets of the host veth, limited or not.
func (b *bandwidth) Teardown(t *Teardown) {
	t.WithVeth(func() error { return t.DP.Maps.Bandwidth().DeleteLimits(t.Ifindex) })
}

// Burst policy. Runtimes pass absurd bursts (containerd 1.6 sends 4294967295
// bits whatever the rate), which would let a 10 Mbit/s pod send at line rate
// for minutes. The bucket is therefore never deeper than BurstCap worth of
// traffic at the configured rate; a smaller requested burst is honoured, and
// no burst means the cap. With the cap at 50 ms, any 1 s interval carries at
// most the rate plus 5% plus one packet.
const BurstCap = 50 * time.Millisecond

// Rates the fixed-point arithmetic of the datapath handles exactly.
const (
	minRateBps = 1_000             // 1 kbit/s
	maxRateBps = 1_000_000_000_000 // 1 Tbit/s
)

// limits is what a pod's bandwidth capability resolves to.
type limits struct {
	ingress, egress *maps.Limit // nil: unlimited
}

// parseBandwidth validates runtimeConfig.bandwidth and applies the burst policy.
func parseBandwidth(b *BandwidthConf) (limits, error) {
	var out limits
	if b == nil {
		return out, nil
	}
	var err error
	if out.ingress, err = parseLimit("ingress", b.IngressRate, b.IngressBurst); err != nil {
		return out, err
	}
	if out.egress, err = parseLimit("egress", b.EgressRate, b.EgressBurst); err != nil {
		return out, err
	}
	return out, nil
}

func parseBits(field string, raw json.RawMessage) (uint64, error) {
	n := strings.TrimSpace(string(raw))
	switch {
	case n == "" || n == "null":
		return 0, nil
	case n[0] == '"':
		return 0, ConfError("runtimeConfig.bandwidth.%s: %s is a JSON string; give a number", field, n)
	}
	v, ok := new(big.Int).SetString(n, 10)
	if !ok {
		return 0, ConfError("runtimeConfig.bandwidth.%s: %s is not a whole number", field, n)
	}
	if v.Sign() < 0 {
		return 0, ConfError("runtimeConfig.bandwidth.%s: %s is negative", field, n)
	}
	if !v.IsUint64() {
		return 0, ConfError("runtimeConfig.bandwidth.%s: %s does not fit in 64 bits", field, n)
	}
	return v.Uint64(), nil
}

func parseLimit(dir string, rateN, burstN json.RawMessage) (*maps.Limit, error) {
	rate, err := parseBits(dir+"Rate", rateN)
	if err != nil {
		return nil, err
	}
	burst, err := parseBits(dir+"Burst", burstN)
	if err != nil {
		return nil, err
	}
	switch {
	case rate == 0 && burst == 0:
		return nil, nil
	case rate == 0:
		return nil, ConfError("runtimeConfig.bandwidth.%sBurst: %d given without %sRate", dir, burst, dir)
	case rate < minRateBps:
		return nil, ConfError("runtimeConfig.bandwidth.%sRate: %d bit/s is below the minimum of %d", dir, rate, minRateBps)
	case rate > maxRateBps:
		return nil, ConfError("runtimeConfig.bandwidth.%sRate: %d bit/s is above the maximum of %d (1 Tbit/s)", dir, rate, maxRateBps)
	}
	return &maps.Limit{RateBps: rate, BurstBits: effectiveBurst(rate, burst)}, nil
}

// effectiveBurst applies BurstCap: min(requested, rate x BurstCap); 0 means the cap.
func effectiveBurst(rateBps, requested uint64) uint64 {
	capBits := rateBps / uint64(time.Second/BurstCap)
	if requested == 0 || requested > capBits {
		return capBits
	}
	return requested
}

// endpointFlags are the ep_info flags for a pod's limits.
func (l limits) endpointFlags() uint32 {
	var f uint32
	if l.egress != nil {
		f |= maps.FlagBandwidthEgress
	}
	if l.ingress != nil {
		f |= maps.FlagBandwidthIngress
	}
	return f
}

// queueIngress puts the ingress queue on the host veth and makes the ingress
// bucket the queue's (bandwidth_queue.go). A kernel without HTB keeps the
// bucket alone.
func (l *limits) queueIngress(host netlink.Link) error {
	if l.ingress == nil {
		return nil
	}
	q, queued := planIngressQueue(*l.ingress, host.Attrs().MTU+ethHeaderLen)
	switch err := installIngressQueue(host, q); {
	case errors.Is(err, errNoQueue):
		return nil
	case err != nil:
		return err
	}
	l.ingress = &queued
	return nil
}

// rcvWnd is the receive window clamp of the pod's TCP sockets; 0: none.
func (l limits) rcvWnd(mtu int) uint32 {
	if l.ingress == nil {
		return 0
	}
	return podRcvWnd(l.ingress.RateBps, mtu)
}

// install writes the buckets of a host veth.
func (l limits) install(m *maps.Maps, ifindex int) error {
	if l.egress != nil {
		if err := m.Bandwidth().PutLimit(ifindex, maps.DirEgress, *l.egress); err != nil {
			return err
		}
	}
	if l.ingress != nil {
		if err := m.Bandwidth().PutLimit(ifindex, maps.DirIngress, *l.ingress); err != nil {
			return err
		}
	}
	return nil
}

// checkQueue compares the ingress queue of the host veth with the limit and
// makes l expect the bucket of the queue the veth has.
func (l *limits) checkQueue(m *maps.Maps, host netlink.Link) error {
	var inMap *maps.Limit
	if got, ok, err := m.Bandwidth().LookupLimit(host.Attrs().Index, maps.DirIngress); err != nil {
		return err
	} else if ok {
		inMap = &got
	}
	name := host.Attrs().Name
	if l.ingress == nil {
		if root, err := readRootQdisc(host.Attrs().Index); err != nil {
			return fmt.Errorf("read the qdiscs of %s: %w", name, err)
		} else if root != nil && root.kind == "htb" && root.handle == queueHandle {
			return fmt.Errorf("host veth %s has an htb ingress queue, but no ingress limit is configured", name)
		}
		return nil
	}
	q, queued := planIngressQueue(*l.ingress, host.Attrs().MTU+ethHeaderLen)
	has, err := checkIngressQueue(host, q)
	if err != nil {
		return err
	}
	if has {
		l.ingress = &queued
	} else if inMap != nil && inMap.QueueNs != 0 {
		return fmt.Errorf("host veth %s has lost its ingress queue (htb %s): map cni_bandwidth still expects it", name, netlink.HandleStr(queueHandle))
	}
	return nil
}

// check compares the buckets in the map with the configured limits.
func (l limits) check(m *maps.Maps, ifindex int, hostIf string) error {
	for _, d := range []struct {
		dir  maps.Dir
		want *maps.Limit
	}{{maps.DirEgress, l.egress}, {maps.DirIngress, l.ingress}} {
		got, ok, err := m.Bandwidth().LookupLimit(ifindex, d.dir)
		if err != nil {
			return err
		}
		switch {
		case d.want == nil && ok:
			return fmt.Errorf("map cni_bandwidth limits %s %s to %d bit/s, but no %s limit is configured", hostIf, d.dir, got.RateBps, d.dir)
		case d.want != nil && !ok:
			return fmt.Errorf("map cni_bandwidth has no %s limit for %s (want %d bit/s)", d.dir, hostIf, d.want.RateBps)
		case d.want != nil && got != *d.want:
			return fmt.Errorf("map cni_bandwidth limits %s %s to %d bit/s burst %d bits queue %d ns mark %d ns, want %d bit/s burst %d bits queue %d ns mark %d ns",
				hostIf, d.dir, got.RateBps, got.BurstBits, got.QueueNs, got.MarkNs, d.want.RateBps, d.want.BurstBits, d.want.QueueNs, d.want.MarkNs)
		}
	}
	return nil
}
