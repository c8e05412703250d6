// Attack (round 13 hostile review, attack16) on CNI GC with a map of
// another layout pinned in the node's place (error 50 naming the pin, as
// the other verbs), GC killed mid-way, and GC beside DEL.

package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a16Gone lists what is left of the attachment id (host veth hostIf,
// addresses ips, ifindex): link, routes, link pins, record, IPAM,
// endpoint entries, masquerade flows, shares and quota rows.
func a16Gone(t *testing.T, a *testenv.Env, id, hostIf string, ifindex int, ips []net.IP, record bool) []string {
	t.Helper()
	var left []string
	if a.NodeLinkExists(hostIf) {
		left = append(left, "host veth "+hostIf)
	}
	for _, ip := range ips {
		if rs := a.HostRoutesTo(ip); len(rs) > 0 {
			left = append(left, "route to "+ip.String())
		}
	}
	for _, d := range []string{"ingress", "egress"} {
		if _, err := os.Stat(datapath.LinkPinPath(a.PinDir, hostIf, d)); err == nil {
			left = append(left, d+" link pin")
		}
	}
	if res := a.ReservationsOf(id); len(res) > 0 {
		left = append(left, fmt.Sprint("IPAM ", res))
	}
	if !record {
		return left
	}
	if _, err := os.Stat(a.RecordPath(id, "eth0")); err == nil {
		left = append(left, "record")
	}
	if m, err := datapath.OpenMapsLean(a.PinDir); err == nil {
		eps, _ := m.Maps.Endpoints().List()
		for _, ep := range eps {
			for _, ip := range ips {
				if ep.IP.Equal(ip) {
					left = append(left, "endpoint "+ip.String())
				}
			}
		}
		m.Close()
	}
	return append(left, a15NatOf(t, a, ifindex)...)
}

type a16Pod struct {
	pod     ns.NetNS
	id, hif string
	ifindex int
	ips     []net.IP
}

func a16AddMasq(t *testing.T, a *testenv.Env, id string, port int) a16Pod {
	t.Helper()
	p := a16Pod{pod: a.NewPod(), id: id}
	a.CleanupDel(p.pod, id)
	r := a.Add(p.pod, id)
	ip4, ip6 := testenv.PodIPs(t, r)
	p.ips = []net.IP{ip4, ip6}
	p.hif, p.ifindex = a.HostVeth(id)
	if err := a15MasqFlows(p.pod, port); err != nil {
		t.Errorf("%s: its flows: %v", id, err)
	}
	return p
}

func a16Is50(err error, p string) bool {
	var te *types.Error
	return errors.As(err, &te) && te.Code == codePluginNotAvailable && strings.Contains(te.Msg, p)
}

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
	warm := a16AddMasq(t, a, "a16gw", 7431)
	dir := datapath.MapsDir(a.PinDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(45 * time.Second)
	for i, en := range ents {
		if time.Now().After(deadline) {
			t.Logf("time's up after %d of %d pins", i, len(ents))
			break
		}
		if en.IsDir() {
			continue
		}
		name, p := en.Name(), filepath.Join(dir, en.Name())
		id := fmt.Sprintf("a16g%d", i)
		x := a16AddMasq(t, a, id, 7431)
		back, ok := a15SwapPin(t, p)
		if !ok {
			t.Logf("%s: no foreign map of its sizes, skipped", name)
			continue
		}
		err := a16GC(t, a, "a16gw")
		t.Logf("GC with a foreign %s: code %d: %v", name, testenv.ErrCode(err), err)
		if err != nil && !a16Is50(err, p) {
			t.Errorf("GC with a foreign %s pinned: %v (code %d), want 50 naming %s, or success", name, err, testenv.ErrCode(err), p)
		}
		if left := a16Gone(t, a, id, x.hif, x.ifindex, x.ips, false); len(left) > 0 {
			t.Errorf("GC with a foreign %s: the attachment not valid keeps %v", name, left)
		}
		back()
		if err := a16GC(t, a, "a16gw"); err != nil {
			t.Errorf("foreign %s: GC with the pin back: %v", name, err)
		}
		if left := a16Gone(t, a, id, x.hif, x.ifindex, x.ips, true); len(left) > 0 {
			t.Errorf("foreign %s: GC with the pin back left %v", name, left)
		}
		if err := a15MasqFlows(warm.pod, 7431); err != nil {
			t.Errorf("foreign %s: the valid pod's flows after the GCs: %v", name, err)
		}
	}
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
	warm := a16AddMasq(t, a, "a16kw", 7432)
	bin := filepath.Join(testenv.BinDir, "ebpf-cni")
	for i, delay := range []time.Duration{0, 3, 6, 10, 15, 20, 30, 40} {
		delay *= time.Millisecond
		var xs []a16Pod
		for j := 0; j < 3; j++ {
			xs = append(xs, a16AddMasq(t, a, fmt.Sprintf("a16k%d-%d", i, j), 7432))
		}
		var how string
		must(t, a.InNode(func() error {
			cmd := exec.Command(bin)
			for k, v := range pluginEnv("GC", "", nil, "") {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			cmd.Stdin = bytes.NewReader(a16GCStdin(a, "a16kw"))
			if err := cmd.Start(); err != nil {
				return err
			}
			time.Sleep(delay)
			cmd.Process.Signal(syscall.SIGKILL)
			if err := cmd.Wait(); err != nil {
				how = err.Error()
			} else {
				how = "exit 0"
			}
			return nil
		}))
		err := a16GC(t, a, "a16kw")
		t.Logf("delay %v: the GC ended: %s; GC again: %v", delay, how, err)
		if err != nil {
			t.Errorf("delay %v: GC after a killed GC: %v", delay, err)
		}
		for _, x := range xs {
			if left := a16Gone(t, a, x.id, x.hif, x.ifindex, x.ips, true); len(left) > 0 {
				t.Errorf("delay %v: after the killed GC and another, %s keeps %v", delay, x.id, left)
			}
		}
		if err := a15MasqFlows(warm.pod, 7432); err != nil {
			t.Errorf("delay %v: the valid pod's flows: %v", delay, err)
		}
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
	warm := a16AddMasq(t, a, "a16dw", 7433)
	for i := 0; i < 8; i++ {
		x := a16AddMasq(t, a, fmt.Sprintf("a16d%d", i), 7433)
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
		if left := a16Gone(t, a, x.id, x.hif, x.ifindex, x.ips, true); len(left) > 0 {
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
