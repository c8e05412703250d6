// How a pod's hooks are attached and its veth deleted while the agent runs:
// ADD attaches cls_bpf and the agent moves the pod to tcx links when no
// verb runs; DEL hands the veth off and the agent deletes it. Without the
// agent, ADD attaches tcx and DEL deletes, as they always did.

package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// quietV4 makes the env IPv4-only with IPv6 off in the node and in every
// netns passed, so the only packets on the pods' veths are the test's own
// (no DAD, MLD or router solicitations to blur exact counts).
func quietV4(t *testing.T, e *testenv.Env, pods ...ns.NetNS) {
	t.Helper()
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}}
	for _, n := range append([]ns.NetNS{e.Node}, pods...) {
		err := n.Do(func(ns.NetNS) error {
			for _, f := range []string{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "/proc/sys/net/ipv6/conf/default/disable_ipv6"} {
				if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// pingStats runs ping in netns and returns packets transmitted and received.
func pingStats(netns ns.NetNS, ip net.IP, count int, interval string) (tx, rx int, out string, err error) {
	netns.Do(func(ns.NetNS) error {
		var b []byte
		b, err = exec.Command("ping", "-c", strconv.Itoa(count), "-i", interval, "-W", "1", "-q", ip.String()).CombinedOutput()
		out = string(b)
		return nil
	})
	m := regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`).FindStringSubmatch(out)
	if m == nil {
		return 0, 0, out, fmt.Errorf("ping %s: %v: %s", ip, err, out)
	}
	tx, _ = strconv.Atoi(m[1])
	rx, _ = strconv.Atoi(m[2])
	return tx, rx, out, nil
}

// TestAgentMovesPodsToTCXUnderTraffic: with the agent running, ADD attaches
// cls_bpf filters waiting for tcx, and the agent leaves them while a verb
// runs. Released, it moves both pods to pinned tcx links while pings flow
// pod to pod (host veth ingress of both) and node to pod (host veth egress):
// no echo is lost and the datapath counts every packet exactly once.
func TestAgentMovesPodsToTCXUnderTraffic(t *testing.T) {
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	quietV4(t, e, a, b)
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	release := e.HoldVerbs()
	e.CleanupDel(a, "a")
	e.CleanupDel(b, "b")
	ra, rb := e.Add(a, "a"), e.Add(b, "b")
	a4, b4 := ra.IPs[0].Address.IP, rb.IPs[0].Address.IP
	hostA, idxA := e.HostVeth("a")
	hostB, idxB := e.HostVeth("b")
	time.Sleep(300 * time.Millisecond) // the agent is idle, but a verb "runs"
	for _, h := range []string{hostA, hostB} {
		if st := e.AttachState(h); st != datapath.StateTCPending {
			t.Fatalf("%s is %q after ADD with the agent running and a verb in progress, want %q", h, st, datapath.StateTCPending)
		}
	}
	if err := e.Check(a, "a", "eth0"); err != nil {
		t.Errorf("CHECK of a pod waiting for tcx: %v", err)
	}

	m := e.Maps()
	type ctr struct {
		idx    int
		dir    maps.Dir
		reason maps.Reason
	}
	watch := []ctr{
		{idxA, maps.DirEgress, maps.ReasonRedirect}, // a -> b requests (a's ingress hook)
		{idxB, maps.DirEgress, maps.ReasonRedirect}, // b -> a replies (b's ingress hook)
		{idxA, maps.DirIngress, maps.ReasonForward}, // node -> a requests (a's egress hook)
		{idxA, maps.DirEgress, maps.ReasonForward},  // a -> node replies (a's ingress hook)
	}
	before := make([]uint64, len(watch))
	for i, c := range watch {
		before[i] = counter(t, m, c.idx, c.dir, c.reason).Packets
	}

	const n = 2500 // 2 ms apart: 5 s or more of traffic
	type res struct {
		tx, rx int
		out    string
		err    error
	}
	podPing, nodePing := make(chan res, 1), make(chan res, 1)
	go func() {
		var r res
		r.tx, r.rx, r.out, r.err = pingStats(a, b4, n, "0.002")
		podPing <- r
	}()
	go func() {
		var r res
		r.tx, r.rx, r.out, r.err = pingStats(e.Node, a4, n, "0.002")
		nodePing <- r
	}()
	for deadline := time.Now().Add(5 * time.Second); counter(t, m, idxA, maps.DirEgress, maps.ReasonRedirect).Packets < before[0]+50; {
		if time.Now().After(deadline) {
			t.Fatalf("traffic is not flowing: %s", dumpCounters(m, idxA))
		}
		time.Sleep(5 * time.Millisecond)
	}
	release()
	took := e.WaitAttachState(hostA, datapath.StateTCX, 20*time.Second)
	e.WaitAttachState(hostB, datapath.StateTCX, 20*time.Second)
	var still bool
	select {
	case r := <-podPing:
		podPing <- r
	default:
		still = true
	}
	if !still {
		t.Fatalf("the pings ended before both pods were on tcx (%s): the switch was not under traffic", took)
	}
	t.Logf("both pods on tcx %s after the verbs ended, traffic running", took)

	pp, np := <-podPing, <-nodePing
	for what, r := range map[string]res{"pod to pod": pp, "node to pod": np} {
		if r.err != nil || r.tx != n || r.rx != n {
			t.Errorf("%s: %d sent, %d answered of %d (%v):\n%s", what, r.tx, r.rx, n, r.err, r.out)
		}
	}
	names := []string{"a's ingress hook, redirected to b", "b's ingress hook, redirected to a", "a's egress hook, from the node", "a's ingress hook, to the node"}
	for i, c := range watch {
		if got := counter(t, m, c.idx, c.dir, c.reason).Packets - before[i]; got != n {
			t.Errorf("%s: counted %d packets, want %d (each echo exactly once)", names[i], got, n)
		}
	}
	for _, h := range []string{hostA, hostB} {
		for _, dir := range []string{datapath.DirIngress, datapath.DirEgress} {
			if _, err := os.Stat(datapath.LinkPinPath(e.PinDir, h, dir)); err != nil {
				t.Errorf("%s %s tcx link pin: %v", h, dir, err)
			}
		}
	}
	if err := e.Check(a, "a", "eth0"); err != nil {
		t.Errorf("CHECK after the move to tcx: %v", err)
	}
	e.MustDel(a, "a")
	e.MustDel(b, "b")
	e.AssertClean()
}

// TestDelHandsOffToAgent: with the agent running, DEL returns with the
// pod's interface name, the host veth's name, the node's routes and
// neighbours to the pod and its addresses all free, the pair down and
// renamed for the agent to delete; an ADD of the same pod right after gets
// the same address and works; the agent then deletes the pair.
func TestDelHandsOffToAgent(t *testing.T) {
	e := testenv.New(t)
	// One address per family: a new ADD can only work if DEL freed it.
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{
		{{"subnet": testenv.PodSubnet4, "rangeStart": "10.250.0.10", "rangeEnd": "10.250.0.10"}},
		{{"subnet": testenv.PodSubnet6, "rangeStart": "fd00:250::10", "rangeEnd": "fd00:250::10"}},
	}}
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", ag.Logs())
		}
	})
	pod := e.NewPod()
	e.CleanupDel(pod, "c")
	r1 := e.Add(pod, "c")
	hostIf, idx := e.HostVeth("c")
	e.WaitAttachState(hostIf, datapath.StateTCX, 20*time.Second)
	release := e.HoldVerbs() // the agent must not delete the pair before we look
	e.MustDel(pod, "c")

	gone := state.HandedOffName(idx)
	if e.NodeLinkExists(hostIf) {
		t.Errorf("host veth %s still exists under its name after DEL", hostIf)
	}
	e.InNode(func() error {
		l, err := netlink.LinkByName(gone)
		switch {
		case err != nil:
			t.Errorf("no handed-off veth %s after DEL (with the agent running): %v", gone, err)
		case l.Attrs().Index != idx || l.Attrs().Flags&net.FlagUp != 0:
			t.Errorf("handed-off veth %s: ifindex %d (want %d), flags %v (want down)", gone, l.Attrs().Index, idx, l.Attrs().Flags)
		}
		for _, ipc := range r1.IPs {
			fam := netlink.FAMILY_V6
			if ipc.Address.IP.To4() != nil {
				fam = netlink.FAMILY_V4
			}
			neighs, _ := netlink.NeighList(0, fam)
			for _, n := range neighs {
				if n.IP.Equal(ipc.Address.IP) {
					t.Errorf("the node still has a neighbour entry for %s after DEL: %+v", ipc.Address.IP, n)
				}
			}
		}
		return nil
	})
	for _, ipc := range r1.IPs {
		if rs := e.HostRoutesTo(ipc.Address.IP); len(rs) > 0 {
			t.Errorf("the node still routes %s after DEL: %v", ipc.Address.IP, rs)
		}
	}
	for _, dir := range []string{datapath.DirIngress, datapath.DirEgress} {
		if _, err := os.Stat(datapath.LinkPinPath(e.PinDir, hostIf, dir)); err == nil {
			t.Errorf("link pin %s_%s still under the attachment's name", hostIf, dir)
		}
		if _, err := os.Stat(datapath.LinkPinPath(e.PinDir, gone, dir)); err != nil {
			t.Errorf("link pin of the handed-off veth: %v", err)
		}
	}
	pod.Do(func(ns.NetNS) error {
		if _, err := netlink.LinkByName("eth0"); err == nil {
			t.Errorf("eth0 still in the pod after DEL")
		}
		l, err := netlink.LinkByName(gone)
		if err != nil {
			t.Errorf("pod end of the handed-off pair not renamed %s: %v", gone, err)
		} else if l.Attrs().Flags&net.FlagUp != 0 {
			t.Errorf("pod end %s is up", gone)
		}
		return nil
	})
	if rs := e.ReservationsOf("c"); len(rs) > 0 {
		t.Errorf("IPAM still holds %v after DEL", rs)
	}
	if eps, _ := e.Maps().Endpoints().List(); len(eps) > 0 {
		t.Errorf("endpoint entries left after DEL: %v", eps)
	}

	// The same pod again, at once, while the old pair still waits.
	r2 := e.Add(pod, "c")
	for i := range r1.IPs {
		if !r1.IPs[i].Address.IP.Equal(r2.IPs[i].Address.IP) {
			t.Fatalf("re-ADD got %s, want %s", r2.IPs[i].Address.IP, r1.IPs[i].Address.IP)
		}
	}
	e.PodReachable(t, pod, []net.IP{r2.IPs[0].Address.IP, r2.IPs[1].Address.IP})
	if err := e.Check(pod, "c", "eth0"); err != nil {
		t.Errorf("CHECK of the re-added pod: %v", err)
	}
	// Twice handed off before the agent got to either pair.
	_, idx2 := e.HostVeth("c")
	e.MustDel(pod, "c")
	e.MustDel(pod, "c") // idempotent
	for _, g := range []string{gone, state.HandedOffName(idx2)} {
		if !e.NodeLinkExists(g) {
			t.Errorf("handed-off veth %s missing while the agent waits", g)
		}
	}
	release()
	e.AssertClean()
}

// TestWithoutAgentADDDefersTCXAndDELDeletes: with no agent (never started,
// or stopped), ADD attaches cls_bpf filters marked as waiting for tcx (no
// RCU grace period on its path, issue 30) and gives the pod its own
// stack-flow table; the pod is reachable; DEL deletes the veth and the
// table before it returns. An agent started later moves the pod to tcx.
// Before issue 30 ADD attached tcx links here (the test asked for them).
func TestWithoutAgentADDDefersTCXAndDELDeletes(t *testing.T) {
	e := testenv.New(t)
	confDir := e.WriteConfDir()
	for _, round := range []string{"no agent yet", "agent stopped"} {
		pod := e.NewPod()
		e.CleanupDel(pod, "p")
		r := e.Add(pod, "p")
		hostIf, idx := e.HostVeth("p")
		want := datapath.StateTCPending
		if forced(datapath.FeatTCX) {
			want = datapath.StateTC // no tcx to wait for
		}
		if st := e.AttachState(hostIf); st != want {
			t.Errorf("%s: ADD left %s %q, want %q", round, hostIf, st, want)
		}
		if parts, err := e.Maps().StackFlows().Parts(); err != nil || !slices.Contains(parts, idx) {
			t.Errorf("%s: stack-flow tables %v (%v) after ADD, want one for ifindex %d", round, parts, err, idx)
		}
		v4, v6 := testenv.PodIPs(t, r)
		e.PodReachable(t, pod, []net.IP{v4, v6})
		if round == "no agent yet" {
			// The agent's first pass finds the pending pod and moves it.
			ag := e.StartAgent(confDir, "--metrics-addr", "")
			if !forced(datapath.FeatTCX) {
				e.WaitAttachState(hostIf, datapath.StateTCX, 10*time.Second)
			}
			e.PodReachable(t, pod, []net.IP{v4, v6})
			ag.Stop()
		}
		e.MustDel(pod, "p")
		if l := e.Leftovers(); len(l) > 0 {
			t.Errorf("%s: DEL returned with state left: %v", round, l)
		}
	}
}

// TestAgentGivesStackFlowTable: with the agent alive, the pod has its own
// stack-flow table shortly after ADD (a slot of the node's pool, taken by
// ADD; without a free slot the agent makes it once the ADD ended, since
// putting a table in the map of maps waits out an RCU grace period, issue
// 30), and after DEL hands the veth off, it goes with the veth.
func TestAgentGivesStackFlowTable(t *testing.T) {
	e := testenv.New(t)
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", ag.Logs())
		}
	})
	pod := e.NewPod()
	e.CleanupDel(pod, "s")
	r := e.Add(pod, "s")
	_, idx := e.HostVeth("s")
	m := e.Maps()
	deadline := time.Now().Add(10 * time.Second)
	for {
		parts, err := m.StackFlows().Parts()
		if err == nil && slices.Contains(parts, idx) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stack-flow table for ifindex %d 10 s after ADD (tables %v, %v)", idx, parts, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	v4, v6 := testenv.PodIPs(t, r)
	e.PodReachable(t, pod, []net.IP{v4, v6})
	e.MustDel(pod, "s")
	e.AssertClean() // the table too, once the agent deleted the veth
}

// crashAgent builds the agent with -tags crashpoint: EBPF_CNI_CRASH_AT=<step>
// makes it SIGKILL itself at that step of its background work.
func crashAgent(t *testing.T) string {
	t.Helper()
	crashAgentOnce.Do(func() {
		dir := filepath.Join(testenv.BinDir, "crash-agent")
		cmd := exec.Command("go", "build", "-tags", "crashpoint", "-o", dir+"/", "github.com/ebpf-cni/ebpf-cni/cmd/ebpf-agent")
		if out, err := cmd.CombinedOutput(); err != nil {
			crashAgentErr = fmt.Errorf("build crashpoint agent: %v\n%s", err, out)
			return
		}
		crashAgentBin = filepath.Join(dir, "ebpf-agent")
	})
	if crashAgentErr != nil {
		t.Fatal(crashAgentErr)
	}
	return crashAgentBin
}

var (
	crashAgentOnce sync.Once
	crashAgentBin  string
	crashAgentErr  error
)

// killedAt starts the crashpoint agent set to die at step, runs act, and
// waits for the agent to have killed itself there.
func killedAt(t *testing.T, e *testenv.Env, confDir, step string, act func()) {
	t.Helper()
	ag := e.StartAgentBin(crashAgent(t), []string{"EBPF_CNI_CRASH_AT=" + step}, confDir, "--metrics-addr", "")
	act()
	err, ok := ag.Exited(10 * time.Second)
	if !ok {
		t.Fatalf("the agent did not reach %s:\n%s", step, ag.Logs())
	}
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the agent ended with %v, want killed at %s:\n%s", err, step, ag.Logs())
	}
}

// TestAgentKilledMidWorkIsRecovered: an agent killed with SIGKILL between
// the two tcx attaches of a move, right after deleting a handed-off veth
// (before its pins), or before deleting one, leaves a pod that works and
// passes CHECK; the next agent finishes the move and the deletion, and
// without any agent a CNI GC deletes what was handed off.
func TestAgentKilledMidWorkIsRecovered(t *testing.T) {
	e := testenv.New(t)
	confDir := e.WriteConfDir()
	pod := e.NewPod()
	e.CleanupDel(pod, "p")

	var r *current.Result
	killedAt(t, e, confDir, "agent-egress", func() { r = e.Add(pod, "p") })
	hostIf, idx := e.HostVeth("p")
	if st := e.AttachState(hostIf); st != datapath.StateMoving {
		t.Errorf("after the kill between the two tcx attaches %s is %q, want %q", hostIf, st, datapath.StateMoving)
	}
	ips := []net.IP{r.IPs[0].Address.IP, r.IPs[1].Address.IP}
	e.PodReachable(t, pod, ips)
	if err := e.Check(pod, "p", "eth0"); err != nil {
		t.Errorf("CHECK half way to tcx: %v", err)
	}
	ag := e.StartAgent(confDir, "--metrics-addr", "")
	e.WaitAttachState(hostIf, datapath.StateTCX, 20*time.Second)
	e.PodReachable(t, pod, ips)
	if err := e.Check(pod, "p", "eth0"); err != nil {
		t.Errorf("CHECK after the next agent finished the move: %v", err)
	}
	ag.Stop()

	// Killed after deleting the handed-off veth, before its link pins.
	gone := state.HandedOffName(idx)
	killedAt(t, e, confDir, "reap-veth-deleted", func() { e.MustDel(pod, "p") })
	if e.NodeLinkExists(gone) {
		t.Errorf("%s not deleted before the kill", gone)
	}
	if l := e.Leftovers(); !slices.Contains(l, "link pin "+gone+"_ingress") {
		t.Errorf("no orphaned pins of %s to recover: %v", gone, l)
	}
	ag = e.StartAgent(confDir, "--metrics-addr", "")
	e.AssertClean()
	ag.Stop()

	// Killed before deleting a handed-off veth; no agent after it: GC.
	e.Add(pod, "p")
	_, idx = e.HostVeth("p")
	gone = state.HandedOffName(idx)
	killedAt(t, e, confDir, "agent-reap", func() { e.MustDel(pod, "p") })
	if !e.NodeLinkExists(gone) {
		t.Fatalf("handed-off veth %s gone although the agent died before deleting it", gone)
	}
	if err := e.GC(); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if l := e.Leftovers(); len(l) > 0 {
		t.Errorf("GC with no agent left %v", l)
	}
}

// TestHandedOffVethNetnsDestroyed: a pod's netns destroyed while its veth
// waits for the agent takes the pair with it; the pins and map state the
// pair left are removed by the agent all the same.
func TestHandedOffVethNetnsDestroyed(t *testing.T) {
	e := testenv.New(t)
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	pod := e.NewPod()
	e.Add(pod, "p")
	hostIf, idx := e.HostVeth("p")
	e.WaitAttachState(hostIf, datapath.StateTCX, 20*time.Second)
	if err := testenv.Ping(pod, testenv.NodeIP4, 1); err != nil { // counters
		t.Fatal(err)
	}
	release := e.HoldVerbs()
	e.MustDel(pod, "p")
	gone := state.HandedOffName(idx)
	if !e.NodeLinkExists(gone) {
		t.Fatalf("no handed-off veth %s", gone)
	}
	pod.Close()
	if err := unmountNS(pod); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e, gone)
	if l := e.Leftovers(); !slices.Contains(l, "link pin "+gone+"_egress") {
		t.Errorf("the pins of %s went with it? %v", gone, l)
	}
	release()
	e.AssertClean()
}

// TestHandOffSeenWhole: DEL's hand-off renames a veth's link pins, then
// the veth, under the links lock. A CNI GC and `ebpf-agent status` that
// look while a hand-off is between the two must wait for it and see the
// veth's pins as its own: the GC once took them for the pins of a veth
// gone and removed them, detaching the live veth's programs, as the
// agent's pass over the handed-off veths did beside a DEL
// (TestAgentKilledMidWorkIsRecovered found no pins left to recover).
// The test holds the lock and renames the pins itself, for a window of
// its choosing, then puts them back.
func TestHandOffSeenWhole(t *testing.T) {
	e := testenv.New(t)
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	pod := e.NewPod()
	e.CleanupDel(pod, "p")
	r := e.Add(pod, "p")
	hostIf, idx := e.HostVeth("p")
	e.WaitAttachState(hostIf, datapath.StateTCX, 10*time.Second)
	release := e.HoldVerbs() // the agent waits: only the GC and status look

	unlock, err := datapath.LockLinks(e.PinDir)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unlockOnce := func() { once.Do(unlock) }
	t.Cleanup(unlockOnce)
	gone := state.HandedOffName(idx)
	if err := datapath.MoveLinkPins(e.PinDir, hostIf, gone, idx); err != nil {
		t.Fatal(err)
	}
	gcDone := make(chan error, 1)
	go func() { gcDone <- e.GC(types.GCAttachment{ContainerID: "p", IfName: "eth0"}) }()
	type status struct {
		out string
		err error
	}
	stDone := make(chan status, 1)
	go func() {
		out, err := e.AgentCmd("status", "-o", "json", "--pin-dir", e.PinDir, "--state-dir", e.StateDir)
		stDone <- status{out, err}
	}()
	// The window: whatever ends in it looked mid-hand-off.
	window := time.After(time.Second)
	var gcErr error
	gcEnded := false
	select {
	case gcErr = <-gcDone:
		gcEnded = true
		t.Errorf("GC ended (%v) while a hand-off held the links lock", gcErr)
	case <-window:
	}
	if err := datapath.MoveLinkPins(e.PinDir, gone, hostIf, idx); err != nil {
		t.Fatal(err)
	}
	unlockOnce()
	if !gcEnded {
		gcErr = <-gcDone
	}
	if gcErr != nil {
		t.Errorf("GC: %v", gcErr)
	}
	st := <-stDone
	var rep inspect.StatusReport
	if err := json.Unmarshal([]byte(st.out), &rep); err != nil {
		t.Fatalf("status: %v, %v\n%s", st.err, err, st.out)
	}
	if len(rep.Attachments.HandedOff) > 0 {
		t.Errorf("status saw handed-off veths %v mid-hand-off, want none", rep.Attachments.HandedOff)
	}
	for _, dir := range []string{datapath.DirIngress, datapath.DirEgress} {
		if _, err := os.Stat(datapath.LinkPinPath(e.PinDir, hostIf, dir)); err != nil {
			t.Errorf("the %s link pin of %s is gone after a GC beside its hand-off: %v", dir, hostIf, err)
		}
	}
	if err := e.Check(pod, "p", "eth0"); err != nil {
		t.Errorf("CHECK after a GC beside its hand-off: %v", err)
	}
	v4, v6 := testenv.PodIPs(t, r)
	e.PodReachable(t, pod, []net.IP{v4, v6})
	e.MustDel(pod, "p")
	release()
	e.AssertClean()
}
