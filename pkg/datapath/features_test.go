package datapath

import (
	"errors"
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

// TestProbeFibFlag: the probe tells a flag the kernel has from one it has
// not (1<<7 is no BPF_FIB_LOOKUP_* flag of any kernel yet), so a kernel
// without BPF_FIB_LOOKUP_SRC is seen as one.
func TestProbeFibFlag(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (loads a program)")
	}
	if err := probeFibFlag(0); err != nil {
		t.Fatalf("no flag: %v", err)
	}
	if err := probeFibFlag(1 << 7); !errors.Is(err, ebpf.ErrNotSupported) {
		t.Fatalf("unknown flag: %v, want ErrNotSupported", err)
	}
}
