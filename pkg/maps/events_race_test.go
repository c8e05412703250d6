package maps

import (
	"testing"
	"time"
)

// The agent's sweep (EndTraces) and an `ebpf-agent events --trace-pod`
// (TraceUntil) both rewrite cni_ev_config: the command turning a trace on
// between the sweep's read of the switch (on, its last trace ended) and the
// sweep's write must find its trace on afterwards. Before, the sweep wrote
// back what it had read, the switch off: the pod's trace was set and no
// trace event was sent.
func TestEventConfigWritersSerialised(t *testing.T) {
	m := testMaps(t, DefaultSizing)
	// Endpoint 7's trace ended 5 s ago; the switch is still on.
	ended := uint32(monoSeconds() - 5)
	if err := m.byName[nameEvPods].Put(uint32(7), ended<<1); err != nil {
		t.Fatal(err)
	}
	c := EventConfig{Flags: evCfgTrace, TraceUntilS: ended, CostNs: uint64(time.Second) / DefaultEventRate}
	if err := m.byName[nameEvConfig].Put(uint32(0), &c); err != nil {
		t.Fatal(err)
	}

	var pending chan error
	endTracesRead = func() {
		endTracesRead = nil
		done := make(chan error, 1)
		go func() { done <- m.Events().TraceUntil([]uint32{9}, time.Now().Add(time.Minute)) }()
		select {
		case err := <-done: // it did not wait for the sweep
			done <- err
		case <-time.After(300 * time.Millisecond):
		}
		pending = done
	}
	t.Cleanup(func() { endTracesRead = nil })
	if err := m.Events().EndTraces(); err != nil {
		t.Fatal(err)
	}
	if err := <-pending; err != nil {
		t.Fatal(err)
	}
	s, err := m.Events().Settings()
	if err != nil {
		t.Fatal(err)
	}
	traced, err := m.Events().TraceEndpoints()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := traced[9]; !ok || !s.Trace {
		t.Errorf("after a trace turned on during the sweep: endpoints traced %v, switch %v; want 9 traced and the switch on", traced, s.Trace)
	}
	if _, ok := traced[7]; ok {
		t.Errorf("endpoint 7's ended trace is still set: %v", traced)
	}
}
