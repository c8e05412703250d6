// Attack (round 13 hostile review, attack16) on CNI GC with a map of
// another layout pinned in the node's place (error 50 naming the pin, as
// the other verbs), GC killed mid-way, and GC beside DEL.

package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack16GCEveryForeignPin: a warm masquerading pod stays valid; for
// each map pin of the node in turn, a second pod (live UDP flows, both
// families) is left out of the valid attachments while that pin is a map
// of another layout. GC must answer 50 naming the pin (or succeed) and
// tear down what it can of the pod (veth, routes, link pins, IPAM); with
// the pin back a GC must succeed and leave nothing of it (record,
// endpoint entries, masquerade flows, share, quota row), and the warm pod
// keep its flows. The GCs are the plugin's alone (as a runtime without an
// attachment cache runs it: no DEL first).
func TestAttack16GCEveryForeignPin(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	echoUDP(t, lab.out, 7431)
	warm := addMasqPod(t, a, "a16gw", 7431)
	forEachMapPin(t, datapath.MapsDir(a.PinDir), 45*time.Second, func(i int, name, p string) {
		id := fmt.Sprintf("a16g%d", i)
		x := addMasqPod(t, a, id, 7431)
		back, ok := swapForeignPin(t, p)
		if !ok {
			t.Logf("%s: no foreign map of its sizes, skipped", name)
			return
		}
		err := a16GC(t, a, "a16gw")
		t.Logf("GC with a foreign %s: code %d: %v", name, testenv.ErrCode(err), err)
		if err != nil && !is50Naming(err, p) {
			t.Errorf("GC with a foreign %s pinned: %v (code %d), want 50 naming %s, or success", name, err, testenv.ErrCode(err), p)
		}
		if left := attachmentLeft(t, a, id, x.hif, x.ifindex, x.ips, false); len(left) > 0 {
			t.Errorf("GC with a foreign %s: the attachment not valid keeps %v", name, left)
		}
		back()
		if err := a16GC(t, a, "a16gw"); err != nil {
			t.Errorf("foreign %s: GC with the pin back: %v", name, err)
		}
		if left := attachmentLeft(t, a, id, x.hif, x.ifindex, x.ips, true); len(left) > 0 {
			t.Errorf("foreign %s: GC with the pin back left %v", name, left)
		}
		if err := a15MasqFlows(warm.pod, 7431); err != nil {
			t.Errorf("foreign %s: the valid pod's flows after the GCs: %v", name, err)
		}
	})
}

// a16GC runs the plugin's GC alone (no runtime's DEL of its cached
// attachments first, as libcni does), the attachments ids valid.
func a16GC(t *testing.T, a *testenv.Env, ids ...string) error {
	t.Helper()
	out, err := a.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("GC", "", nil, ""), a16GCStdin(a, ids...))
	if err == nil {
		return nil
	}
	var te types.Error
	if json.Unmarshal(out, &te) == nil && te.Code != 0 {
		return &te
	}
	return fmt.Errorf("%v: %s", err, out)
}

// a16GCStdin is GC's stdin with the valid attachments ids.
func a16GCStdin(a *testenv.Env, ids ...string) []byte {
	return a.StdinConf(func(c map[string]any) {
		v := []any{}
		for _, id := range ids {
			v = append(v, map[string]any{"containerID": id, "ifname": "eth0"})
		}
		c["cni.dev/valid-attachments"] = v
	})
}

// TestAttack16GCKilled: GC (three masquerading pods not valid, one valid) is
// killed with SIGKILL after 0 to 40 ms, wherever it is; then GC runs again
// and must succeed and leave nothing of the three, the valid pod keeping
// its flows. Both GCs are the plugin's alone (no runtime's DEL first).
func TestAttack16GCKilled(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	echoUDP(t, lab.out, 7432)
	warm := addMasqPod(t, a, "a16kw", 7432)
	bin := filepath.Join(testenv.BinDir, "ebpf-cni")
	killed := 0
	for i, delay := range []time.Duration{0, 3, 6, 10, 15, 20, 30, 40} {
		delay *= time.Millisecond
		var xs []masqPod
		for j := 0; j < 3; j++ {
			xs = append(xs, addMasqPod(t, a, fmt.Sprintf("a16k%d-%d", i, j), 7432))
		}
		werr := a.KillPluginAfter(bin, pluginEnv("GC", "", nil, ""), a16GCStdin(a, "a16kw"), delay)
		if testenv.Killed(werr) {
			killed++
		}
		err := a16GC(t, a, "a16kw")
		t.Logf("delay %v: the GC ended: %v; GC again: %v", delay, werr, err)
		if err != nil {
			t.Errorf("delay %v: GC after a killed GC: %v", delay, err)
		}
		for _, x := range xs {
			if left := attachmentLeft(t, a, x.id, x.hif, x.ifindex, x.ips, true); len(left) > 0 {
				t.Errorf("delay %v: after the killed GC and another, %s keeps %v", delay, x.id, left)
			}
		}
		if err := a15MasqFlows(warm.pod, 7432); err != nil {
			t.Errorf("delay %v: the valid pod's flows: %v", delay, err)
		}
	}
	if killed == 0 {
		t.Error("no SIGKILL landed before the GC finished: nothing was interrupted")
	}
}

// TestAttack16GCBesideDel: GC (the attachment not valid) and DEL of the same
// masquerading attachment at once, 8 times: both must succeed (each may
// find the other did it) and leave nothing of the pod; the valid pod keeps
// its flows; a DEL again succeeds.
func TestAttack16GCBesideDel(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	echoUDP(t, lab.out, 7433)
	warm := addMasqPod(t, a, "a16dw", 7433)
	for i := 0; i < 8; i++ {
		x := addMasqPod(t, a, fmt.Sprintf("a16d%d", i), 7433)
		var gcErr, delErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			gcErr = a.GC(types.GCAttachment{ContainerID: "a16dw", IfName: "eth0"})
		}()
		go func() {
			defer wg.Done()
			if i%2 == 1 {
				time.Sleep(time.Duration(i) * time.Millisecond)
			}
			delErr = a.Del(x.pod, x.id, "eth0")
		}()
		wg.Wait()
		t.Logf("round %d: GC %v, DEL %v", i, gcErr, delErr)
		if gcErr != nil || delErr != nil {
			t.Errorf("round %d: GC and DEL of %s at once: GC %v, DEL %v; want both to succeed", i, x.id, gcErr, delErr)
		}
		if left := attachmentLeft(t, a, x.id, x.hif, x.ifindex, x.ips, true); len(left) > 0 {
			t.Errorf("round %d: GC and DEL at once left of %s: %v", i, x.id, left)
		}
		if err := a.Del(x.pod, x.id, "eth0"); err != nil {
			t.Errorf("round %d: DEL again: %v", i, err)
		}
		if err := a15MasqFlows(warm.pod, 7433); err != nil {
			t.Errorf("round %d: the valid pod's flows: %v", i, err)
		}
	}
	js, _ := a.MasqAgent("dump", "nat", "-o", "json")
	var d struct {
		Quota struct {
			Total int `json:"total"`
		} `json:"quota"`
	}
	json.Unmarshal(js, &d)
	t.Logf("node's flow total at the end: %d", d.Quota.Total)
}
