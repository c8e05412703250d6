package integration

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestForeignMapRefusedByAdd: a map of the same sizes but another type
// pinned in place of one of ours (a buggy or hostile process, a build that
// changed a map's type without its layout version) makes ADD a CNI error 50
// naming the pin, and leaves nothing; the verbs' lean open used to write
// the pod's entry into it, where the programs, loaded with the original
// map, never look.
func TestForeignMapRefusedByAdd(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.Add(pod, "fm-setup") // the node's datapath, pinned
	if err := e.Del(pod, "fm-setup", "eth0"); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(datapath.MapsDir(e.PinDir), "cni_links")
	ours, err := ebpf.LoadPinnedMap(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := &ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: ours.KeySize(), ValueSize: ours.ValueSize(), MaxEntries: ours.MaxEntries()}
	ours.Close()
	foreign, err := ebpf.NewMap(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := foreign.Pin(p); err != nil {
		t.Fatal(err)
	}
	pod2 := e.NewPod()
	res, err := e.AddV("1.1.0", pod2, "fm-pod", "eth0")
	var te *types.Error
	if !errors.As(err, &te) || te.Code != codePluginNotAvailable || !strings.Contains(te.Msg, p) || !strings.Contains(te.Msg, "another layout") {
		if err == nil {
			e.Del(pod2, "fm-pod", "eth0")
		}
		t.Fatalf("ADD with a foreign %s pinned: %v (%v); want error 50 naming it", p, res, err)
	}
	e.AssertNothingOf("fm-pod")
}
