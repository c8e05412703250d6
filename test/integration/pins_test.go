// The node's pinned maps tampered with: a map's pin removed before DEL, a
// foreign map pinned in place of one of ours refused by ADD (one opened at
// once, one opened at first use).

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

// TestDelWithMapPinRemoved: a map pin removed by hand (or by another tool)
// while the programs still use the map must not make DEL take the datapath
// for never set up and skip the pod's map entries: Ensure pins such a map
// again from the programs (readoptMaps), and the entries the DEL left
// would stay in the maps the programs read (the pod's address routed to a
// gone ifindex) with no record left for GC to find them by.
func TestDelWithMapPinRemoved(t *testing.T) {
	e := testenv.New(t)
	pod := e.NewPod()
	e.AddAttachment(pod, "pinless")
	if err := os.Remove(filepath.Join(datapath.MapsDir(e.PinDir), "cni_ct")); err != nil {
		t.Fatal(err)
	}
	if err := e.Del(pod, "pinless", "eth0"); err != nil {
		t.Fatalf("DEL with the cni_ct pin removed: %v", err)
	}
	// The next ADD pins cni_ct again (Ensure); its own entries go with its DEL.
	other := e.NewPod()
	e.AddAttachment(other, "after")
	if err := e.Del(other, "after", "eth0"); err != nil {
		t.Fatal(err)
	}
	if l := e.Leftovers(); len(l) > 0 {
		t.Fatalf("after DEL with a map pin removed:\n  %s", strings.Join(l, "\n  "))
	}
	e.AssertClean()
}

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

// TestForeignLazyMapRefusedByAdd: as TestForeignMapRefusedByAdd for a map
// the verbs open only when they first use it (cni_netns: every ADD writes
// the pod's netns there; maps.OpenPinned lists it, opens it later). The
// ADD is still a CNI error 50 naming the pin, nothing written to it, and
// everything the ADD made before that use is undone.
func TestForeignLazyMapRefusedByAdd(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.Add(pod, "flm-setup") // the node's datapath, pinned
	if err := e.Del(pod, "flm-setup", "eth0"); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(datapath.MapsDir(e.PinDir), "cni_netns")
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
	res, err := e.AddV("1.1.0", pod2, "flm-pod", "eth0")
	var te *types.Error
	if !errors.As(err, &te) || te.Code != codePluginNotAvailable || !strings.Contains(te.Msg, p) || !strings.Contains(te.Msg, "another layout") {
		if err == nil {
			e.Del(pod2, "flm-pod", "eth0")
		}
		t.Fatalf("ADD with a foreign %s pinned: %v (%v); want error 50 naming it", p, res, err)
	}
	k, v := make([]byte, spec.KeySize), make([]byte, spec.ValueSize)
	if foreign.Iterate().Next(k, v) {
		t.Errorf("the ADD wrote into the foreign %s", p)
	}
	e.AssertNothingOf("flm-pod")
}
