package cni

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// tracer prints how long each phase of a verb took to stderr when
// EBPF_CNI_TRACE is set; runtimes ignore the plugin's stderr, so it is safe
// to leave on while profiling a node.
type tracer struct {
	on    bool
	start time.Time
	last  time.Time
	parts []string
}

func newTracer() *tracer {
	now := time.Now()
	return &tracer{on: os.Getenv("EBPF_CNI_TRACE") != "", start: now, last: now}
}

func (t *tracer) mark(phase string) {
	if !t.on {
		return
	}
	now := time.Now()
	t.parts = append(t.parts, fmt.Sprintf("%s=%.2fms", phase, float64(now.Sub(t.last).Microseconds())/1000))
	t.last = now
}

func (t *tracer) done(verb string) {
	if !t.on {
		return
	}
	fmt.Fprintf(os.Stderr, "ebpf-cni %s: total=%.2fms %s\n", verb,
		float64(time.Since(t.start).Microseconds())/1000, strings.Join(t.parts, " "))
}
