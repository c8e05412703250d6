// Per-pod trace events (issue 25): `ebpf-agent events --trace-pod` and
// `observe --trace` make every program's decision on one pod's packets an
// event, in the order the packet met them.

package integration

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// hop is one trace event as the test compares it.
type hop struct {
	prog, dir, reason string
	icmpType          uint16
}

func (h hop) String() string {
	return fmt.Sprintf("%s/%s/%s/type%d", h.prog, h.dir, h.reason, h.icmpType)
}

// echoHops returns the trace events of pod after seq that are ICMP echo
// requests or replies (the pod's kernel sends its own ND and ARP, traced
// too), once as many as want came or 3 s passed; and the last seq read.
func echoHops(t *testing.T, e *testenv.Env, pod string, seq uint64, want int) ([]hop, []events.Record, uint64) {
	t.Helper()
	var hops []hop
	var recs []events.Record
	deadline := time.Now().Add(3 * time.Second)
	for {
		hops, recs = hops[:0], recs[:0]
		for _, r := range observeJSON(t, e, "--last", "1000", "--pod", pod) {
			if r.Seq <= seq || r.Type != "trace" {
				continue
			}
			echo := (r.Protocol == "icmp" && (r.SrcPort == 8 || r.SrcPort == 0)) ||
				(r.Protocol == "icmpv6" && (r.SrcPort == 128 || r.SrcPort == 129))
			if echo {
				hops = append(hops, hop{r.Program, r.Direction, r.Reason, r.SrcPort})
				recs = append(recs, r)
			}
		}
		if len(hops) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return hops, recs, lastSeq(t, e)
}

func sameHops(got, want []hop) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// TestEventsTracePod: one ping of a traced pod to a pod of the node and one
// to the node, IPv4 and IPv6, show each program's decision in order (the
// source's from_container redirects into the peer, the peer's
// from_container redirects the reply back; to the node, from_container
// hands it to the stack and to_container delivers the reply), with the map
// entry used (the other pod's host veth). An untraced pod's own packets
// show nothing; turned off, neither does the traced pod's; the switch
// costs the packets of other pods nothing (no event at all for them).
func TestEventsTracePod(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "tra")
	e.CleanupDel(b, "trb")
	e.AddK8s(a, "tra", "shop", "traced")
	b4, b6 := testenv.PodIPs(t, e.AddK8s(b, "trb", "shop", "other"))
	_, aIdx := e.HostVeth("tra")
	_, bIdx := e.HostVeth("trb")
	agent := func(args ...string) string {
		t.Helper()
		out, err := e.AgentCmd(append([]string{"events", "--state-dir", e.StateDir, "--pin-dir", e.PinDir}, args...)...)
		if err != nil {
			t.Fatalf("events %v: %v\n%s", args, err, out)
		}
		return out
	}
	if out := agent("--trace-pod", "shop/traced"); !strings.Contains(out, "trace: on (pods: shop/traced)") {
		t.Fatalf("events --trace-pod shop/traced printed:\n%s", out)
	}
	m := e.Maps()
	if s, err := m.Events().Settings(); err != nil || !s.Trace || !s.Drops {
		t.Fatalf("settings after --trace-pod: %+v, %v; want the trace on and drops as they were", s, err)
	}
	seq := lastSeq(t, e)
	for _, c := range []struct {
		name   string
		dst    net.IP
		req    uint16
		rep    uint16
		want   []string // prog/dir/reason of the request, then the reply
		entryB bool     // both events name b's host veth as their entry
	}{
		{"pod-v4", b4, 8, 0, []string{"from_container/egress/redirect", "from_container/ingress/redirect"}, true},
		{"pod-v6", b6, 128, 129, []string{"from_container/egress/redirect", "from_container/ingress/redirect"}, true},
		{"node-v4", testenv.NodeIP4, 8, 0, []string{"from_container/egress/forward", "to_container/ingress/forward"}, false},
		{"node-v6", testenv.NodeIP6, 128, 129, []string{"from_container/egress/forward", "to_container/ingress/forward"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			must(t, testenv.Ping(a, c.dst, 1))
			var want []hop
			for i, w := range c.want {
				f := strings.Split(w, "/")
				ty := c.req
				if i == 1 {
					ty = c.rep
				}
				want = append(want, hop{f[0], f[1], f[2], ty})
			}
			got, recs, last := echoHops(t, e, "shop/traced", seq, len(want))
			seq = last
			if !sameHops(got, want) {
				t.Fatalf("trace of one ping to %s: %v, want %v\n%+v", c.dst, got, want, recs)
			}
			t.Logf("trace of one ping to %s: %v", c.dst, got)
			for _, r := range recs {
				if r.Ifindex != uint32(aIdx) || r.Pod != "shop/traced" || r.Verdict != "forwarded" {
					t.Errorf("trace event not of the traced pod's interface %d: %+v", aIdx, r)
				}
				if c.entryB && r.Entry != uint32(bIdx) {
					t.Errorf("redirect's map entry %d, want b's host veth %d: %+v", r.Entry, bIdx, r)
				}
			}
		})
	}

	// b's own packets to the node: b is not traced.
	must(t, testenv.Ping(b, testenv.NodeIP4, 1))
	time.Sleep(300 * time.Millisecond)
	for _, r := range observeJSON(t, e, "--last", "1000") {
		if r.Seq > seq && r.Type == "trace" && r.Ifindex != uint32(aIdx) {
			t.Errorf("a trace event of an endpoint not traced: %+v", r)
		}
	}
	seq = lastSeq(t, e)

	// Off: the traced pod's ping shows nothing, and the switch is off.
	if out := agent("--trace-pod", "shop/traced=off"); strings.Contains(out, "trace: on") {
		t.Fatalf("events --trace-pod shop/traced=off printed:\n%s", out)
	}
	if s, _ := m.Events().Settings(); s.Trace {
		t.Errorf("the trace switch stayed on with no pod traced: %+v", s)
	}
	must(t, testenv.Ping(a, b4, 1))
	if got, recs, _ := echoHops(t, e, "shop/traced", seq, 1); len(got) != 0 {
		t.Errorf("trace off, still trace events: %+v", recs)
	}
	seq = lastSeq(t, e)

	// observe --trace: on while it follows, off when it stops.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(testenv.BinDir, "ebpf-agent"), "observe", "-o", "json",
		"--state-dir", e.StateDir, "--pin-dir", e.PinDir, "--trace", "shop/traced")
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) } // as Ctrl-C: observe turns the trace off
	var out strings.Builder
	cmd.Stdout = &out
	must(t, cmd.Start())
	on := false
	for deadline := time.Now().Add(2 * time.Second); !on && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		s, _ := m.Events().Settings()
		on = s.Trace
	}
	if !on {
		t.Fatal("observe --trace did not turn the trace on")
	}
	must(t, testenv.Ping(a, b4, 1))
	time.Sleep(500 * time.Millisecond)
	cancel()
	cmd.Wait()
	if s, _ := m.Events().Settings(); s.Trace {
		t.Errorf("observe --trace stopped, the trace switch still on")
	}
	if ids, _ := m.Events().TraceEndpoints(); len(ids) != 0 {
		t.Errorf("observe --trace stopped, endpoints still traced: %v", ids)
	}
	if !strings.Contains(out.String(), `"type":"trace"`) || !strings.Contains(out.String(), `"program":"from_container"`) {
		t.Errorf("observe --trace printed no trace event of the ping:\n%s", out.String())
	}

	// Killed (SIGKILL) before it could turn its trace off: the trace ends
	// by itself at the end of its lease.
	started := time.Now()
	kill := exec.Command(filepath.Join(testenv.BinDir, "ebpf-agent"), "observe", "-o", "json",
		"--state-dir", e.StateDir, "--pin-dir", e.PinDir, "--trace", "shop/traced", "--trace-for", "3s")
	must(t, kill.Start())
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if s, _ := m.Events().Settings(); s.Trace {
			break
		}
	}
	must(t, kill.Process.Kill())
	kill.Wait()
	seq = lastSeq(t, e)
	must(t, testenv.Ping(a, b4, 1))
	if got, recs, _ := echoHops(t, e, "shop/traced", seq, 2); len(got) != 2 {
		t.Fatalf("observe --trace killed at once: the trace is on for its lease, want the ping's 2 events: %+v", recs)
	}
	time.Sleep(time.Until(started.Add(4500 * time.Millisecond)))
	seq = lastSeq(t, e)
	must(t, testenv.Ping(a, b4, 1))
	if got, recs, _ := echoHops(t, e, "shop/traced", seq, 1); len(got) != 0 {
		t.Errorf("observe --trace killed 4.5 s ago with a 3 s lease: still trace events: %+v", recs)
	}
	if tr, _ := m.Events().TraceEndpoints(); len(tr) != 0 {
		t.Errorf("endpoints still traced after the lease: %v", tr)
	}
	if s, _ := m.Events().Settings(); s.Trace {
		t.Errorf("the trace switch reads on after the lease: %+v", s)
	}
	// The agent clears the ended trace's bits and switch in its sweep.
	must(t, m.Events().EndTraces())
	if out := agent(); strings.Contains(out, "trace:") {
		t.Errorf("events after the trace ended still names one:\n%s", out)
	}
}

// TestEventsTraceMasqueraded: a traced pod's ping to a host outside, which
// the node masquerades, shows the four programs in order: from_container
// hands it to the stack, to_uplink sends it translated (the node's
// address), from_uplink translates the reply back (the pod's address),
// to_container delivers it.
func TestEventsTraceMasqueraded(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, true)
	for _, pod := range []string{"a", "b", "h"} {
		p.apply(t, pod, policy.Endpoint{})
	}
	e := p.Env
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	_, aIdx := e.HostVeth("a")
	m := p.m
	until := time.Now().Add(time.Minute)
	must(t, m.Events().SetTrace(uint32(aIdx), until))
	s, err := m.Events().Settings()
	must(t, err)
	s.Trace, s.TraceUntil = true, until
	must(t, m.Events().SetSettings(s))
	seq := lastSeq(t, e)
	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("ipv%d", fam), func(t *testing.T) {
			must(t, testenv.Ping(p.a, remoteIP[fam], 1))
			req, rep := uint16(8), uint16(0)
			if fam == 6 {
				req, rep = 128, 129
			}
			want := []hop{{"from_container", "egress", "forward", req}, {"to_uplink", "egress", "forward", req},
				{"from_uplink", "ingress", "forward", rep}, {"to_container", "ingress", "forward", rep}}
			var got []hop
			var recs []events.Record
			deadline := time.Now().Add(3 * time.Second)
			for {
				got, recs = got[:0], recs[:0]
				for _, r := range observeJSON(t, e, "--last", "1000") {
					echo := (r.Protocol == "icmp" && (r.SrcPort == 8 || r.SrcPort == 0)) ||
						(r.Protocol == "icmpv6" && (r.SrcPort == 128 || r.SrcPort == 129))
					if r.Seq > seq && r.Type == "trace" && echo {
						got = append(got, hop{r.Program, r.Direction, r.Reason, r.SrcPort})
						recs = append(recs, r)
					}
				}
				if len(got) >= len(want) || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			seq = lastSeq(t, e)
			if !sameHops(got, want) {
				t.Fatalf("trace of one masqueraded ping: %v, want %v\n%+v", got, want, recs)
			}
			t.Logf("trace of one masqueraded ping: %v", got)
			// The tuple each program saw: translated after to_uplink, back
			// to the pod's address at from_uplink.
			if recs[1].Src != uplinkIP[fam].String() || recs[2].Dst != p.ip["a"][fam].String() || recs[0].Src != p.ip["a"][fam].String() {
				t.Errorf("addresses along the trace: %+v", recs)
			}
			for _, r := range recs {
				if r.Ifindex != uint32(aIdx) {
					t.Errorf("trace event of another endpoint: %+v", r)
				}
			}
		})
	}
}

// TestEventsTraceTwoInterfaces: a pod with two interfaces of the network
// is traced on both; DEL of one forgets that interface's switches and
// leaves the other's trace running.
func TestEventsTraceTwoInterfaces(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "two")
	e.AddK8s(pod, "two", "shop", "two")
	rt := e.RuntimeConf(pod, "two", "net1")
	rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", "two"}}
	t.Cleanup(func() { _ = e.Del(pod, "two", "net1") })
	if _, err := e.AddList(e.ConfList("1.1.0"), rt); err != nil {
		t.Fatalf("ADD net1: %v", err)
	}
	eth0 := e.HostIfindex(state.HostIfName("two", "eth0"))
	net1 := e.HostIfindex(state.HostIfName("two", "net1"))
	out, err := e.AgentCmd("events", "--state-dir", e.StateDir, "--pin-dir", e.PinDir, "--trace-pod", "shop/two", "--flows-pod", "shop/two")
	if err != nil {
		t.Fatalf("events --trace-pod: %v\n%s", err, out)
	}
	m := e.Maps()
	tr, err := m.Events().TraceEndpoints()
	must(t, err)
	if _, ok := tr[uint32(eth0)]; !ok || len(tr) != 2 {
		t.Fatalf("traced endpoints %v, want eth0's %d and net1's %d", tr, eth0, net1)
	}
	if _, ok := tr[uint32(net1)]; !ok {
		t.Fatalf("traced endpoints %v, want net1's %d", tr, net1)
	}
	must(t, e.Del(pod, "two", "net1"))
	tr, err = m.Events().TraceEndpoints()
	must(t, err)
	flows, err := m.Events().FlowEndpoints()
	must(t, err)
	if _, ok := tr[uint32(eth0)]; !ok || len(tr) != 1 || len(flows) != 1 || flows[0] != uint32(eth0) {
		t.Errorf("after DEL of net1: traced %v, flow events %v; want eth0's %d alone in each", tr, flows, eth0)
	}
	if s, _ := m.Events().Settings(); !s.Trace {
		t.Errorf("after DEL of net1 the trace switch is off, eth0 still traced: %+v", s)
	}
	e.MustDel(pod, "two")
	if tr, _ := m.Events().TraceEndpoints(); len(tr) != 0 {
		t.Errorf("after DEL of the pod, still traced: %v", tr)
	}
	// No endpoint traced: the agent's sweep turns the switch off before
	// the trace's end (else every pod's packets take the slow path).
	must(t, m.Events().EndTraces())
	if s, _ := m.Events().Settings(); s.Trace {
		t.Errorf("no endpoint traced, the switch stays on after EndTraces: %+v", s)
	}
}
