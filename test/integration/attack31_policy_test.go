// attack31: a networkPolicy ADD's flow tables, made in a goroutine of the
// ADD while IPAM runs (netPolicy.startWithVeth, maps AddFlowTables), and
// the interface marked pending only by Install (MarkPending). The ADD
// killed (SIGKILL, no undo) at each of its steps, retried, and a DEL run
// beside a stopped ADD must leave no flow table, fragment table or policy
// state of an interface that is not attached, and never an attached
// interface without them.

package integration

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// a31PolicyLeft lists the policy flow tables and states of ifindexes other
// than want's (the attached interfaces).
func a31PolicyLeft(t *testing.T, m *maps.Maps, want ...int) []string {
	t.Helper()
	var left []string
	idxs, err := m.Policy().FlowTables()
	must(t, err)
	sort.Ints(idxs)
	for _, i := range idxs {
		if !slices.Contains(want, i) {
			left = append(left, fmt.Sprintf("flow tables of ifindex %d", i))
		}
	}
	for _, w := range want {
		if !slices.Contains(idxs, w) {
			left = append(left, fmt.Sprintf("no flow tables for the attached ifindex %d", w))
		}
	}
	st, err := m.Policy().States()
	must(t, err)
	for i, s := range st {
		if !slices.Contains(want, i) {
			left = append(left, fmt.Sprintf("policy state %v of ifindex %d", s.Mode, i))
		}
	}
	for _, w := range want {
		if _, ok := st[w]; !ok {
			left = append(left, fmt.Sprintf("no policy state for the attached ifindex %d", w))
		}
	}
	return left
}

// TestAttack31PolicyKilledAddSteps: a networkPolicy ADD killed at each of
// its steps after the claim (ipam: its tables made or being made, no state
// yet; endpoints, host, pod: pending, not recorded; recorded: all done but
// the result). The retried ADD is refused (DEL first), the runtime's DEL
// must leave no table or state of it (a warm pod's kept), and the ADD
// after that must attach the pod pending with its tables; its DEL leaves
// nothing.
func TestAttack31PolicyKilledAddSteps(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	bin := crashBinary(t)
	warm := h.NewPod()
	h.Add(warm, "a31pwarm")
	h.CleanupDel(warm, "a31pwarm")
	_, warmIdx := h.HostVeth("a31pwarm")
	m := h.Maps()
	for i, step := range []string{"claimed", "ipam", "endpoints", "host", "pod", "recorded"} {
		id := fmt.Sprintf("a31pk%d", i)
		pod := h.NewPod()
		h.CleanupDel(pod, id)
		envv := pluginEnv("ADD", id, pod, "eth0")
		envv["EBPF_CNI_CRASH_AT"] = step
		out, err := h.RunPlugin(bin, envv, h.StdinConf(nil))
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("ADD killed at %s: %v, want SIGKILL; stdout %s", step, err, out)
		}
		killedIdx := 0
		if h.NodeLinkExists(state.HostIfName(id, "eth0")) {
			_, killedIdx = h.HostVeth(id)
		}
		// The runtime retries the ADD: refused, it changes nothing.
		if _, err := h.AddV("1.0.0", pod, id, "eth0"); err == nil {
			t.Errorf("%s: the ADD retried over the killed one succeeded, want refused (DEL first)", step)
		}
		if err := h.Del(pod, id, "eth0"); err != nil {
			t.Fatalf("%s: DEL of the killed ADD: %v", step, err)
		}
		if left := a31PolicyLeft(t, m, warmIdx); len(left) > 0 {
			t.Errorf("ADD killed at %s (veth ifindex %d), then its DEL: left %v", step, killedIdx, left)
		}
		if _, err := h.AddV("1.0.0", pod, id, "eth0"); err != nil {
			t.Fatalf("%s: ADD after the DEL: %v", step, err)
		}
		_, idx := h.HostVeth(id)
		if left := a31PolicyLeft(t, m, warmIdx, idx); len(left) > 0 {
			t.Errorf("ADD killed at %s, DEL, ADD again (ifindex %d): %v", step, idx, left)
		}
		if st, ok, err := m.Policy().StateOf(idx); err != nil || !ok || st.Mode != [2]uint8{maps.PolicyPending, maps.PolicyPending} {
			t.Errorf("%s: the ADD after the DEL left state %+v %v %v, want pending both ways", step, st, ok, err)
		}
		must(t, h.Del(pod, id, "eth0"))
	}
	must(t, h.Del(warm, "a31pwarm", "eth0"))
	if left := a31PolicyLeft(t, m); len(left) > 0 {
		t.Errorf("after every DEL: %v", left)
	}
	h.AssertClean()
}

// TestAttack31PolicyDelBesideStoppedAdd: a networkPolicy ADD stopped at
// each step from its claim on (its flow tables made, or made and the interface
// pending); the runtime's DEL of it runs meanwhile (it waits for the ADD
// until its record is complete); then the ADD goes on. Whatever each ends
// with, the pod is either attached (recorded) with its pending state and
// its tables, or has nothing (no veth, table or state), and the last DEL
// leaves nothing.
func TestAttack31PolicyDelBesideStoppedAdd(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	warm := h.NewPod()
	h.Add(warm, "a31dwarm") // the datapath and its pins exist
	h.CleanupDel(warm, "a31dwarm")
	_, warmIdx := h.HostVeth("a31dwarm")
	m := h.Maps()
	for i, step := range []string{"claimed", "ipam", "endpoints", "pod", "recorded"} {
		id := fmt.Sprintf("a31pd%d", i)
		pod := h.NewPod()
		h.CleanupDel(pod, id)
		add, _ := stoppedAdd(t, h.Env, pod, id, "eth0", step)
		delErr := make(chan error, 1)
		go func() { delErr <- h.Del(pod, id, "eth0") }()
		var derr error
		delFirst := false
		select {
		case derr = <-delErr:
			delFirst = true
		case <-time.After(3 * time.Second): // it waits for the ADD
		}
		add.Process.Signal(syscall.SIGCONT)
		aerr := add.Wait()
		if !delFirst {
			select {
			case derr = <-delErr:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: the DEL beside the ADD did not end 30 s after the ADD did (%v)", step, aerr)
			}
		}
		t.Logf("%s: DEL beside the stopped ADD: %v (ended before the ADD went on: %v); ADD: %v", step, derr, delFirst, aerr)
		recorded := false
		if r, err := h.Store().Read(id, "eth0"); err == nil && r != nil && !r.Provisional {
			recorded = true
		}
		hostIf := state.HostIfName(id, "eth0")
		switch {
		case recorded:
			// The ADD's record stands: attached, judged.
			if !h.NodeLinkExists(hostIf) {
				t.Errorf("%s: ADD %v, DEL %v (before the ADD went on: %v): recorded, no host veth", step, aerr, derr, delFirst)
			} else {
				_, idx := h.HostVeth(id)
				if left := a31PolicyLeft(t, m, warmIdx, idx); len(left) > 0 {
					t.Errorf("%s: the ADD won over the DEL (ifindex %d): %v", step, idx, left)
				}
			}
		default:
			// No record: the ADD failed, or the DEL came after it
			// (at recorded, the ADD was done when the DEL ran, and its
			// success is printed after): nothing of it.
			if h.NodeLinkExists(hostIf) {
				t.Errorf("%s: ADD %v, DEL %v (before the ADD went on: %v): the host veth is left", step, aerr, derr, delFirst)
			}
			if left := a31PolicyLeft(t, m, warmIdx); len(left) > 0 {
				t.Errorf("%s: ADD %v, DEL %v (before the ADD went on: %v): left %v", step, aerr, derr, delFirst, left)
			}
		}
		if err := h.Del(pod, id, "eth0"); err != nil {
			t.Errorf("%s: the last DEL: %v", step, err)
		}
		if left := a31PolicyLeft(t, m, warmIdx); len(left) > 0 {
			t.Errorf("%s: after the last DEL: %v", step, left)
		}
	}
	must(t, h.Del(warm, "a31dwarm", "eth0"))
	if left := a31PolicyLeft(t, m); len(left) > 0 {
		t.Errorf("after every DEL: %v", left)
	}
	h.AssertClean()
}

// TestAttack31PolicyStoppedAddUnreachable: a networkPolicy ADD stopped at
// each step after its Install (endpoints: the endpoint entries written;
// host, pod: the routes each side; recorded: everything but the result),
// then let go: the pod, serving TCP, is never reachable from a pod whose
// own policy is open, while stopped nor once added (pending until the
// agent's first write). Control: its policy written open, the same dial
// reaches it.
func TestAttack31PolicyStoppedAddUnreachable(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	p.apply(t, "a", policy.Endpoint{})
	for i, step := range []string{"endpoints", "host", "pod", "recorded"} {
		id := fmt.Sprintf("a31pu%d", i)
		pod := p.NewPod()
		p.CleanupDel(pod, id)
		serve(t, pod, 8080, id)
		add, out := stoppedAdd(t, p.Env, pod, id, "eth0", step)
		var ips []net.IP
		for _, s := range p.ReservationsOf(id) {
			ips = append(ips, net.ParseIP(s))
		}
		if len(ips) == 0 {
			t.Fatalf("%s: no IPAM reservation of the stopped ADD", step)
		}
		for _, ip := range ips {
			blocked(t, p.a, "tcp", ip, 8080)
		}
		add.Process.Signal(syscall.SIGCONT)
		if err := add.Wait(); err != nil {
			t.Fatalf("%s: the ADD let go: %v\n%s", step, err, out)
		}
		for _, ip := range ips {
			blocked(t, p.a, "tcp", ip, 8080)
		}
		_, idx := p.HostVeth(id)
		p.idx[id] = uint32(idx)
		p.apply(t, id, policy.Endpoint{})
		for _, ip := range ips {
			reach(t, p.a, "tcp", ip, 8080, id)
		}
		must(t, p.Del(pod, id, "eth0"))
	}
}
