package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Datapath events (bpf/lib/events.h): the ring buffer the host veth
// programs write, its configuration, the per-CPU token buckets and loss
// counters, and the flow table that tells a flow's first packet.
type (
	Event        = mapsObjCniEvent
	EventType    = mapsObjEvType
	EventConfig  = mapsObjEvConfig
	EventCPU     = mapsObjEvCpu
	EventFlowKey = mapsObjEvFlowKey
	EventFlowVal = mapsObjEvFlowVal
)

const (
	EventDrop      = mapsObjEvTypeEV_DROP
	EventFlowStart = mapsObjEvTypeEV_FLOW_START
	EventFlowEnd   = mapsObjEvTypeEV_FLOW_END
	EventTrace     = mapsObjEvTypeEV_TRACE
)

// Prog is the program of a trace event (enum ev_prog).
type Prog = mapsObjEvProg

func progName(p Prog) string {
	switch p {
	case mapsObjEvProgEV_PROG_FROM_CONTAINER:
		return "from_container"
	case mapsObjEvProgEV_PROG_TO_CONTAINER:
		return "to_container"
	case mapsObjEvProgEV_PROG_FROM_UPLINK:
		return "from_uplink"
	case mapsObjEvProgEV_PROG_TO_UPLINK:
		return "to_uplink"
	case mapsObjEvProgEV_PROG_TUNNEL:
		return "tunnel"
	}
	return fmt.Sprintf("prog%d", uint32(p))
}

// TraceProgram names the program of a trace event, and the map entry it
// used (see enum ev_prog): its aux's top byte and low 24 bits.
func (e *Event) TraceProgram() (string, uint32) {
	return progName(Prog(e.Aux >> 24)), e.Aux & 0xffffff
}

var (
	nameEvents   = mapName(&specNames.CniEvents)
	nameEvConfig = mapName(&specNames.CniEvConfig)
	nameEvCPU    = mapName(&specNames.CniEvCpu)
	nameEvPods   = mapName(&specNames.CniEvPods)
	nameEvFlows  = mapName(&specNames.CniEvFlows)
	// cni_ev_hot: each CPU's hot flow slots (struct ev_hot), an optional
	// map of layout 5 (masqquota.go's optionalMaps).
	nameEvHot = mapName(&specNames.CniEvHot)
)

const (
	evCfgDrops    = 1 << 0
	evCfgFlowsAll = 1 << 1
	evCfgFlowsPod = 1 << 2
	evCfgTrace    = 1 << 3
	evPodFlows    = 1 << 0 // cni_ev_pods' value: bit 0, and the trace's end (seconds) above
	evFlowClosed  = 1
)

// EventSize is the size of one ring buffer record (struct cni_event).
var EventSize = binary.Size(Event{})

func (t EventType) String() string {
	switch t {
	case EventDrop:
		return "drop"
	case EventFlowStart:
		return "flow-start"
	case EventFlowEnd:
		return "flow-end"
	case EventTrace:
		return "trace"
	}
	return fmt.Sprintf("type%d", uint32(t))
}

// DecodeEvent reads one ring buffer record.
func DecodeEvent(b []byte) (Event, error) {
	var e Event
	if len(b) < EventSize {
		return e, fmt.Errorf("event record of %d bytes, want %d", len(b), EventSize)
	}
	_, err := binary.Decode(b[:EventSize], binary.LittleEndian, &e)
	return e, err
}

// Ports, ethertype: network order in the record.
func (e *Event) SrcPort() uint16               { return bits.ReverseBytes16(e.Sport) }
func (e *Event) DstPort() uint16               { return bits.ReverseBytes16(e.Dport) }
func (e *Event) EtherType() uint16             { return bits.ReverseBytes16(e.Ethertype) }
func (e *Event) Src() netip.Addr               { return addrOf(e.Saddr, e.Family) }
func (e *Event) Dst() netip.Addr               { return addrOf(e.Daddr, e.Family) }
func (e *Event) Kind() EventType               { return EventType(e.Type) }
func (e *Event) Direction() Dir                { return Dir(e.Dir) }
func (e *Event) Why() Reason                   { return Reason(e.Reason) }
func (e *Event) Time(boot time.Time) time.Time { return boot.Add(time.Duration(e.TsNs)) }

func addrOf(a [16]uint8, family uint8) netip.Addr {
	switch family {
	case unix.AF_INET:
		return netip.AddrFrom4([4]byte(a[:4]))
	case unix.AF_INET6:
		return netip.AddrFrom16(a)
	}
	return netip.Addr{}
}

// MonotonicZero is the wall time at which bpf_ktime_get_ns() was 0, to
// turn an event's ts_ns into a time.
func MonotonicZero() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Time{}
	}
	return time.Now().Add(-time.Duration(ts.Nano()))
}

// FlowEvents says which endpoints send flow events.
type FlowEvents string

const (
	FlowsOff  FlowEvents = "off"  // none
	FlowsNode FlowEvents = "node" // every endpoint of the node
	FlowsPods FlowEvents = "pods" // the endpoints Events().SetFlows turned on
)

// Default rate limit of events, per CPU.
const (
	DefaultEventRate  = 1000 // events per second
	DefaultEventBurst = 1000 // events at once
)

// EventSettings is the configuration of cni_ev_config[0].
type EventSettings struct {
	Drops bool       `json:"drops"`
	Flows FlowEvents `json:"flows"`
	Rate  uint32     `json:"ratePerCPU"`  // events per second and CPU
	Burst uint32     `json:"burstPerCPU"` // events a CPU may send at once
	// Trace is the global switch of trace events (the endpoints
	// Events().SetTrace turned on), until TraceUntil; off, they cost nothing.
	// An ended trace reads as off.
	Trace      bool      `json:"trace,omitempty"`
	TraceUntil time.Time `json:"traceUntil,omitzero"`
}

// monoSeconds is CLOCK_MONOTONIC (the programs' bpf_ktime_get_ns) in
// seconds.
func monoSeconds() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Sec)
}

// monoUntil is the monotonic second of t (0 for the zero time), rounded
// up, at most what cni_ev_pods' 31 bits hold.
func monoUntil(t time.Time) uint32 {
	if t.IsZero() {
		return 0
	}
	d := time.Until(t)
	if d <= 0 {
		return 0
	}
	s := monoSeconds() + uint64((d+time.Second-1)/time.Second)
	return uint32(min(s, 1<<31-1))
}

// monoTime is the wall time of monotonic second s.
func monoTime(s uint32) time.Time {
	return time.Now().Add(time.Duration(int64(s)-int64(monoSeconds())) * time.Second)
}

// Enabled tells whether any event is on.
func (s EventSettings) Enabled() bool { return s.Drops || s.Flows != FlowsOff || s.Trace }

// Events is the events family of the maps: the ring buffer, its
// configuration (cni_ev_config), the per-CPU buckets and loss counters
// (cni_ev_cpu), the pods with flow events or a trace (cni_ev_pods) and the
// flow table (cni_ev_flows).
type Events struct{ m *Maps }

// Events returns the events family of m.
func (m *Maps) Events() Events { return Events{m} }

// Ring is the ring buffer map, for a reader.
func (ev Events) Ring() *ebpf.Map { return ev.m.get(nameEvents) }

// Settings reads the configuration; a node where nobody configured
// events reads as all off.
func (ev Events) Settings() (EventSettings, error) {
	var c EventConfig
	zero := uint32(0)
	if err := ev.m.get(nameEvConfig).Lookup(&zero, &c); err != nil {
		return EventSettings{}, fmt.Errorf("read %s: %w", nameEvConfig, err)
	}
	s := EventSettings{Drops: c.Flags&evCfgDrops != 0, Flows: FlowsOff}
	if c.Flags&evCfgTrace != 0 && uint64(c.TraceUntilS) > monoSeconds() {
		s.Trace, s.TraceUntil = true, monoTime(c.TraceUntilS)
	}
	switch {
	case c.Flags&evCfgFlowsAll != 0:
		s.Flows = FlowsNode
	case c.Flags&evCfgFlowsPod != 0:
		s.Flows = FlowsPods
	}
	if c.CostNs > 0 {
		s.Rate = uint32(uint64(time.Second) / c.CostNs)
		s.Burst = uint32(c.BurstNs / c.CostNs)
	}
	return s, nil
}

// SetSettings writes the configuration; the programs follow it from
// their next packet. Rate and Burst 0 take the defaults.
func (ev Events) SetSettings(s EventSettings) error {
	if s.Rate == 0 {
		s.Rate = DefaultEventRate
	}
	if s.Burst == 0 {
		s.Burst = DefaultEventBurst
	}
	if s.Rate > uint32(time.Second) {
		return fmt.Errorf("event rate %d per second: at most %d", s.Rate, uint32(time.Second))
	}
	c := EventConfig{CostNs: uint64(time.Second) / uint64(s.Rate)}
	c.BurstNs = c.CostNs * uint64(s.Burst)
	if s.Drops {
		c.Flags |= evCfgDrops
	}
	if s.Trace {
		if c.TraceUntilS = monoUntil(s.TraceUntil); c.TraceUntilS != 0 {
			c.Flags |= evCfgTrace
		}
	}
	switch s.Flows {
	case FlowsNode:
		c.Flags |= evCfgFlowsAll
	case FlowsPods:
		c.Flags |= evCfgFlowsPod
	case FlowsOff, "":
	default:
		return fmt.Errorf("flow events %q: want %s, %s or %s", s.Flows, FlowsOff, FlowsNode, FlowsPods)
	}
	zero := uint32(0)
	if err := ev.m.get(nameEvConfig).Put(&zero, &c); err != nil {
		return writeErr(ev.m.get(nameEvConfig), nameEvConfig, "event settings", err)
	}
	return nil
}

// SetFlows turns flow events of one endpoint (host veth ifindex) on
// or off; they are sent while the settings' Flows is FlowsPods.
func (ev Events) SetFlows(ifindex uint32, on bool) error {
	return ev.m.setPodEvents(ifindex, evPodFlows, on)
}

// SetTrace traces one endpoint until until (the zero time: not
// any more); its trace events are sent while the settings' Trace is on.
// The programs end the trace by themselves at until.
func (ev Events) SetTrace(ifindex uint32, until time.Time) error {
	return ev.m.updatePodEvents(ifindex, func(v uint32) uint32 { return v&evPodFlows | monoUntil(until)<<1 })
}

// ForgetEndpoint turns every event switch of an endpoint off (its
// veth is gone).
func (ev Events) ForgetEndpoint(ifindex uint32) error {
	if err := ev.m.get(nameEvPods).Delete(&ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete interface %d from %s: %w", ifindex, nameEvPods, err)
	}
	return nil
}

// setPodEvents sets or clears bit of an endpoint's cni_ev_pods value.
func (m *Maps) setPodEvents(ifindex, bit uint32, on bool) error {
	return m.updatePodEvents(ifindex, func(v uint32) uint32 {
		if on {
			return v | bit
		}
		return v &^ bit
	})
}

// updatePodEvents rewrites an endpoint's cni_ev_pods value with f; the
// entry goes when nothing is left on.
func (m *Maps) updatePodEvents(ifindex uint32, f func(uint32) uint32) error {
	mp := m.get(nameEvPods)
	var v uint32
	if err := mp.Lookup(&ifindex, &v); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("read interface %d of %s: %w", ifindex, nameEvPods, err)
	}
	if v = f(v); v == 0 {
		if err := mp.Delete(&ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete interface %d from %s: %w", ifindex, nameEvPods, err)
		}
		return nil
	}
	if err := mp.Put(&ifindex, &v); err != nil {
		return writeErr(mp, nameEvPods, fmt.Sprintf("interface %d", ifindex), err)
	}
	return nil
}

// FlowEndpoints lists the endpoints with flow events on.
func (ev Events) FlowEndpoints() ([]uint32, error) {
	var out []uint32
	err := scan(ev.m.get(nameEvPods), func(k *uint32, v *uint32) {
		if *v&evPodFlows != 0 {
			out = append(out, *k)
		}
	})
	return out, err
}

// TraceEndpoints returns the endpoints traced now, and when each trace
// ends.
func (ev Events) TraceEndpoints() (map[uint32]time.Time, error) {
	out := map[uint32]time.Time{}
	now := monoSeconds()
	err := scan(ev.m.get(nameEvPods), func(k *uint32, v *uint32) {
		if until := *v >> 1; uint64(until) > now {
			out[*k] = monoTime(until)
		}
	})
	return out, err
}

// UpdateSettings reads the configuration, lets f change it, and
// writes it if f says it changed, under the map directory's lock: the
// agent's EndTraces and the `ebpf-agent events` commands read and rewrite
// the one cni_ev_config entry, and a write made from a stale read undid
// the other's (a trace turned on, then off by the sweep that had read the
// switch before: TestEventConfigWritersSerialised).
func (ev Events) UpdateSettings(f func(*EventSettings) (changed bool, err error)) error {
	unlock, err := ev.m.lock()
	if err != nil {
		return err
	}
	defer unlock()
	s, err := ev.Settings()
	if err != nil {
		return err
	}
	if changed, err := f(&s); err != nil || !changed {
		return err
	}
	return ev.SetSettings(s)
}

// TraceUntil traces the endpoints (host veth ifindexes) until until (the
// zero time: not any more), and sets the global switch to the latest trace
// of the node (off when none is left: the programs skip the trace with the
// one test they make for every event), under the map directory's lock (see
// UpdateSettings).
func (ev Events) TraceUntil(ifindexes []uint32, until time.Time) error {
	unlock, err := ev.m.lock()
	if err != nil {
		return err
	}
	defer unlock()
	for _, idx := range ifindexes {
		if err := ev.SetTrace(idx, until); err != nil {
			return err
		}
	}
	s, err := ev.Settings()
	if err != nil {
		return err
	}
	traced, err := ev.TraceEndpoints()
	if err != nil {
		return err
	}
	s.Trace, s.TraceUntil = false, time.Time{}
	for _, u := range traced {
		if u.After(s.TraceUntil) {
			s.Trace, s.TraceUntil = true, u
		}
	}
	return ev.SetSettings(s)
}

// endTracesRead, when set (tests), runs between EndTraces' read of the
// configuration and its write.
var endTracesRead func()

// EndTraces clears the trace of endpoints whose trace ended, and the global
// switch once none is left (ended, or its pods deleted: while it is on, the
// packets handed on take the events' slow path): the agent calls it now
// and then. Under the map directory's lock (see UpdateSettings).
func (ev Events) EndTraces() error {
	unlock, err := ev.m.lock()
	if err != nil {
		return err
	}
	defer unlock()
	now := monoSeconds()
	var ended []uint32
	live := 0
	if err := scan(ev.m.get(nameEvPods), func(k *uint32, v *uint32) {
		switch until := *v >> 1; {
		case until != 0 && uint64(until) <= now:
			ended = append(ended, *k)
		case until != 0:
			live++
		}
	}); err != nil {
		return fmt.Errorf("read %s: %w", nameEvPods, err)
	}
	var errs error
	for _, idx := range ended {
		errs = errors.Join(errs, ev.SetTrace(idx, time.Time{}))
	}
	var c EventConfig
	zero := uint32(0)
	cfg := ev.m.get(nameEvConfig)
	if err := cfg.Lookup(&zero, &c); err != nil {
		return errors.Join(errs, fmt.Errorf("read %s: %w", nameEvConfig, err))
	}
	if endTracesRead != nil {
		endTracesRead()
	}
	if c.Flags&evCfgTrace != 0 && (uint64(c.TraceUntilS) <= now || live == 0) {
		c.Flags &^= evCfgTrace
		c.TraceUntilS = 0
		errs = errors.Join(errs, cfg.Put(&zero, &c))
	}
	return errs
}

// EventCounters is what the per-CPU buckets sent and lost, summed over CPUs.
type EventCounters struct {
	Sent     uint64 `json:"sent"`
	LostRate uint64 `json:"lostRateLimited"` // refused by the rate limit
	LostRing uint64 `json:"lostRingFull"`    // the ring was full: the reader was behind or absent
}

// Counters sums the per-CPU counters.
func (ev Events) Counters() (EventCounters, error) {
	var per []EventCPU
	zero := uint32(0)
	if err := ev.m.get(nameEvCPU).Lookup(&zero, &per); err != nil {
		return EventCounters{}, fmt.Errorf("read %s: %w", nameEvCPU, err)
	}
	var c EventCounters
	for _, p := range per {
		c.Sent += p.Sent
		c.LostRate += p.LostRate
		c.LostRing += p.LostRing
	}
	return c, nil
}

// EndIdleFlows removes flows of cni_ev_flows idle for longer than idle, and
// returns a flow-end event for each that had not ended (closed ones were
// announced by the datapath). Reason keeps how the flow was handed on.
func (ev Events) EndIdleFlows(idle time.Duration) ([]Event, error) {
	now := monotonicNow()
	var keys []EventFlowKey
	var out []Event
	err := scan(ev.m.get(nameEvFlows), func(k *EventFlowKey, v *EventFlowVal) {
		if now < v.SeenNs || now-v.SeenNs < uint64(idle) {
			return
		}
		keys = append(keys, *k)
		if v.Flags&evFlowClosed != 0 {
			return
		}
		out = append(out, Event{TsNs: now, Ifindex: k.Ifindex, Type: uint8(EventFlowEnd), Dir: k.Dir,
			Reason: v.Reason, Family: k.Family, Proto: k.Proto, Sport: k.Sport, Dport: k.Dport,
			Saddr: k.Saddr, Daddr: k.Daddr, Ethertype: bits.ReverseBytes16(etherTypeOf(k.Family))})
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", nameEvFlows, err)
	}
	return out, deleteKeys(ev.m.get(nameEvFlows), keys)
}

func etherTypeOf(family uint8) uint16 {
	if family == unix.AF_INET6 {
		return unix.ETH_P_IPV6
	}
	return unix.ETH_P_IP
}
