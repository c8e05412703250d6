// Attack26 (black box): DEL is idempotent, works when the netns or the
// veth is gone, survives being killed anywhere, and races with itself and
// with an ADD of the same attachment leave either the whole attachment or
// nothing of it (docs/design.md, "Guarantees"). What is left is read from
// the node: veth, link pins, record, IPAM lease, endpoint / links entries
// and counters in the pin dir's maps (testenv's Traces).

package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a26Delays are the points at which a concurrent act lands on a DEL: 0 to
// the whole of a DEL of a warm-up pod, measured here, in eighths.
func a26Delays(t *testing.T, e *testenv.Env) []time.Duration {
	t.Helper()
	pod, _ := e.RunPod("a26warm")
	start := time.Now()
	e.MustDel(pod, "a26warm")
	took := time.Since(start)
	t.Logf("a DEL took %v (load %s)", took, testenv.Loadavg())
	var ds []time.Duration
	for k := 0; k <= 8; k += 1 + k/4 {
		ds = append(ds, took*time.Duration(k)/8)
	}
	return ds
}

// a26AssertNothing fails when anything of attachment a is left, once its
// host veth had time to go with its netns.
func a26AssertNothing(t *testing.T, e *testenv.Env, a *testenv.Attachment, round string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.NodeLinkExists(a.HostIf) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if tr := e.Traces(a); len(tr) > 0 {
		t.Errorf("%s: left of %s:\n  %s", round, a.ID, strings.Join(tr, "\n  "))
	}
}

// TestAttack26DelNetnsRemovedMidway: the pod's netns is removed while its
// DEL runs (0 to a DEL's length into it); that DEL and a second one (the runtime's retry)
// succeed, and nothing of the pod is left.
func TestAttack26DelNetnsRemovedMidway(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	for i, d := range a26Delays(t, e) {
		id := fmt.Sprintf("a26nsg%d", i)
		pod := e.NewPod()
		a := e.AddAttachment(pod, id)
		var wg sync.WaitGroup
		var delErr error
		wg.Add(1)
		go func() { defer wg.Done(); delErr = e.Del(pod, id, "eth0") }()
		time.Sleep(d)
		if err := testenv.RemoveNS(pod); err != nil {
			t.Fatalf("remove the netns: %v", err)
		}
		wg.Wait()
		round := fmt.Sprintf("netns removed after %v", d)
		if delErr != nil {
			t.Errorf("%s: the DEL: %v", round, delErr)
		}
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Errorf("%s: the second DEL: %v", round, err)
		}
		a26AssertNothing(t, e, a, round)
	}
}

// TestAttack26DelTwiceConcurrent: two DELs of one attachment at once (the
// second 0 to a DEL's length after the first): both succeed, nothing is left.
func TestAttack26DelTwiceConcurrent(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	for i, d := range a26Delays(t, e) {
		id := fmt.Sprintf("a26dd%d", i)
		pod := e.NewPod()
		e.CleanupDel(pod, id)
		a := e.AddAttachment(pod, id)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for j := range errs {
			wg.Add(1)
			go func(j int) {
				defer wg.Done()
				if j == 1 {
					time.Sleep(d)
				}
				errs[j] = e.Del(pod, id, "eth0")
			}(j)
		}
		wg.Wait()
		round := fmt.Sprintf("two DELs %v apart", d)
		for j, err := range errs {
			if err != nil {
				t.Errorf("%s: DEL %d: %v", round, j, err)
			}
		}
		a26AssertNothing(t, e, a, round)
	}
}

// TestAttack26AddDuringDel: an ADD of the same container and ifname
// 0-20 ms into its DEL. Whichever wins, the attachment is then whole
// (record, veth, lease, endpoint entries and routes to the veth) or gone
// (nothing left); a last DEL leaves nothing.
func TestAttack26AddDuringDel(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	for i, d := range a26Delays(t, e) {
		id := fmt.Sprintf("a26ad%d", i)
		pod := e.NewPod()
		e.CleanupDel(pod, id)
		a := e.AddAttachment(pod, id)
		var wg sync.WaitGroup
		var delErr error
		wg.Add(1)
		go func() { defer wg.Done(); delErr = e.Del(pod, id, "eth0") }()
		time.Sleep(d)
		res, addErr := e.AddV("1.1.0", pod, id, "eth0")
		wg.Wait()
		round := fmt.Sprintf("ADD %v into the DEL", d)
		if delErr != nil {
			t.Errorf("%s: DEL: %v", round, delErr)
		}
		if addErr == nil {
			b := &testenv.Attachment{Pod: pod, ID: id, IfName: "eth0", HostIf: a.HostIf}
			b.Ifindex = e.HostIfindex(a.HostIf)
			b.IPs = a26ResultIPs(t, res)
			t.Logf("%s: the ADD won (ifindex %d)", round, b.Ifindex)
			a26AssertWhole(t, e, b, round)
		} else if tr := e.Traces(a); len(tr) > 0 {
			t.Errorf("%s: the ADD failed (%v), the DEL left:\n  %s", round, addErr, strings.Join(tr, "\n  "))
		}
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Errorf("%s: the last DEL: %v", round, err)
		}
		a26AssertNothing(t, e, a, round+", then DEL")
	}
}

// TestAttack26DelKilled: DEL killed with SIGKILL at 0 to its length, wherever it
// is, then DEL again: it succeeds and nothing of the pod is left.
func TestAttack26DelKilled(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	bin := filepath.Join(testenv.BinDir, "ebpf-cni")
	killed := 0
	ds := a26Delays(t, e)
	n := len(ds)
	ds = append(ds, ds[n-2]*2, ds[n-1]*2) // and past the warm-up's length: a cold DEL is slower
	for i, d := range ds {
		id := fmt.Sprintf("a26k%d", i)
		pod := e.NewPod()
		e.CleanupDel(pod, id)
		a := e.AddAttachment(pod, id)
		if testenv.Killed(e.KillPluginAfter(bin, pluginEnv("DEL", id, pod, "eth0"), e.StdinConf(nil), d)) {
			killed++
		}
		round := fmt.Sprintf("DEL killed after %v", d)
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Errorf("%s: DEL again: %v", round, err)
		}
		a26AssertNothing(t, e, a, round)
	}
	t.Logf("%d of %d DELs killed before they finished", killed, len(ds))
	a26AgentSeesNothing(t, e)
}

// a26AgentSeesNothing fails unless `ebpf-agent dump endpoints` and `dump
// attachments` list nothing on the node (every pod of the test DELed).
func a26AgentSeesNothing(t *testing.T, e *testenv.Env) {
	t.Helper()
	confDir := e.WriteConfDir()
	for _, what := range []string{"endpoints", "attachments"} {
		out, err := e.AgentCmd(append([]string{"dump", what, "-o", "json"}, e.AgentArgs(confDir)...)...)
		if err != nil {
			t.Errorf("dump %s: %v\n%s", what, err, out)
			continue
		}
		var rows []json.RawMessage
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Errorf("dump %s: bad JSON: %v\n%s", what, err, out)
		} else if len(rows) > 0 {
			t.Errorf("dump %s lists %d rows after every pod was DELed:\n%s", what, len(rows), out)
		}
	}
}

// a26ResultIPs are the addresses of an ADD's result.
func a26ResultIPs(t *testing.T, res types.Result) []net.IP {
	t.Helper()
	r, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatalf("ADD result: %v", err)
	}
	var ips []net.IP
	for _, ipc := range r.IPs {
		ips = append(ips, ipc.Address.IP)
	}
	return ips
}

// a26AssertWhole fails unless attachment b is whole: its record, host veth
// (with its alias), lease, and its addresses' endpoint entries and routes
// leading to its veth.
func a26AssertWhole(t *testing.T, e *testenv.Env, b *testenv.Attachment, round string) {
	t.Helper()
	if _, err := os.Stat(e.RecordPath(b.ID, b.IfName)); err != nil {
		t.Errorf("%s: the ADD won but its record is missing: %v", round, err)
	}
	if len(e.ReservationsOf(b.ID)) != len(b.IPs) {
		t.Errorf("%s: the ADD won but IPAM holds %v for it, want %v", round, e.ReservationsOf(b.ID), b.IPs)
	}
	if l := a26Link(t, e, b.Ifindex); l == nil || !strings.HasSuffix(l.Attrs().Alias, "/"+b.ID+"/eth0") {
		t.Errorf("%s: the ADD won but its host veth is missing or not aliased: %v", round, l)
	}
	e.AssertOwns(t, b)
}
