//go:build crashpoint

package endpoint

import (
	"os"
	"syscall"
)

// Crashpoint kills the plugin with SIGKILL at the step named by
// EBPF_CNI_CRASH_AT, as a node losing power or an OOM kill would: no undo,
// no deferred function runs. At the step named by EBPF_CNI_STOP_AT it stops
// itself (SIGSTOP) instead, so a test can run something in that window and
// let it go on (SIGCONT). Only the test build has it (-tags crashpoint).
func Crashpoint(step string) {
	if os.Getenv("EBPF_CNI_CRASH_AT") == step {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	if os.Getenv("EBPF_CNI_STOP_AT") == step {
		syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
}
