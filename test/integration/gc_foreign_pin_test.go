package integration

import (
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestGCForeignPin: GC with a map of another layout pinned in the node's
// place (cni_endpoints, a map every verb opens first) answers 50 naming the
// pin, as ADD, CHECK and DEL do, not 999 (round 12 noticed it), both when
// its attachment is valid (the node's sweep only) and when GC tears it
// down. With the pin back a GC finishes and leaves nothing of the pod.
func TestGCForeignPin(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "gcforeign")
	e.Add(pod, "gcforeign")
	p := filepath.Join(datapath.MapsDir(e.PinDir), "cni_endpoints")
	back, ok := swapForeignPin(t, p)
	if !ok {
		t.Fatalf("no map of another type with %s's sizes could be made", p)
	}
	defer back()
	for _, c := range []struct {
		name  string
		valid []types.GCAttachment
	}{
		{"the pod valid", []types.GCAttachment{{ContainerID: "gcforeign", IfName: "eth0"}}},
		{"nothing valid", nil},
	} {
		if err := e.GC(c.valid...); !is50Naming(err, p) {
			t.Errorf("GC with %s and a foreign %s pinned: %v (code %d), want error 50 naming the pin", c.name, p, err, testenv.ErrCode(err))
		}
	}
	back()
	if err := e.GC(); err != nil {
		t.Fatalf("GC with the pin back: %v", err)
	}
	if left := e.Leftovers(); len(left) > 0 {
		t.Errorf("GC with the pin back left %v", left)
	}
}
