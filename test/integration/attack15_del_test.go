// Attack (round 12 hostile review, attack15) on DEL meeting a map pin of
// another layout (docs/design.md: a step that meets a foreign pin ends
// alone, DEL answers 50 naming the pin, a retry with the pin back leaves
// nothing).

package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

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
	addMasqPod(t, a, "a15w", 7415) // makes every map the node uses pinned
	forEachMapPin(t, datapath.MapsDir(a.PinDir), 50*time.Second, func(_ int, name, p string) {
		a15DelWithForeign(t, a, name, p)
	})
}

func a15DelWithForeign(t *testing.T, a *testenv.Env, name, p string) {
	t.Helper()
	id := "a15d" + strings.ReplaceAll(name, "_", "")
	if len(id) > 40 {
		id = id[:40]
	}
	x := addMasqPod(t, a, id, 7415)
	back, ok := swapForeignPin(t, p)
	if !ok {
		t.Logf("%s: no foreign map of its sizes, skipped", name)
		a.Del(x.pod, id, "eth0")
		return
	}
	err := a.Del(x.pod, id, "eth0")
	if err != nil && !is50Naming(err, p) {
		t.Errorf("DEL with a foreign %s pinned: %v, (code %d), want error 50 naming %s, or success", name, err, testenv.ErrCode(err), p)
	}
	t.Logf("DEL with a foreign %s: code %d: %v", name, testenv.ErrCode(err), err)
	if left := attachmentLeft(t, a, id, x.hif, x.ifindex, x.ips, false); len(left) > 0 {
		t.Errorf("foreign %s: the DEL left %v", name, left)
	}
	back()
	if err := a.Del(x.pod, id, "eth0"); err != nil {
		t.Errorf("foreign %s: DEL again with the pin back: %v", name, err)
	}
	if left := attachmentLeft(t, a, id, x.hif, x.ifindex, x.ips, true); len(left) > 0 {
		t.Errorf("foreign %s: the retried DEL left %v", name, left)
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
	killed := 0
	for i, delay := range []time.Duration{0, 2, 5, 8, 11, 14, 17, 20, 24, 28, 32, 40} {
		delay *= time.Millisecond
		id, oid := fmt.Sprintf("a15k%d", i), fmt.Sprintf("a15ko%d", i)
		x := addMasqPod(t, a, id, 7416)
		other := a.NewPod()
		a.CleanupDel(other, oid)
		back, ok := swapForeignPin(t, p)
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
		werr := a.KillPluginAfter(bin, pluginEnv("DEL", id, x.pod, "eth0"), a.StdinConf(nil), delay)
		if testenv.Killed(werr) {
			killed++
		}
		wg.Wait()
		back()
		t.Logf("delay %v: the DEL ended: %v; the other pod's ADD: %v", delay, werr, addErr)
		if err := a.Del(x.pod, id, "eth0"); err != nil {
			t.Errorf("delay %v: the retried DEL with the pin back: %v", delay, err)
		}
		if left := attachmentLeft(t, a, id, x.hif, x.ifindex, x.ips, true); len(left) > 0 {
			t.Errorf("delay %v: the retried DEL left %v", delay, left)
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
	if killed == 0 {
		t.Error("no SIGKILL landed before the DEL finished: nothing was interrupted")
	}
}
