//go:build crashpoint

package endpoint

import (
	"os"
	"runtime"
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
		// To this thread: a SIGSTOP to the process stops it when some
		// thread takes the signal, and the caller ran on meanwhile
		// (under load, into the links lock it then held while stopped).
		// A thread's own signal is taken before the syscall returns.
		runtime.LockOSThread()
		syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
		runtime.UnlockOSThread()
	}
}
