package integration

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestDelReportsEveryError: a DEL that fails in two ways (the node's maps
// cannot be opened: a foreign map is pinned as cni_links; and the IPAM
// plugin is not in CNI_PATH) reports both, under the code of the first
// that has one (7, the IPAM plugin's type). DEL used to report the IPAM
// error alone. Once the map is back, DEL removes everything.
func TestDelReportsEveryError(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.Add(pod, "de-setup") // the node's datapath, pinned
	if err := e.Del(pod, "de-setup", "eth0"); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(datapath.MapsDir(e.PinDir), "cni_links")
	ours, err := ebpf.LoadPinnedMap(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ours.Close()
	foreign, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: ours.KeySize(), ValueSize: ours.ValueSize(), MaxEntries: ours.MaxEntries()})
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
	restored := false
	restore := func() {
		if restored {
			return
		}
		restored = true
		if err := os.Remove(p); err != nil {
			t.Error(err)
		}
		if err := ours.Pin(p); err != nil {
			t.Error(err)
		}
	}
	defer restore()

	stdin := e.StdinConf(func(m map[string]any) { m["ipam"] = map[string]any{"type": "no-such-ipam"} })
	out, err := e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("DEL", "de-pod", pod, "eth0"), stdin)
	perr := wantPluginError(t, "DEL with a foreign cni_links and no IPAM plugin", out, err, codeInvalidConfig,
		"open datapath at "+e.PinDir, "cni_links", "ipam.type", "no-such-ipam")
	t.Logf("DEL: error %d: %s", perr.Code, perr.Msg)

	restore()
	if err := e.Del(pod, "de-pod", "eth0"); err != nil {
		t.Errorf("DEL once the map is back: %v", err)
	}
	e.AssertClean()
}
