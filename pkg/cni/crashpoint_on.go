//go:build crashpoint

package cni

import (
	"os"
	"syscall"
)

// crashpoint kills the plugin with SIGKILL at the step named by
// EBPF_CNI_CRASH_AT, as a node losing power or an OOM kill would: no undo,
// no deferred function runs. Only the test build has it (-tags crashpoint).
func crashpoint(step string) {
	if os.Getenv("EBPF_CNI_CRASH_AT") == step {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}
