//go:build crashpoint

package datapath

import (
	"os"
	"syscall"
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
