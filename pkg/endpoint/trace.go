package endpoint

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// Tracer prints how long each phase of a verb took to stderr when
// EBPF_CNI_TRACE is set; runtimes ignore the plugin's stderr, so it is safe
// to leave on while profiling a node.
type Tracer struct {
	on    bool
	start time.Time
	last  time.Time
	parts []string
}

// NewTracer starts timing a verb.
func NewTracer() *Tracer {
	now := time.Now()
	return &Tracer{on: os.Getenv("EBPF_CNI_TRACE") != "", start: now, last: now}
}

// Mark ends a phase; nil is a tracer that records nothing.
func (t *Tracer) Mark(phase string) {
	if t == nil || !t.on {
		return
	}
	now := time.Now()
	t.parts = append(t.parts, fmt.Sprintf("%s=%.2fms", phase, float64(now.Sub(t.last).Microseconds())/1000))
	t.last = now
}

// Done prints the verb's phases.
func (t *Tracer) Done(verb string) {
	if t == nil || !t.on {
		return
	}
	fmt.Fprintf(os.Stderr, "ebpf-cni %s: total=%.2fms %s\n", verb,
		float64(time.Since(t.start).Microseconds())/1000, strings.Join(t.parts, " "))
}
