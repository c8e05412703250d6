package endpoint

import (
	"fmt"
	"math"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// The ingress queue's sizes at the rates that matter: the frame floors at low
// rates, the time-based sizes above, nothing overflowing at 1 Tbit/s.
func TestPlanIngressQueue(t *testing.T) {
	const frame = 1514
	ms := func(rate uint64, d time.Duration) uint64 { return bytesIn(rate, d) }
	for _, c := range []struct {
		rate, burstBits uint64
		wantBurst       uint64 // class burst, bytes
		wantCapacity    uint64 // bytes
		wantMark        uint64 // bytes
	}{
		// 1 kbit/s: every size is its frame floor.
		{1e3, effectiveBurst(1e3, 0), 2 * frame, 4*frame + 2*frame, 2 * frame},
		// 10 Mbit/s: 1 ms is less than two frames.
		{10e6, effectiveBurst(10e6, containerdBurstBits), 2 * frame, ms(10e6, 10*time.Millisecond) + 2*frame, 2 * frame},
		// 100 Mbit/s, and a requested burst smaller than 1 ms: the request wins, above the floor.
		{100e6, 40000, 5000, ms(100e6, 10*time.Millisecond) + 5000, ms(100e6, 2*time.Millisecond)},
		{1e9, effectiveBurst(1e9, containerdBurstBits), ms(1e9, time.Millisecond), ms(1e9, 11*time.Millisecond), ms(1e9, 2*time.Millisecond)},
	} {
		t.Run(fmt.Sprint(c.rate), func(t *testing.T) {
			q, l := planIngressQueue(maps.Limit{RateBps: c.rate, BurstBits: c.burstBits}, frame)
			if uint64(q.burstBytes) != c.wantBurst {
				t.Errorf("class burst %d bytes, want %d", q.burstBytes, c.wantBurst)
			}
			ns := func(b uint64) uint64 { return uint64(float64(b) * 8 * 1e9 / float64(c.rate)) }
			if l.QueueNs != ns(c.wantCapacity) || l.MarkNs != ns(c.wantMark) {
				t.Errorf("queue %d ns, mark %d ns; want %d and %d", l.QueueNs, l.MarkNs, ns(c.wantCapacity), ns(c.wantMark))
			}
			if l.RateBps != c.rate || l.BurstBits != c.burstBits {
				t.Errorf("rate or burst changed: %+v", l)
			}
			if uint64(q.limitBytes) != c.wantCapacity+64<<10 {
				t.Errorf("bfifo limit %d, want the capacity and a GSO packet, %d", q.limitBytes, c.wantCapacity+64<<10)
			}
			if l.MarkNs >= l.QueueNs {
				t.Errorf("marks start at %d ns, not below the capacity %d ns", l.MarkNs, l.QueueNs)
			}
		})
	}
	// 1 Tbit/s (the most a limit may be): the byte sizes do not wrap.
	q, l := planIngressQueue(maps.Limit{RateBps: 1e12, BurstBits: effectiveBurst(1e12, containerdBurstBits)}, frame)
	if q.limitBytes != uint32(bytesIn(1e12, 11*time.Millisecond)+64<<10) || q.burstBytes != uint32(bytesIn(1e12, time.Millisecond)) || l.QueueNs != uint64(11*time.Millisecond) {
		t.Errorf("1 Tbit/s: %+v %+v", q, l)
	}
	// Beyond 32 bits the limit saturates.
	if q, _ := planIngressQueue(maps.Limit{RateBps: 4e12, BurstBits: 1 << 40}, frame); q.limitBytes != math.MaxUint32 {
		t.Errorf("4 Tbit/s: bfifo limit %d, want %d", q.limitBytes, uint32(math.MaxUint32))
	}
}

const containerdBurstBits = 4294967295

func TestPodRcvWnd(t *testing.T) {
	for _, c := range []struct {
		rate uint64
		mtu  int
		want uint64
	}{
		{1e3, 1500, 3000}, {10e6, 1500, 3000}, {20e6, 1500, 5000}, {1e9, 1500, 250000}, {10e6, 9000, 18000}, {2e13, 1500, math.MaxInt32},
	} {
		if got := podRcvWnd(c.rate, c.mtu); uint64(got) != c.want {
			t.Errorf("podRcvWnd(%d, %d) = %d, want %d", c.rate, c.mtu, got, c.want)
		}
	}
}

// A kernel without the qdisc kinds is told from other failures.
func TestQueueUnsupported(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{unix.ENOENT, true}, {fmt.Errorf("add: %w", unix.EOPNOTSUPP), true},
		{unix.EPERM, false}, {unix.EEXIST, false}, {unix.ENOMEM, false},
	} {
		if got := queueUnsupported(c.err); got != c.want {
			t.Errorf("queueUnsupported(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// The class rate never has a legacy 32-bit rate of 0 (the kernel refuses the
// class): exact multiples of 2^32 bytes/s move by one byte/s, others stay.
func TestHTBRate(t *testing.T) {
	for _, c := range []struct{ in, want uint64 }{
		{1e3, 1e3}, {1e9, 1e9}, {1e12, 1e12},
		{8 << 32, 8<<32 + 8}, {16 << 32, 16<<32 + 8}, {8<<32 + 8, 8<<32 + 8},
	} {
		if got := htbRate(c.in); got != c.want || uint32(got/8) == 0 {
			t.Errorf("htbRate(%d) = %d, want %d", c.in, got, c.want)
		}
	}
}
