package datapath

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// TestProbeFibFlag: the probe tells a flag the kernel has from one it has
// not (1<<7 is no BPF_FIB_LOOKUP_* flag of any kernel yet), so a kernel
// without BPF_FIB_LOOKUP_SRC is seen as one.
func TestProbeFibFlag(t *testing.T) {
	requireRoot(t)
	if err := probeFibFlag(0); err != nil {
		t.Fatalf("no flag: %v", err)
	}
	if err := probeFibFlag(1 << 7); !errors.Is(err, ebpf.ErrNotSupported) {
		t.Fatalf("unknown flag: %v, want ErrNotSupported", err)
	}
}

// TestCompatBuildLoads: every program of the compat build (no bpf_timer, no
// bpf_loop) passes this kernel's verifier over the node's maps, as a node
// without those helpers loads them. (An older kernel's verifier is not this
// one: docs/compat.md.)
func TestCompatBuildLoads(t *testing.T) {
	dp := testDatapath(t)
	for _, o := range []*object{objFromContainer, objToContainer, objFromUplink, objToUplink, objSock} {
		var progs []Program
		for _, p := range catalog {
			if p.obj == o {
				progs = append(progs, p)
			}
		}
		out := map[string]*ebpf.Program{}
		start := time.Now()
		if err := loadObject(filepath.Join(dp.PinRoot, "compat"), dp.Maps, o.compat, progs, true, out); err != nil {
			t.Errorf("compat build of %s: %v", o.name, err)
		}
		took := time.Since(start)
		// The full build's, for comparison (the verifier's time is most of it).
		start = time.Now()
		if err := loadObject(filepath.Join(dp.PinRoot, "full"), dp.Maps, o, progs, true, out); err != nil {
			t.Errorf("full build of %s: %v", o.name, err)
		}
		t.Logf("%s: compat build loaded in %v, full build in %v", o.name, took, time.Since(start))
		for _, p := range out {
			p.Close()
		}
		out = map[string]*ebpf.Program{}
		for _, p := range out {
			p.Close()
		}
	}
}
