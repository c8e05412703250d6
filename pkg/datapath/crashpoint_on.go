//go:build crashpoint

package datapath

import (
	"os"
	"strings"
	"syscall"
	"time"
)

// crashpoint kills the process with SIGKILL at the step named by
// EBPF_CNI_CRASH_AT (as endpoint.Crashpoint does for ADD's steps): no
// deferred function runs, the pin directory's lock goes with the process.
func crashpoint(step string) {
	if os.Getenv("EBPF_CNI_CRASH_AT") == step {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// pausepoint sleeps at a step named in EBPF_CNI_PAUSE_AT, each time it is
// reached: a state the process passes through in microseconds (pods on two
// builds during an upgrade) then lasts long enough for traffic to meet it,
// and a step that takes seconds on a loaded node (the verifier) takes them
// on a quiet one. EBPF_CNI_PAUSE_AT is a comma-separated list of steps,
// each with its own duration (step=300ms) or EBPF_CNI_PAUSE's.
func pausepoint(step string) {
	if d, ok := pauseFor(step, os.Getenv("EBPF_CNI_PAUSE_AT"), os.Getenv("EBPF_CNI_PAUSE")); ok {
		time.Sleep(d)
	}
}

// pauseFor is how long pausepoint sleeps at step.
func pauseFor(step, at, def string) (time.Duration, bool) {
	for _, s := range strings.Split(at, ",") {
		name, dur, own := strings.Cut(strings.TrimSpace(s), "=")
		if name != step {
			continue
		}
		if !own {
			dur = def
		}
		d, err := time.ParseDuration(dur)
		return d, err == nil
	}
	return 0, false
}

// holdpoint holds the process at the step named by EBPF_CNI_HOLD_AT for as
// long as the file EBPF_CNI_HOLD_FILE exists, after creating
// EBPF_CNI_HOLD_FILE.reached: a test runs something while the process is
// exactly there (a look made, its action not yet), then lets it go on.
func holdpoint(step string) {
	file := os.Getenv("EBPF_CNI_HOLD_FILE")
	if os.Getenv("EBPF_CNI_HOLD_AT") != step || file == "" {
		return
	}
	if f, err := os.Create(file + ".reached"); err == nil {
		f.Close()
	}
	for {
		if _, err := os.Stat(file); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
