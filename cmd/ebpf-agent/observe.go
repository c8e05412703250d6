package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// The flags of observe and events (kept here, apart from opts, so the
// commands are one file).
var obs struct {
	pod, verdict, protocol, socket string
	since                          time.Duration
	last                           int
	follow                         bool
	trace                          string
	traceFor                       time.Duration
	// events
	drops, flows, flowsPod, tracePod string
	rate, burst                      uint
}

func observeFlags(fs *flag.FlagSet, _ *opts) {
	fs.StringVar(&obs.pod, "pod", "", "only events of this pod (namespace/name), at its interface or as either end")
	fs.StringVar(&obs.verdict, "verdict", "", "only dropped or forwarded packets")
	fs.StringVar(&obs.protocol, "protocol", "", "only tcp, udp, icmp (v4 and v6), icmpv6, sctp, arp, or an IP protocol number")
	fs.DurationVar(&obs.since, "since", 0, "start with the agent's kept events of the last DURATION (e.g. 5m), then follow")
	fs.IntVar(&obs.last, "last", 0, "print the agent's last N kept events (matching the filters) and stop (with --follow: then follow)")
	fs.BoolVar(&obs.follow, "follow", false, "with --last: follow after them")
	fs.StringVar(&obs.socket, "socket", "", "the agent's socket (default: agent.sock in --state-dir)")
	fs.StringVar(&obs.trace, "trace", "", "namespace/name: trace this pod's packets (each program's decision) while observing it, then turn the trace off")
	fs.DurationVar(&obs.traceFor, "trace-for", 30*time.Second, "with --trace: the trace's lease, renewed while observe runs (a killed observe's trace ends after it)")
}

func (o *opts) socketPath() string {
	if obs.socket != "" {
		return obs.socket
	}
	return events.SocketPath(o.stateDir)
}

func observe(o *opts) error {
	if o.format != "table" && o.format != "json" {
		return fmt.Errorf("observe: -o %q: want table or json", o.format)
	}
	q := events.Query{Filter: events.Filter{Pod: obs.pod, Verdict: obs.verdict, Protocol: strings.ToLower(obs.protocol)},
		Last: obs.last, Follow: obs.last == 0 || obs.follow}
	if obs.since > 0 {
		q.Since = time.Now().Add(-obs.since)
	}
	if obs.trace != "" {
		if obs.pod != "" && obs.pod != obs.trace {
			return fmt.Errorf("observe: --trace %q with --pod %q: one pod", obs.trace, obs.pod)
		}
		q.Filter.Pod = obs.trace
	}
	if err := q.Filter.Validate(); err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if obs.trace != "" {
		if obs.traceFor < 3*time.Second {
			return fmt.Errorf("observe: --trace-for %s: at least 3s", obs.traceFor)
		}
		off, err := traceWhileObserving(ctx, o, obs.trace)
		if err != nil {
			return fmt.Errorf("observe: --trace: %w", err)
		}
		defer off()
	}
	header := o.format == "table"
	print := func(r *events.Record) error {
		if o.format == "json" {
			return events.WriteJSON(os.Stdout, r)
		}
		if header {
			fmt.Println(events.TableHeader)
			header = false
		}
		return events.WriteRow(os.Stdout, r)
	}
	err := events.Observe(ctx, o.socketPath(), q, print)
	if !errors.Is(err, events.ErrNoAgent) {
		if err == nil && header && !q.Follow {
			fmt.Fprintln(os.Stderr, "no kept event matches")
		}
		return err
	}
	// No agent: the ring buffer has no other reader, so read it here.
	if obs.last > 0 || obs.since > 0 {
		return fmt.Errorf("observe: %w: --last and --since read the events the agent keeps; start `ebpf-agent run`", err)
	}
	fmt.Fprintf(os.Stderr, "observe: %v; reading the datapath's ring buffer directly (no history, no loss reports; stop with Ctrl-C)\n", err)
	if err := events.ReadDirect(ctx, o.pinDir, o.stateDir, q.Filter, print); err != nil {
		return fmt.Errorf("observe: no agent, and reading the ring buffer failed: %w", err)
	}
	return nil
}

func eventsFlags(fs *flag.FlagSet, _ *opts) {
	fs.StringVar(&obs.drops, "drops", "", "on or off: an event per dropped packet")
	fs.StringVar(&obs.flows, "flows", "", "off, node (every pod) or pods (those turned on with --flows-pod)")
	fs.StringVar(&obs.flowsPod, "flows-pod", "", "namespace/name[=off]: turn one pod's flow events on (or off); sets --flows pods when flows are off")
	fs.StringVar(&obs.tracePod, "trace-pod", "", "namespace/name[=off]: trace one pod's packets (each program's decision) for --trace-for (or stop)")
	fs.DurationVar(&obs.traceFor, "trace-for", 10*time.Minute, "with --trace-pod: how long the trace lasts (it ends by itself)")
	fs.UintVar(&obs.rate, "rate", 0, "events a second each CPU may send (default: as configured)")
	fs.UintVar(&obs.burst, "burst", 0, "events a CPU may send at once (default: as configured)")
	fs.StringVar(&obs.socket, "socket", "", "the agent's socket (default: agent.sock in --state-dir)")
}

// eventsReport is what `ebpf-agent events` prints.
type eventsReport struct {
	Settings  maps.EventSettings `json:"settings"`
	Counters  maps.EventCounters `json:"counters"`
	FlowPods  []string           `json:"flowPods,omitempty"`
	TracePods []string           `json:"tracePods,omitempty"`
	Agent     *events.Status     `json:"agent,omitempty"`
	AgentNote string             `json:"agentNote,omitempty"`
}

func eventsCmd(o *opts) error {
	m, err := datapath.OpenMaps(o.pinDir)
	if err != nil {
		return err
	}
	defer m.Close()
	recs, _ := state.ListAll(o.stateDir)
	if err := applyEventFlags(o, m, recs); err != nil {
		return err
	}
	rep := eventsReport{}
	if rep.Settings, err = m.Events().Settings(); err != nil {
		return err
	}
	if rep.Counters, err = m.Events().Counters(); err != nil {
		return err
	}
	byIf := state.ByHostIfindex(recs)
	label := func(ids []uint32) (out []string) {
		for _, id := range ids {
			if r := byIf[int(id)]; r != nil && r.PodLabel() != "" {
				out = append(out, r.PodLabel())
			} else {
				out = append(out, fmt.Sprintf("if%d", id))
			}
		}
		return out
	}
	ids, _ := m.Events().FlowEndpoints()
	rep.FlowPods = label(ids)
	traced, _ := m.Events().TraceEndpoints()
	ids = ids[:0]
	for id := range traced {
		ids = append(ids, id)
	}
	rep.TracePods = label(ids)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if st, err := events.AgentStatus(ctx, o.socketPath()); err == nil {
		rep.Agent = &st
	} else {
		rep.AgentNote = err.Error()
	}
	if o.format == "json" {
		return events.WriteJSONValue(os.Stdout, rep)
	}
	rep.print()
	return nil
}

// applyEventFlags writes what the flags change of the event settings, and
// --flows-pod's and --trace-pod's switches on each interface of the pod
// (recs). The settings are read and written under the maps' lock
// (Events().UpdateSettings), so the agent's sweep of ended traces, which
// rewrites them too, neither undoes nor is undone by this.
func applyEventFlags(o *opts, m *maps.Maps, recs []*state.Record) error {
	switch obs.drops {
	case "", "on", "off":
	default:
		return fmt.Errorf("events: --drops %q: want on or off", obs.drops)
	}
	flowsOn := false
	if obs.flowsPod != "" {
		pod, off := strings.CutSuffix(obs.flowsPod, "=off")
		n := 0
		for _, r := range recs { // every interface of the pod
			if r.PodLabel() == pod && r.HostIfindex > 0 && !r.Provisional {
				if err := m.Events().SetFlows(uint32(r.HostIfindex), !off); err != nil {
					return err
				}
				n++
			}
		}
		if n == 0 {
			return fmt.Errorf("events: --flows-pod: no attachment of pod %q in %s", pod, o.stateDir)
		}
		flowsOn = !off
	}
	if obs.tracePod != "" {
		pod, off := strings.CutSuffix(obs.tracePod, "=off")
		until := time.Time{}
		if !off {
			if obs.traceFor < time.Second {
				return fmt.Errorf("events: --trace-for %s: at least 1s", obs.traceFor)
			}
			until = time.Now().Add(obs.traceFor)
		}
		if err := setTrace(o, m, recs, pod, until); err != nil {
			return fmt.Errorf("events: --trace-pod: %w", err)
		}
	}
	err := m.Events().UpdateSettings(func(s *maps.EventSettings) (bool, error) {
		changed := false
		if obs.drops != "" {
			s.Drops, changed = obs.drops == "on", true
		}
		if obs.flows != "" {
			s.Flows, changed = maps.FlowEvents(obs.flows), true
		}
		if obs.rate > 0 {
			s.Rate, changed = uint32(obs.rate), true
		}
		if obs.burst > 0 {
			s.Burst, changed = uint32(obs.burst), true
		}
		if flowsOn && s.Flows == maps.FlowsOff {
			s.Flows, changed = maps.FlowsPods, true
		}
		return changed, nil
	})
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	return nil
}

// print prints the report as text.
func (rep *eventsReport) print() {
	fmt.Printf("drop events: %v; flow events: %s", onOff(rep.Settings.Drops), rep.Settings.Flows)
	if len(rep.FlowPods) > 0 {
		fmt.Printf(" (pods: %s)", strings.Join(rep.FlowPods, ", "))
	}
	if rep.Settings.Trace || len(rep.TracePods) > 0 {
		fmt.Printf("; trace: %v (pods: %s)", onOff(rep.Settings.Trace), strings.Join(rep.TracePods, ", "))
	}
	fmt.Printf("\nrate limit: %d events a second per CPU, burst %d\n", rep.Settings.Rate, rep.Settings.Burst)
	fmt.Printf("sent: %d; lost: %d over the rate limit, %d with the ring full\n", rep.Counters.Sent, rep.Counters.LostRate, rep.Counters.LostRing)
	if rep.Agent != nil {
		fmt.Printf("agent: read %d, keeps %d of the last %d, %d observers, %d lost by slow observers\n",
			rep.Agent.Read, rep.Agent.Kept, rep.Agent.Keep, rep.Agent.Observers, rep.Agent.SlowReaders)
	} else {
		fmt.Printf("agent: %s\n", rep.AgentNote)
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// setTrace traces every interface of pod until until (the zero time: not
// any more), and sets the global switch to the latest trace of the node
// (maps.TraceUntil).
func setTrace(o *opts, m *maps.Maps, recs []*state.Record, pod string, until time.Time) error {
	var ifs []uint32
	for _, r := range recs {
		if r.PodLabel() == pod && r.HostIfindex > 0 && !r.Provisional {
			ifs = append(ifs, uint32(r.HostIfindex))
		}
	}
	if len(ifs) == 0 {
		return fmt.Errorf("no attachment of pod %q in %s", pod, o.stateDir)
	}
	return m.Events().TraceUntil(ifs, until)
}

// traceWhileObserving traces pod for obs.traceFor, renewed at a third of
// it while observe runs; the function returned ends the trace. Killed
// (SIGKILL), observe leaves a trace that ends by itself.
func traceWhileObserving(ctx context.Context, o *opts, pod string) (func(), error) {
	m, err := datapath.OpenMaps(o.pinDir)
	if err != nil {
		return nil, err
	}
	renew := func() error {
		recs, _ := state.ListAll(o.stateDir)
		return setTrace(o, m, recs, pod, time.Now().Add(obs.traceFor))
	}
	if err := renew(); err != nil {
		m.Close()
		return nil, err
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(obs.traceFor / 3)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-tick.C:
				if err := renew(); err != nil {
					fmt.Fprintf(os.Stderr, "observe: renew the trace of %s: %v\n", pod, err)
				}
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		defer m.Close()
		recs, _ := state.ListAll(o.stateDir)
		if err := setTrace(o, m, recs, pod, time.Time{}); err != nil {
			fmt.Fprintf(os.Stderr, "observe: turn the trace of %s off: %v\n", pod, err)
		}
	}, nil
}
