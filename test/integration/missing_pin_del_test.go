package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
