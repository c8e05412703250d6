// Attack (round 12 hostile review, attack15) on DEL meeting a map pin of
// another layout (docs/design.md: a step that meets a foreign pin ends
// alone, DEL answers 50 naming the pin, a retry with the pin back leaves
// nothing).

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

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a15SwapPin is swapPin for any map type: the foreign map is a hash (an
// LRU hash for a hash) of the same key and value sizes; ok false when the
// kernel takes no such map (key or value size 0: ring buffers).
func a15SwapPin(t *testing.T, p string) (back func(), ok bool) {
	t.Helper()
	ours, err := ebpf.LoadPinnedMap(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	typ := ebpf.Hash
	if ours.Type() == ebpf.Hash {
		typ = ebpf.LRUHash
	}
	ks, vs := ours.KeySize(), ours.ValueSize()
	foreign, err := ebpf.NewMap(&ebpf.MapSpec{Type: typ, KeySize: max(ks, 1), ValueSize: max(vs, 1), MaxEntries: max(ours.MaxEntries(), 1)})
	if err != nil {
		ours.Close()
		return nil, false
	}
	must(t, os.Remove(p))
	must(t, foreign.Pin(p))
	foreign.Close()
	restored := false
	back = func() {
		if restored {
			return
		}
		restored = true
		os.Remove(p)
		// A map loaded from p believes itself pinned there (Pin is then a
		// no-op, as in swapPin): pin a clone, which has no pin path.
		c, err := ours.Clone()
		if err == nil {
			err = c.Pin(p)
			c.Close()
		}
		if err != nil {
			t.Errorf("pin %s back: %v", p, err)
		}
		ours.Close()
	}
	t.Cleanup(back)
	return back, true
}

// a15MasqFlows opens a UDP flow of each family from pod to the outside
// echo server on port (masqueraded: the outside has no route to pods).
func a15MasqFlows(pod ns.NetNS, port int) error {
	for _, ip := range []net.IP{outsideIP, outsideIP6} {
		if err := echoUDP6Opts(pod, hp(ip, port), 64, 3, func(int) error { return nil }); err != nil && ip.To4() == nil {
			return err
		}
	}
	return nil
}

// a15NatOf lists what dump nat still shows of ifindex: flows, shares,
// quota rows.
func a15NatOf(t *testing.T, e *testenv.Env, ifindex int) []string {
	t.Helper()
	js, err := e.MasqAgent("dump", "nat", "-o", "json")
	if err != nil {
		t.Errorf("dump nat: %v", err)
		return nil
	}
	var d inspect.NATDump
	if err := json.Unmarshal(js, &d); err != nil {
		t.Errorf("dump nat: %v", err)
		return nil
	}
	var left []string
	for _, f := range d.Flows {
		if f.Ifindex == ifindex {
			left = append(left, "flow "+f.Pod+" -> "+f.Peer)
		}
	}
	for _, s := range d.Shares {
		if s.Ifindex == ifindex {
			left = append(left, "share")
		}
	}
	for _, q := range d.Quota.Pods {
		if q.Ifindex == ifindex {
			left = append(left, "quota row")
		}
	}
	return left
}

// TestAttack15DelEveryForeignPin: a masquerading pod (ipMasq, portMappings
// capability) with live UDP flows of both families is DELed while one map
// pin of the node, each in turn, is a map of another layout. Every pin the
// kernel can forge this way is tried (the round-12 test tried three). The
// DEL must answer success or 50 naming the pin, and (design.md: "a step that
// fails does not stop the others ... everything else of the pod gone") leave
// no veth, route, link pin, IPAM reservation; with the pin back a retried
// DEL succeeds and leaves nothing: no record, no endpoint entry, no masquerade
// flow, share or quota row of the pod's ifindex.
func TestAttack15DelEveryForeignPin(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	echoUDP(t, lab.out, 7415)
	// A first pod makes every map the node uses pinned.
	warm := a.NewPod()
	a.CleanupDel(warm, "a15w")
	a.Add(warm, "a15w")
	must(t, a15MasqFlows(warm, 7415))
	dir := datapath.MapsDir(a.PinDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(50 * time.Second)
	for i, en := range ents {
		if time.Now().After(deadline) {
			t.Logf("time's up after %d of %d pins", i, len(ents))
			break
		}
		name := en.Name()
		if en.IsDir() {
			continue
		}
		a15DelWithForeign(t, a, name, filepath.Join(dir, name), i)
	}
}

func a15DelWithForeign(t *testing.T, a *testenv.Env, name, p string, i int) {
	t.Helper()
	pod := a.NewPod()
	id := "a15d" + strings.ReplaceAll(name, "_", "")
	if len(id) > 40 {
		id = id[:40]
	}
	a.CleanupDel(pod, id)
	r := a.Add(pod, id)
	ip4, ip6 := testenv.PodIPs(t, r)
	hostIf, ifindex := a.HostVeth(id)
	if err := a15MasqFlows(pod, 7415); err != nil {
		t.Errorf("%s: the pod's flows before the DEL: %v", name, err)
	}
	back, ok := a15SwapPin(t, p)
	if !ok {
		t.Logf("%s: no foreign map of its sizes, skipped", name)
		a.Del(pod, id, "eth0")
		return
	}
	err := a.Del(pod, id, "eth0")
	var te *types.Error
	if err != nil && (!errors.As(err, &te) || te.Code != codePluginNotAvailable || !strings.Contains(te.Msg, p)) {
		t.Errorf("DEL with a foreign %s pinned: %v, (code %d), want error 50 naming %s, or success", name, err, testenv.ErrCode(err), p)
	}
	t.Logf("DEL with a foreign %s: code %d: %v", name, testenv.ErrCode(err), err)
	if a.NodeLinkExists(hostIf) {
		t.Errorf("foreign %s: the DEL left the host veth %s", name, hostIf)
	}
	for _, ip := range []net.IP{ip4, ip6} {
		if rs := a.HostRoutesTo(ip); len(rs) > 0 {
			t.Errorf("foreign %s: the DEL left the node's routes to %s", name, ip)
		}
	}
	for _, d := range []string{"ingress", "egress"} {
		if _, serr := os.Stat(datapath.LinkPinPath(a.PinDir, hostIf, d)); serr == nil {
			t.Errorf("foreign %s: the DEL left the %s link pin of %s", name, d, hostIf)
		}
	}
	if res := a.ReservationsOf(id); len(res) > 0 {
		t.Errorf("foreign %s: the DEL left the IPAM reservations %v", name, res)
	}
	back()
	if err := a.Del(pod, id, "eth0"); err != nil {
		t.Errorf("foreign %s: DEL again with the pin back: %v", name, err)
	}
	if _, serr := os.Stat(a.RecordPath(id, "eth0")); serr == nil {
		t.Errorf("foreign %s: the retried DEL left the record", name)
	}
	if res := a.ReservationsOf(id); len(res) > 0 {
		t.Errorf("foreign %s: the retried DEL left the IPAM reservations %v", name, res)
	}
	if m, merr := datapath.OpenMapsLean(a.PinDir); merr == nil {
		eps, _ := m.Maps.Endpoints().List()
		for _, ep := range eps {
			if ep.IP.Equal(ip4) || ep.IP.Equal(ip6) {
				t.Errorf("foreign %s: the retried DEL left the endpoint entry of %s", name, ep.IP)
			}
		}
		m.Close()
	}
	if left := a15NatOf(t, a, ifindex); len(left) > 0 {
		t.Errorf("foreign %s: after the retried DEL dump nat still shows of ifindex %d: %v", name, ifindex, left)
	}
}

// TestAttack15DelKilledWithForeignPin: a masquerading pod's DEL, cni_snat
// pinned with another layout (the DEL answers 50 naming it after the rest of
// the teardown), is killed with SIGKILL after 0 to 40 ms (wherever it is:
// the attack knows no step names), while an ADD of another pod runs beside
// it. Then the pin is put back and the DEL retried: it must succeed and
// leave nothing of the pod (veth, routes, record, IPAM, endpoint entries,
// masquerade flows, share, quota). The other pod's ADD either succeeded,
// and its flows are masqueraded, or failed and left nothing.
func TestAttack15DelKilledWithForeignPin(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	echoUDP(t, lab.out, 7416)
	warm := a.NewPod()
	a.CleanupDel(warm, "a15kw")
	a.Add(warm, "a15kw")
	p := filepath.Join(datapath.MapsDir(a.PinDir), "cni_snat")
	bin := filepath.Join(testenv.BinDir, "ebpf-cni")
	for i, delay := range []time.Duration{0, 2, 5, 8, 11, 14, 17, 20, 24, 28, 32, 40} {
		delay *= time.Millisecond
		pod, other := a.NewPod(), a.NewPod()
		id, oid := fmt.Sprintf("a15k%d", i), fmt.Sprintf("a15ko%d", i)
		a.CleanupDel(pod, id)
		a.CleanupDel(other, oid)
		r := a.Add(pod, id)
		ip4, ip6 := testenv.PodIPs(t, r)
		hostIf, ifindex := a.HostVeth(id)
		if err := a15MasqFlows(pod, 7416); err != nil {
			t.Errorf("delay %v: the pod's flows: %v", delay, err)
		}
		back, ok := a15SwapPin(t, p)
		if !ok {
			t.Fatal("no foreign cni_snat")
		}
		var addErr error
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, addErr = a.AddV("1.1.0", other, oid, "eth0")
		}()
		var killed string
		must(t, a.InNode(func() error {
			cmd := exec.Command(bin)
			for k, v := range pluginEnv("DEL", id, pod, "eth0") {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			cmd.Stdin = bytes.NewReader(a.StdinConf(nil))
			if err := cmd.Start(); err != nil {
				return err
			}
			time.Sleep(delay)
			cmd.Process.Signal(syscall.SIGKILL)
			if err := cmd.Wait(); err != nil {
				killed = err.Error()
			} else {
				killed = "exit 0"
			}
			return nil
		}))
		wg.Wait()
		back()
		t.Logf("delay %v: the DEL ended: %s; the other pod's ADD: %v", delay, killed, addErr)
		if err := a.Del(pod, id, "eth0"); err != nil {
			t.Errorf("delay %v: the retried DEL with the pin back: %v", delay, err)
		}
		if a.NodeLinkExists(hostIf) {
			t.Errorf("delay %v: the host veth %s left", delay, hostIf)
		}
		for _, ip := range []net.IP{ip4, ip6} {
			if rs := a.HostRoutesTo(ip); len(rs) > 0 {
				t.Errorf("delay %v: the node's routes to %s left", delay, ip)
			}
		}
		if _, serr := os.Stat(a.RecordPath(id, "eth0")); serr == nil {
			t.Errorf("delay %v: the record left", delay)
		}
		if res := a.ReservationsOf(id); len(res) > 0 {
			t.Errorf("delay %v: IPAM reservations left %v", delay, res)
		}
		if m, merr := datapath.OpenMapsLean(a.PinDir); merr == nil {
			eps, _ := m.Maps.Endpoints().List()
			for _, ep := range eps {
				if ep.IP.Equal(ip4) || ep.IP.Equal(ip6) {
					t.Errorf("delay %v: the endpoint entry of %s left", delay, ep.IP)
				}
			}
			m.Close()
		}
		if left := a15NatOf(t, a, ifindex); len(left) > 0 {
			t.Errorf("delay %v: dump nat still shows of ifindex %d: %v", delay, ifindex, left)
		}
		if addErr == nil {
			if err := a15MasqFlows(other, 7416); err != nil {
				t.Errorf("delay %v: the other pod, ADDed beside the killed DEL: its flows: %v", delay, err)
			}
			if err := a.Del(other, oid, "eth0"); err != nil {
				t.Errorf("delay %v: the other pod's DEL: %v", delay, err)
			}
		} else {
			a.Del(other, oid, "eth0")
		}
		a.AssertNothingOfPod(oid, 2) // the warm pod's two addresses
	}
}
