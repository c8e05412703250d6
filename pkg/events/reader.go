package events

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Options configure a Reader.
type Options struct {
	PinDir, StateDir string
	// Keep is how many of the last events the Reader keeps for
	// `observe --last` (default DefaultKeep).
	Keep int
	// Settings are written to the datapath at start; nil keeps the node's,
	// or turns drop events on where nobody configured events yet.
	Settings *maps.EventSettings
	// FlowIdle ends flows without a packet for that long (default
	// DefaultFlowIdle); TCP flows end at their FIN or RST.
	FlowIdle time.Duration
	// MaxPodSeries bounds the pods the metrics name (default
	// DefaultMaxPodSeries); see metrics.go.
	MaxPodSeries int
	Logger       *log.Logger
}

const (
	DefaultKeep         = 4096
	DefaultFlowIdle     = 30 * time.Second
	DefaultMaxPodSeries = 256
	subscriberBuffer    = 1024
)

// Reader is the agent's events controller: it reads the datapath's ring
// buffer, names the pods, keeps the last Keep records, counts them for the
// metrics, hands them to the subscribers (Subscribe, the socket of
// Serve), and ends idle flows. Run it once.
type Reader struct {
	o     Options
	names *names
	boot  time.Time
	met   *metricSet

	mu     sync.Mutex
	ring   []Record // circular, len Keep once full
	next   int      // where the next record goes once full
	seq    uint64
	subs   map[*Subscription]struct{}
	slow   uint64 // records subscribers were too slow for, all of them
	m      *maps.Maps
	ready  chan struct{}
	runErr error
}

// NewReader makes a Reader; Run starts it.
func NewReader(o Options) *Reader {
	if o.Keep <= 0 {
		o.Keep = DefaultKeep
	}
	if o.FlowIdle <= 0 {
		o.FlowIdle = DefaultFlowIdle
	}
	if o.MaxPodSeries <= 0 {
		o.MaxPodSeries = DefaultMaxPodSeries
	}
	if o.Logger == nil {
		o.Logger = log.Default()
	}
	return &Reader{o: o, names: newNames(o.StateDir), met: newMetricSet(o.MaxPodSeries),
		subs: map[*Subscription]struct{}{}, ready: make(chan struct{})}
}

// Run reads events until ctx ends. The pinned datapath must exist.
func (r *Reader) Run(ctx context.Context) error {
	err := r.run(ctx)
	if err != nil {
		r.mu.Lock()
		r.runErr = err
		r.mu.Unlock()
		select {
		case <-r.ready:
		default:
			close(r.ready)
		}
	}
	return err
}

func (r *Reader) run(ctx context.Context) error {
	m, err := datapath.OpenMaps(r.o.PinDir)
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	defer m.Close()
	// Under the maps' lock: an `ebpf-agent events` command may rewrite
	// the settings at the same moment.
	err = m.Events().UpdateSettings(func(s *maps.EventSettings) (bool, error) {
		switch {
		case r.o.Settings != nil:
			// A trace (`events --trace-pod`, an observer's --trace) is not
			// the agent's flags' to end: it ends by itself.
			trace, until := s.Trace, s.TraceUntil
			*s = *r.o.Settings
			s.Trace, s.TraceUntil = trace, until
		case !s.Enabled() && s.Rate == 0: // never configured
			*s = maps.EventSettings{Drops: true}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	rb, err := ringbuf.NewReader(m.Events().Ring())
	if err != nil {
		return fmt.Errorf("events: read the ring buffer: %w", err)
	}
	r.boot = maps.MonotonicZero()
	r.mu.Lock()
	r.m = m
	r.mu.Unlock()
	close(r.ready)
	s, _ := m.Events().Settings()
	r.o.Logger.Printf("events: drops %v, flows %s, at most %d a second per CPU (burst %d); keeping the last %d",
		s.Drops, s.Flows, s.Rate, s.Burst, r.o.Keep)

	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
		}
		rb.Close()
	}()
	go r.sweep(ctx, done, m)

	var rec ringbuf.Record
	for {
		if err := rb.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				r.mu.Lock()
				r.m = nil
				r.mu.Unlock()
				return nil
			}
			return fmt.Errorf("events: read: %w", err)
		}
		e, err := maps.DecodeEvent(rec.RawSample)
		if err != nil {
			r.o.Logger.Printf("events: %v", err)
			continue
		}
		r.publish(&e)
	}
}

// sweep ends the flows idle past FlowIdle (their flow-end events) and
// forgets the metrics of pods gone.
func (r *Reader) sweep(ctx context.Context, done <-chan struct{}, m *maps.Maps) {
	tick := time.NewTicker(r.o.FlowIdle / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-tick.C:
		}
		ends, err := m.Events().EndIdleFlows(r.o.FlowIdle)
		if err != nil {
			r.o.Logger.Printf("events: end idle flows: %v", err)
		}
		if err := m.Events().EndTraces(); err != nil {
			r.o.Logger.Printf("events: end traces: %v", err)
		}
		for i := range ends {
			r.publish(&ends[i])
		}
		r.names.mu.Lock()
		r.names.refresh(true)
		live := map[string]bool{}
		for _, rec := range r.names.byIf {
			live[rec.PodLabel()] = true
		}
		r.names.mu.Unlock()
		r.met.prune(live)
	}
}

func (r *Reader) publish(e *maps.Event) {
	rec := newRecord(e, r.boot, r.names)
	r.met.count(&rec)
	r.add(rec)
}

// add numbers rec, keeps it and hands it to the subscribers it matches.
func (r *Reader) add(rec Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	rec.Seq = r.seq
	if len(r.ring) < r.o.Keep {
		r.ring = append(r.ring, rec)
	} else {
		r.ring[r.next] = rec
		r.next = (r.next + 1) % r.o.Keep
	}
	for s := range r.subs {
		if !s.f.Match(&rec) {
			continue
		}
		select {
		case s.ch <- rec:
		default:
			s.slow++
			r.slow++
		}
	}
}

// Subscription receives the records matching its filter as they come.
type Subscription struct {
	r    *Reader
	f    Filter
	ch   chan Record
	slow uint64 // records dropped because C was full (under r.mu)
}

// C delivers the records.
func (s *Subscription) C() <-chan Record { return s.ch }

// Slow is how many records this subscriber was too slow for.
func (s *Subscription) Slow() uint64 {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	return s.slow
}

// Close ends the subscription.
func (s *Subscription) Close() {
	s.r.mu.Lock()
	delete(s.r.subs, s)
	s.r.mu.Unlock()
}

// Last returns up to n of the kept records matching f, oldest first.
func (r *Reader) Last(f Filter, n int) []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastLocked(f, n)
}

func (r *Reader) lastLocked(f Filter, n int) []Record {
	var out []Record
	for i := len(r.ring) - 1; i >= 0 && len(out) < n; i-- {
		rec := &r.ring[(r.next+i)%len(r.ring)]
		if f.Match(rec) {
			out = append(out, *rec)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// Subscribe returns the last n kept records matching f and a subscription
// to the records after them, with nothing lost in between.
func (r *Reader) Subscribe(f Filter, n int) ([]Record, *Subscription) {
	s := &Subscription{r: r, f: f, ch: make(chan Record, subscriberBuffer)}
	r.mu.Lock()
	defer r.mu.Unlock()
	hist := r.lastLocked(f, n)
	r.subs[s] = struct{}{}
	return hist, s
}

// Status is what the Reader and the datapath's counters say.
type Status struct {
	Settings maps.EventSettings `json:"settings"`
	maps.EventCounters
	Read        uint64 `json:"read"`        // records the agent read since its start (incl. idle flow ends)
	SlowReaders uint64 `json:"slowReaders"` // records observers were too slow for
	Kept        int    `json:"kept"`
	Keep        int    `json:"keep"`
	Observers   int    `json:"observers"`
}

// Status reads the counters; it fails when Run is not reading.
func (r *Reader) Status() (Status, error) {
	<-r.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		if r.runErr != nil {
			return Status{}, r.runErr
		}
		return Status{}, errors.New("events: the reader stopped")
	}
	st := Status{Read: r.seq, SlowReaders: r.slow, Kept: len(r.ring), Keep: r.o.Keep, Observers: len(r.subs)}
	var err error
	if st.Settings, err = r.m.Events().Settings(); err != nil {
		return st, err
	}
	st.EventCounters, err = r.m.Events().Counters()
	return st, err
}
