package datapath

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Events of the programs run with BPF_PROG_TEST_RUN (the integration tests
// in test/integration/events_test.go provoke the same with real traffic).

func eventReader(t testing.TB, dp *Datapath) *ringbuf.Reader {
	t.Helper()
	r, err := ringbuf.NewReader(dp.Maps.Events().Ring())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// drain returns the events the ring holds now.
func drain(t testing.TB, r *ringbuf.Reader) []maps.Event {
	t.Helper()
	var out []maps.Event
	for {
		r.SetDeadline(time.Now().Add(20 * time.Millisecond))
		rec, err := r.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		e, err := maps.DecodeEvent(rec.RawSample)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
}

// TestEventPerDrop: every drop of from_container's verdict table sends
// exactly one EV_DROP with its reason, direction, interface and addresses;
// what it hands on sends none while flow events are off.
func TestEventPerDrop(t *testing.T) {
	dp := testDatapath(t)
	r := eventReader(t, dp)
	must(t, dp.Maps.Events().SetSettings(maps.EventSettings{Drops: true, Rate: 1e6, Burst: 1e6}))
	other := net.ParseIP("192.0.2.9")
	cases := []struct {
		name     string
		frame    []byte
		reason   maps.Reason
		src, dst string
	}{
		{"spoofed IPv4 source", append(eth(podMAC, 0x0800), ipv4(net.ParseIP("10.9.0.99"), other, 64)...), maps.ReasonDropSpoofIP, "10.9.0.99", "192.0.2.9"},
		{"group source MAC", append(eth(groupMAC, 0x0800), ipv4(podIP, other, 64)...), maps.ReasonDropSpoofMAC, "10.9.0.2", "192.0.2.9"},
		{"spoofed IPv6", append(eth(podMAC, 0x86dd), ipv6(net.ParseIP("fd00:9::99"), net.ParseIP("fd00:1::1"))...), maps.ReasonDropSpoofIP, "fd00:9::99", "fd00:1::1"},
		{"router advertisement", append(eth(podMAC, 0x86dd), icmp6(net.ParseIP("fe80::1"), nil, 134)...), maps.ReasonDropRouterMsg, "fe80::1", ""},
		{"ICMP redirect", append(eth(podMAC, 0x0800), icmp4(podIP, other, 5)...), maps.ReasonDropRouterMsg, "10.9.0.2", "192.0.2.9"},
		{"unknown ethertype", append(eth(podMAC, 0x88cc), make([]byte, 46)...), maps.ReasonDropProto, "", ""},
		{"truncated ARP", append(eth(podMAC, 0x0806), arp(podMAC, podIP)[:10]...), maps.ReasonDropMalform, "", ""},
		{"own IPv4 to the stack", append(eth(podMAC, 0x0800), ipv4(podIP, other, 64)...), maps.ReasonForward, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run(t, dp.FromContainer, c.frame)
			evs := drain(t, r)
			if c.reason == maps.ReasonForward {
				if len(evs) != 0 {
					t.Fatalf("%d events for a packet handed on with flow events off: %+v", len(evs), evs)
				}
				return
			}
			if len(evs) != 1 {
				t.Fatalf("%d events, want 1: %+v", len(evs), evs)
			}
			e := evs[0]
			if e.Kind() != maps.EventDrop || e.Why() != c.reason || e.Direction() != maps.DirEgress || e.Ifindex != loIfindex || e.Len != uint32(len(c.frame)) {
				t.Errorf("event %s %s %s if %d len %d, want drop %s egress if %d len %d", e.Kind(), e.Why(), e.Direction(), e.Ifindex, e.Len, c.reason, loIfindex, len(c.frame))
			}
			if c.src != "" && e.Src() != netip.MustParseAddr(c.src) {
				t.Errorf("source %s, want %s", e.Src(), c.src)
			}
			if c.dst != "" && e.Dst() != netip.MustParseAddr(c.dst) {
				t.Errorf("destination %s, want %s", e.Dst(), c.dst)
			}
		})
	}
	cs, err := dp.Maps.Events().Counters()
	must(t, err)
	if cs.Sent != 7 || cs.LostRate != 0 || cs.LostRing != 0 {
		t.Errorf("counters %+v, want 7 sent, none lost", cs)
	}
}

// TestEventRateLimit: a burst of drops over the bucket sends the burst and
// counts every other one as lost; none is silent.
func TestEventRateLimit(t *testing.T) {
	dp := testDatapath(t)
	r := eventReader(t, dp)
	must(t, dp.Maps.Events().SetSettings(maps.EventSettings{Drops: true, Rate: 1, Burst: 5}))
	frame := append(eth(podMAC, 0x0800), ipv4(net.ParseIP("10.9.0.99"), net.ParseIP("192.0.2.9"), 64)...)
	const n = 200
	for i := 0; i < n; i++ {
		run(t, dp.FromContainer, frame)
	}
	evs := drain(t, r)
	cs, err := dp.Maps.Events().Counters()
	must(t, err)
	// Test runs may move between CPUs: each has its own bucket of 5.
	if len(evs) < 5 || uint64(len(evs)) != cs.Sent || cs.Sent+cs.LostRate != n || cs.LostRing != 0 {
		t.Errorf("%d events read, counters %+v; want at least the burst of 5, sent+lost = %d", len(evs), cs, n)
	}
}

// TestFlowEvents: with flow events on, a flow's first packet sends
// EV_FLOW_START once, its FIN EV_FLOW_END once, a new SYN starts it again;
// per pod, only an endpoint in cni_ev_pods sends them.
func TestFlowEvents(t *testing.T) {
	dp := testDatapath(t)
	r := eventReader(t, dp)
	must(t, dp.Maps.Events().SetSettings(maps.EventSettings{Drops: true, Flows: maps.FlowsNode, Rate: 1e6, Burst: 1e6}))
	other := net.ParseIP("192.0.2.9")
	step := func(flags byte, want ...maps.EventType) {
		t.Helper()
		if ret, _ := run(t, dp.FromContainer, packet(podMAC, protoTCP, podIP, other, 40000, 80, flags)); ret != actOK {
			t.Fatalf("verdict %d", ret)
		}
		evs := drain(t, r)
		if len(evs) != len(want) {
			t.Fatalf("flags %#x: %d events %+v, want %v", flags, len(evs), evs, want)
		}
		for i, e := range evs {
			if e.Kind() != want[i] || e.Why() != maps.ReasonForward || e.SrcPort() != 40000 || e.DstPort() != 80 || e.Proto != protoTCP {
				t.Errorf("event %s %s %d->%d proto %d, want %s forward 40000->80 tcp", e.Kind(), e.Why(), e.SrcPort(), e.DstPort(), e.Proto, want[i])
			}
		}
	}
	step(synFlag, maps.EventFlowStart)
	step(ackFlag)
	step(ackFlag)
	step(0x11, maps.EventFlowEnd) // FIN ACK
	step(ackFlag)                 // the last ACK: still closed
	step(synFlag, maps.EventFlowStart)

	// Per pod: lo's endpoint off, then on.
	must(t, dp.Maps.Events().SetSettings(maps.EventSettings{Flows: maps.FlowsPods, Rate: 1e6, Burst: 1e6}))
	if ret, _ := run(t, dp.FromContainer, packet(podMAC, protoUDP, podIP, other, 5000, 53, 0)); ret != actOK {
		t.Fatalf("verdict %d", ret)
	}
	if evs := drain(t, r); len(evs) != 0 {
		t.Fatalf("flow events of an endpoint not asked for: %+v", evs)
	}
	must(t, dp.Maps.Events().SetFlows(loIfindex, true))
	run(t, dp.FromContainer, packet(podMAC, protoUDP, podIP, other, 5001, 53, 0))
	if evs := drain(t, r); len(evs) != 1 || evs[0].Kind() != maps.EventFlowStart {
		t.Fatalf("events of the pod asked for: %+v", evs)
	}
	// Idle flows end through the agent's sweep.
	ends, err := dp.Maps.Events().EndIdleFlows(0)
	must(t, err)
	if len(ends) < 2 {
		t.Errorf("idle flows ended: %+v", ends)
	}
	must(t, dp.Maps.Events().SetFlows(loIfindex, false))
	if ids, _ := dp.Maps.Events().FlowEndpoints(); len(ids) != 0 {
		t.Errorf("endpoints with flow events after turning them off: %v", ids)
	}
}

// BenchmarkEventsCost times cni_from_container on the pod-to-pod fast path
// with events off, drop events on (nothing to send: the packet is handed
// on), and flow events on (first packet announced once; the others hit
// their CPU's hot slot): node-wide, for the one pod asking (per pod), and
// node-wide with 64 flows taking turns (more than a CPU's 16 slots: every
// packet misses its slot and looks the flow table up).
// go test -run - -bench EventsCost -benchtime 20000x ./pkg/datapath/
func BenchmarkEventsCost(b *testing.B) {
	for _, c := range []struct {
		name  string
		s     maps.EventSettings
		flows int
	}{
		{"off", maps.EventSettings{}, 1},
		{"drops", maps.EventSettings{Drops: true}, 1},
		{"flows", maps.EventSettings{Drops: true, Flows: maps.FlowsNode}, 1},
		{"flows-pod", maps.EventSettings{Drops: true, Flows: maps.FlowsPods}, 1},
		{"flows-64", maps.EventSettings{Drops: true, Flows: maps.FlowsNode}, 64},
	} {
		b.Run(c.name, func(b *testing.B) {
			dp := testDatapath(b)
			must(b, dp.Maps.Events().SetSettings(c.s))
			if c.s.Flows == maps.FlowsPods {
				must(b, dp.Maps.Events().SetFlows(loIfindex, true))
			}
			r, err := ringbuf.NewReader(dp.Maps.Events().Ring())
			must(b, err)
			defer r.Close()
			frames := make([][]byte, c.flows)
			for i := range frames {
				frames[i] = packet(podMAC, protoTCP, podIP, dstIP, uint16(40000+i), 80, ackFlag)
			}
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ret, d, err := dp.FromContainer.Benchmark(frames[i%c.flows], 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				if ret != actRedirect {
					b.Fatalf("verdict %d", ret)
				}
				total += d
			}
			b.StopTimer()
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/run")
		})
	}
}

// TestEventRingFull: with nobody reading, the ring fills; every further
// event is counted as lost_ring, and sent + lost is every drop.
func TestEventRingFull(t *testing.T) {
	dp := testDatapath(t)
	must(t, dp.Maps.Events().SetSettings(maps.EventSettings{Drops: true, Rate: 1e9, Burst: 1e6}))
	frame := append(eth(podMAC, 0x0800), ipv4(net.ParseIP("10.9.0.99"), net.ParseIP("192.0.2.9"), 64)...)
	const n = 5000 // the 256 KiB ring holds about 3600
	for i := 0; i < n; i++ {
		run(t, dp.FromContainer, frame)
	}
	cs, err := dp.Maps.Events().Counters()
	must(t, err)
	if cs.LostRing == 0 || cs.Sent+cs.LostRing+cs.LostRate != n || cs.Sent < 3000 {
		t.Errorf("counters %+v after %d drops into an unread ring: want it full (about 3600 sent), the rest lost_ring", cs, n)
	}
	r := eventReader(t, dp)
	if got := len(drain(t, r)); uint64(got) != cs.Sent {
		t.Errorf("%d events in the ring, %d counted sent", got, cs.Sent)
	}
}
