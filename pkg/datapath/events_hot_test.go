package datapath

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// The flow events' hot slots (cni_ev_hot, lib/events.h ev_flow): each CPU
// remembers the flows it found in cni_ev_flows lately, and their packets
// skip the table. A slot may only ever save work, never an event: these
// tests send what would be wrong if a slot hid a flow's start, end or
// restart, or matched a flow it does not hold.

const finAck = 0x11

// flowKinds counts the events by kind.
func flowKinds(evs []maps.Event) map[maps.EventType]int {
	out := map[maps.EventType]int{}
	for _, e := range evs {
		out[e.Kind()]++
	}
	return out
}

// TestFlowEventsHotSlotsManyFlows: 40 IPv4 and 40 IPv6 flows, more than a
// CPU has slots (16), their packets interleaved so that flows share slots
// and evict each other: each flow starts once, ends once at its FIN
// (though its slot holds it as open), and starts again at a SYN.
func TestFlowEventsHotSlotsManyFlows(t *testing.T) {
	dp := testDatapath(t)
	r := eventReader(t, dp)
	must(t, dp.Maps.Events().SetSettings(maps.EventSettings{Drops: true, Flows: maps.FlowsNode, Rate: 1e6, Burst: 1e6}))
	other, other6 := net.ParseIP("192.0.2.9").To4(), net.ParseIP("fd00:77::9")
	const n = 40
	send := func(flags byte) {
		for i := 0; i < n; i++ {
			for _, p := range [][2]net.IP{{podIP, other}, {podIP6, other6}} {
				frame := packet(podMAC, protoTCP, p[0], p[1], uint16(41000+i), 80, flags)
				if ret, _ := run(t, dp.FromContainer, frame); ret != actOK {
					t.Fatalf("verdict %d", ret)
				}
			}
		}
	}
	for _, step := range []struct {
		name  string
		flags byte
		want  map[maps.EventType]int
	}{
		{"first packets", ackFlag, map[maps.EventType]int{maps.EventFlowStart: 2 * n}},
		{"again", ackFlag, map[maps.EventType]int{}},
		{"and again", ackFlag, map[maps.EventType]int{}},
		{"FIN", finAck, map[maps.EventType]int{maps.EventFlowEnd: 2 * n}},
		{"ACK after FIN", ackFlag, map[maps.EventType]int{}},
		{"SYN", synFlag, map[maps.EventType]int{maps.EventFlowStart: 2 * n}},
		{"ACK after SYN", ackFlag, map[maps.EventType]int{}},
	} {
		send(step.flags)
		got := flowKinds(drain(t, r))
		if fmt.Sprint(got) != fmt.Sprint(step.want) {
			t.Errorf("%s: events %v, want %v", step.name, got, step.want)
		}
	}
}

// TestFlowEventsHotSlotWindow: a flow the agent's sweep removed behind the
// CPUs' backs (here at once: EndIdleFlows(0); the agent waits 30 s) is
// announced again at its first packet after the slot's window (100 jiffies,
// at most 1 s), not left unannounced.
func TestFlowEventsHotSlotWindow(t *testing.T) {
	dp := testDatapath(t)
	r := eventReader(t, dp)
	must(t, dp.Maps.Events().SetSettings(maps.EventSettings{Flows: maps.FlowsNode, Rate: 1e6, Burst: 1e6}))
	frame := packet(podMAC, protoUDP, podIP, net.ParseIP("192.0.2.9"), 5353, 53, 0)
	for i := 0; i < 5; i++ {
		run(t, dp.FromContainer, frame)
	}
	if got := flowKinds(drain(t, r)); got[maps.EventFlowStart] != 1 || len(got) != 1 {
		t.Fatalf("events of 5 packets of one flow: %v, want one start", got)
	}
	ends, err := dp.Maps.Events().EndIdleFlows(0)
	must(t, err)
	if len(ends) != 1 {
		t.Fatalf("flows ended by the sweep: %+v", ends)
	}
	// Within the window a CPU that saw the flow may still take it as
	// known: at most one start (a run on another CPU looks it up).
	run(t, dp.FromContainer, frame)
	early := flowKinds(drain(t, r))[maps.EventFlowStart]
	if early > 1 {
		t.Fatalf("%d starts for one packet", early)
	}
	time.Sleep(1100 * time.Millisecond)
	run(t, dp.FromContainer, frame)
	late := flowKinds(drain(t, r))[maps.EventFlowStart]
	if early+late != 1 {
		t.Errorf("starts after the sweep: %d at once, %d after the window; want the flow announced again exactly once", early, late)
	}
}

// TestFlowEventsHotSlotsPerPod: per pod, a slot must not let a flow of an
// endpoint that did not ask send, nor keep one that asked from sending.
// Both sides of a same-node redirect (the source's egress, the
// destination's ingress) are flows of their own endpoints.
func TestFlowEventsHotSlotsPerPod(t *testing.T) {
	dp := testDatapath(t)
	r := eventReader(t, dp)
	must(t, dp.Maps.Events().SetSettings(maps.EventSettings{Flows: maps.FlowsPods, Rate: 1e6, Burst: 1e6}))
	toPod := func(sport uint16, flags byte) []maps.Event {
		t.Helper()
		for i := 0; i < 3; i++ {
			if ret, _ := run(t, dp.FromContainer, packet(podMAC, protoTCP, podIP, dstIP, sport, 80, flags)); ret != actRedirect {
				t.Fatalf("verdict %d", ret)
			}
		}
		return drain(t, r)
	}
	type side struct {
		ifindex uint32
		dir     maps.Dir
	}
	sides := func(evs []maps.Event) map[side]int {
		out := map[side]int{}
		for _, e := range evs {
			if e.Kind() != maps.EventFlowStart {
				t.Errorf("event %s, want flow-start", e.Kind())
			}
			out[side{e.Ifindex, e.Direction()}]++
		}
		return out
	}
	src, dst := side{loIfindex, maps.DirEgress}, side{dstIfindex, maps.DirIngress}
	if got := sides(toPod(42000, ackFlag)); len(got) != 0 {
		t.Fatalf("events with no endpoint asking: %v", got)
	}
	// The destination asks: its side of the same flow starts now (its
	// slot was never filled: the source side was never tracked).
	must(t, dp.Maps.Events().SetFlows(dstIfindex, true))
	if got := sides(toPod(42000, ackFlag)); len(got) != 1 || got[dst] != 1 {
		t.Fatalf("events with the destination asking: %v, want one start on %v", got, dst)
	}
	must(t, dp.Maps.Events().SetFlows(loIfindex, true))
	if got := sides(toPod(42000, ackFlag)); len(got) != 1 || got[src] != 1 {
		t.Fatalf("events with both asking: %v, want one start on %v (the destination's is known)", got, src)
	}
	// The source stops asking: a new flow of it sends nothing on its side,
	// while the destination's side of it starts.
	must(t, dp.Maps.Events().SetFlows(loIfindex, false))
	if got := sides(toPod(42001, ackFlag)); len(got) != 1 || got[dst] != 1 {
		t.Fatalf("events of a new flow, the source not asking: %v, want one start on %v", got, dst)
	}
	// Its FIN and SYN are the destination's end and restart, never hidden
	// by the slot that holds the flow as open.
	evs := toPod(42001, finAck)
	if len(evs) != 1 || evs[0].Kind() != maps.EventFlowEnd || evs[0].Ifindex != dstIfindex {
		t.Fatalf("FIN: %+v, want one flow-end on %d", evs, dstIfindex)
	}
	if got := sides(toPod(42001, synFlag)); len(got) != 1 || got[dst] != 1 {
		t.Fatalf("SYN after FIN: %v, want one start on %v", got, dst)
	}
}
