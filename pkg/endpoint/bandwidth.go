package endpoint

import (
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

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
// a token bucket per direction of the host veth, and TCP pacing by the
// node's sock_ops hook.
type bandwidth struct {
	conf   *BandwidthConf
	limits limits // set by Validate
}

func (b *bandwidth) Validate() (err error) {
	b.limits, err = parseBandwidth(b.conf)
	return err
}

// Install puts the buckets before the endpoint entries whose flags point
// at them, and the pacing hook on the node with the first limit.
func (b *bandwidth) Install(a *Attachment) error {
	l := b.limits
	if l.egress == nil && l.ingress == nil {
		return nil
	}
	idx, m := a.Ifindex, a.DP.Maps
	a.OnUndo(func() error { return m.DeleteLimits(idx) })
	if err := l.install(m, idx); err != nil {
		return mapError(err)
	}
	a.Flags |= l.endpointFlags()
	if l.egress != nil {
		a.EgressRateBps = l.egress.RateBps
	}
	if err := a.DP.EnsurePacing(a.Net.CgroupRoot); err != nil {
		return internal("bandwidth: %v", err)
	}
	a.Trace.Mark("bandwidth")
	return nil
}

func (b *bandwidth) Check(a *Attachment) error {
	if err := b.limits.check(a.DP.Maps, a.Ifindex, a.HostIf); err != nil {
		return checkError("%v", err)
	}
	return nil
}

// Teardown drops the buckets of the host veth, limited or not.
func (b *bandwidth) Teardown(t *Teardown) {
	t.WithVeth(func() error { return t.DP.Maps.DeleteLimits(t.Ifindex) })
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

// install writes the buckets of a host veth.
func (l limits) install(m *maps.Maps, ifindex int) error {
	if l.egress != nil {
		if err := m.PutLimit(ifindex, maps.DirEgress, *l.egress); err != nil {
			return err
		}
	}
	if l.ingress != nil {
		if err := m.PutLimit(ifindex, maps.DirIngress, *l.ingress); err != nil {
			return err
		}
	}
	return nil
}

// check compares the buckets in the map with the configured limits.
func (l limits) check(m *maps.Maps, ifindex int, hostIf string) error {
	for _, d := range []struct {
		dir  maps.Dir
		want *maps.Limit
	}{{maps.DirEgress, l.egress}, {maps.DirIngress, l.ingress}} {
		got, ok, err := m.LookupLimit(ifindex, d.dir)
		if err != nil {
			return err
		}
		switch {
		case d.want == nil && ok:
			return fmt.Errorf("map cni_bandwidth limits %s %s to %d bit/s, but no %s limit is configured", hostIf, d.dir, got.RateBps, d.dir)
		case d.want != nil && !ok:
			return fmt.Errorf("map cni_bandwidth has no %s limit for %s (want %d bit/s)", d.dir, hostIf, d.want.RateBps)
		case d.want != nil && got != *d.want:
			return fmt.Errorf("map cni_bandwidth limits %s %s to %d bit/s burst %d bits, want %d bit/s burst %d bits",
				hostIf, d.dir, got.RateBps, got.BurstBits, d.want.RateBps, d.want.BurstBits)
		}
	}
	return nil
}
