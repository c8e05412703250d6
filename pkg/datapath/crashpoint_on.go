//go:build crashpoint

package datapath

import (
	"os"
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

// pausepoint sleeps for EBPF_CNI_PAUSE (a duration) at the step named by
// EBPF_CNI_PAUSE_AT, each time it is reached: a state the process passes
// through in microseconds (pods on two builds during an upgrade) then lasts
// long enough for traffic to meet it.
func pausepoint(step string) {
	if os.Getenv("EBPF_CNI_PAUSE_AT") == step {
		if d, err := time.ParseDuration(os.Getenv("EBPF_CNI_PAUSE")); err == nil {
			time.Sleep(d)
		}
	}
}
