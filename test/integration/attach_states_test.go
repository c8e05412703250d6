// Every attach state a pod can be in (cls_bpf waiting for tcx, tcx links,
// both during a move): upgrade swaps the programs of each, CHECK accepts
// each, GC and reconcile tear each down, status shows them, the ingress
// queue of a limited pod works in each.

package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
	"github.com/vishvananda/netlink"
)

// filterProgIDs are the programs of our cls_bpf filters on a host veth,
// ingress then egress (0 where there is none).
func filterProgIDs(t *testing.T, e *testenv.Env, idx int) []ebpf.ProgramID {
	t.Helper()
	out := []ebpf.ProgramID{0, 0}
	e.InNode(func() error {
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			t.Fatalf("ifindex %d: %v", idx, err)
		}
		for i, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, _ := netlink.FilterList(l, parent)
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "ebpf-cni-") {
					out[i] = ebpf.ProgramID(bf.Id)
				}
			}
		}
		return nil
	})
	return out
}

// TestUpgradeSwapsEveryAttachState: `ebpf-agent upgrade --force` swaps the
// programs of a pod on tcx links, of one whose cls_bpf filters wait for
// tcx, and of one in attachMode tc, in place, while its traffic flows;
// each passes CHECK after; the waiting pod then moves to tcx with the new
// programs and the tc one stays on tc.
func TestUpgradeSwapsEveryAttachState(t *testing.T) {
	e := testenv.New(t)
	s := e.Sibling(t)
	s.PinDir, s.Extra["attachMode"] = e.PinDir, "tc"
	confDir := e.WriteConfDir()
	e.StartAgent(confDir, "--metrics-addr", "")
	px, pp, pt := e.NewPod(), e.NewPod(), e.NewPod()
	e.CleanupDel(px, "x")
	e.CleanupDel(pp, "p")
	s.CleanupDel(pt, "t")
	e.Add(px, "x")
	hostX, idxX := e.HostVeth("x")
	e.WaitAttachState(hostX, datapath.StateTCX, 20*time.Second)
	release := e.HoldVerbs()
	rp := e.Add(pp, "p")
	s.Add(pt, "t")
	hostP, idxP := e.HostVeth("p")
	hostT, idxT := s.HostVeth("t")
	if st := e.AttachState(hostP); st != datapath.StateTCPending {
		t.Fatalf("%s is %q, want %q", hostP, st, datapath.StateTCPending)
	}
	if st := e.AttachState(hostT); st != datapath.StateTC {
		t.Fatalf("%s (attachMode tc) is %q, want %q", hostT, st, datapath.StateTC)
	}
	beforeX, beforeP, beforeT := e.ProgIDs(idxX), filterProgIDs(t, e, idxP), filterProgIDs(t, e, idxT)

	p4 := rp.IPs[0].Address.IP
	pingDone := make(chan string, 1)
	go func() {
		_, _, out, _ := pingStats(e.Node, p4, 1000, "0.002")
		pingDone <- out
	}()
	time.Sleep(200 * time.Millisecond)
	out, err := e.AgentCmd(append([]string{"upgrade", "--force"}, e.AgentArgs(confDir)...)...)
	if err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	}
	if !strings.Contains(out, "tc filters: 4, swapped in place: 4") {
		t.Errorf("upgrade did not swap the 4 filters: %s", out)
	}
	if out := <-pingDone; !strings.Contains(out, " 0% packet loss") {
		t.Errorf("echoes lost across the upgrade of a pod waiting for tcx:\n%s", out)
	}
	afterX, afterP, afterT := e.ProgIDs(idxX), filterProgIDs(t, e, idxP), filterProgIDs(t, e, idxT)
	for i := range 2 {
		if afterX[i] == beforeX[i] || afterP[i] == beforeP[i] || afterT[i] == beforeT[i] {
			t.Errorf("hook %d not swapped: tcx %d -> %d, waiting %d -> %d, tc %d -> %d", i, beforeX[i], afterX[i], beforeP[i], afterP[i], beforeT[i], afterT[i])
		}
		if afterP[i] != afterX[i] || afterT[i] != afterX[i] {
			t.Errorf("hook %d runs different programs after the upgrade: tcx %d, waiting %d, tc %d", i, afterX[i], afterP[i], afterT[i])
		}
	}
	for _, c := range []struct {
		e   *testenv.Env
		pod ns.NetNS
		id  string
	}{{e, px, "x"}, {e, pp, "p"}, {s, pt, "t"}} {
		if err := c.e.Check(c.pod, c.id, "eth0"); err != nil {
			t.Errorf("CHECK of %s after the upgrade: %v", c.id, err)
		}
	}
	release()
	e.WaitAttachState(hostP, datapath.StateTCX, 20*time.Second)
	if got := e.ProgIDs(idxP); !slices.Equal(got, afterX) {
		t.Errorf("the waiting pod moved to tcx with programs %v, want this build's %v", got, afterX)
	}
	time.Sleep(200 * time.Millisecond)
	if st := e.AttachState(hostT); st != datapath.StateTC {
		t.Errorf("the agent moved a pod of attachMode tc: %q", st)
	}
	e.MustDel(px, "x")
	e.MustDel(pp, "p")
	s.MustDel(pt, "t")
	e.AssertClean()
	s.AssertClean()
}

// TestCheckInEveryAttachState: CHECK passes for a pod waiting for tcx and
// for one on tcx, and names the hook when the program is missing in
// either state.
func TestCheckInEveryAttachState(t *testing.T) {
	e := testenv.New(t)
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	px, pp := e.NewPod(), e.NewPod()
	e.CleanupDel(px, "x")
	e.CleanupDel(pp, "p")
	e.Add(px, "x")
	hostX, idxX := e.HostVeth("x")
	e.WaitAttachState(hostX, datapath.StateTCX, 20*time.Second)
	e.HoldVerbs()
	e.Add(pp, "p")
	hostP, idxP := e.HostVeth("p")
	if st := e.AttachState(hostP); st != datapath.StateTCPending {
		t.Fatalf("%s is %q, want %q", hostP, st, datapath.StateTCPending)
	}
	for _, id := range []string{"x", "p"} {
		if err := e.Check(map[string]ns.NetNS{"x": px, "p": pp}[id], id, "eth0"); err != nil {
			t.Errorf("CHECK of %s: %v", id, err)
		}
	}
	// The egress program goes: the tcx link's pin, the cls_bpf filter.
	os.Remove(datapath.LinkPinPath(e.PinDir, hostX, datapath.DirEgress))
	e.InNode(func() error {
		return netlink.FilterDel(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
			LinkIndex: idxP, Parent: netlink.HANDLE_MIN_EGRESS, Handle: 1, Protocol: 0x0003, Priority: 1}})
	})
	// The last reference of a link gone, the kernel detaches it a moment later.
	for deadline := time.Now().Add(5 * time.Second); len(e.ProgIDs(idxX)) > 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the tcx egress link of %s stays attached without its pin", hostX)
		}
	}
	for id, hostIf := range map[string]string{"x": hostX, "p": hostP} {
		err := e.Check(map[string]ns.NetNS{"x": px, "p": pp}[id], id, "eth0")
		if err == nil || !strings.Contains(err.Error(), hostIf+" egress") {
			t.Errorf("CHECK of %s without its egress program: %v, want the hook named", id, err)
		}
	}
}

// TestGCAndReconcileInEveryAttachState: GC tears down attachments not in
// the valid list whether they wait for tcx or are on it (handing the veths
// to the running agent), and the agent reconciles pods in either state
// whose netns vanished without a DEL.
func TestGCAndReconcileInEveryAttachState(t *testing.T) {
	e := testenv.New(t)
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "", "--reconcile-interval", "1s")
	pods := map[string]ns.NetNS{}
	for _, id := range []string{"gc-tcx", "gone-tcx", "keep"} {
		pods[id] = e.NewPod()
		e.CleanupDel(pods[id], id)
		e.Add(pods[id], id)
		h, _ := e.HostVeth(id)
		e.WaitAttachState(h, datapath.StateTCX, 5*time.Second)
	}
	release := e.HoldVerbs()
	for _, id := range []string{"gc-tc", "gone-tc"} {
		pods[id] = e.NewPod()
		e.CleanupDel(pods[id], id)
		e.Add(pods[id], id)
		if h, _ := e.HostVeth(id); e.AttachState(h) != datapath.StateTCPending {
			t.Fatalf("%s: %q", id, e.AttachState(h))
		}
	}
	if err := e.GC(
		types.GCAttachment{ContainerID: "keep", IfName: "eth0"},
		types.GCAttachment{ContainerID: "gone-tcx", IfName: "eth0"},
		types.GCAttachment{ContainerID: "gone-tc", IfName: "eth0"},
	); err != nil {
		t.Fatalf("GC: %v", err)
	}
	for _, id := range []string{"gc-tcx", "gc-tc"} {
		if l := e.Traces(&testenv.Attachment{ID: id, IfName: "eth0", HostIf: state.HostIfName(id, "eth0")}); len(l) > 0 {
			t.Errorf("GC left %s: %v", id, l)
		}
	}
	// Pods vanish without DEL: their veths go with their netns.
	for _, id := range []string{"gone-tcx", "gone-tc"} {
		pods[id].Close()
		if err := unmountNS(pods[id]); err != nil {
			t.Fatal(err)
		}
		waitGone(t, e, state.HostIfName(id, "eth0"))
	}
	release()
	deadline := time.Now().Add(10 * time.Second)
	for _, id := range []string{"gone-tcx", "gone-tc"} {
		for len(e.ReservationsOf(id)) > 0 || e.Store().Path(id, "eth0") != "" && fileExists(e.Store().Path(id, "eth0")) {
			if time.Now().After(deadline) {
				t.Fatalf("the agent did not reconcile %s: reservations %v", id, e.ReservationsOf(id))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	e.MustDel(pods["keep"], "keep")
	e.AssertClean()
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestStatusShowsAttachStates: `ebpf-agent status` counts the host veths by
// attach state and lists the handed-off veths; `dump endpoints` shows each
// pod's state.
func TestStatusShowsAttachStates(t *testing.T) {
	e := testenv.New(t)
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	px, pp, pd := e.NewPod(), e.NewPod(), e.NewPod()
	for id, p := range map[string]ns.NetNS{"x": px, "p": pp, "d": pd} {
		e.CleanupDel(p, id)
	}
	e.Add(px, "x")
	hostX, _ := e.HostVeth("x")
	e.WaitAttachState(hostX, datapath.StateTCX, 20*time.Second)
	e.HoldVerbs()
	rp := e.Add(pp, "p")
	e.Add(pd, "d")
	_, idxD := e.HostVeth("d")
	e.MustDel(pd, "d")

	out, err := e.MasqAgent("status", "-o", "json")
	if err != nil && !strings.Contains(err.Error(), "exit status 1") {
		t.Fatal(err)
	}
	var st inspect.StatusReport
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, out)
	}
	a := st.Attachments
	if !a.AgentRunning || a.HostVeths[datapath.StateTCX] != 1 || a.HostVeths[datapath.StateTCPending] != 1 ||
		!slices.Equal(a.HandedOff, []string{state.HandedOffName(idxD)}) {
		t.Errorf("status attachments: %+v, want the agent running, 1 on tcx, 1 waiting, %s handed off", a, state.HandedOffName(idxD))
	}
	out, err = e.MasqAgent("dump", "endpoints", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var eps inspect.Endpoints
	if err := json.Unmarshal(out, &eps); err != nil {
		t.Fatalf("dump endpoints JSON: %v\n%s", err, out)
	}
	want := map[string]string{}
	for _, ipc := range rp.IPs {
		want[ipc.Address.IP.String()] = datapath.StateTCPending
	}
	for _, ep := range eps {
		if w, ok := want[ep.IP]; ok && ep.Attach != w {
			t.Errorf("dump endpoints: %s attach %q, want %q", ep.IP, ep.Attach, w)
		} else if !ok && ep.Attach != datapath.StateTCX {
			t.Errorf("dump endpoints: %s attach %q, want %q", ep.IP, ep.Attach, datapath.StateTCX)
		}
	}
	if len(eps) != 4 {
		t.Errorf("dump endpoints lists %d addresses, want 4: %+v", len(eps), eps)
	}
}

// rootQdiscKind is the kind of a node link's root qdisc ("" for none).
func rootQdiscKind(t *testing.T, e *testenv.Env, idx int) string {
	t.Helper()
	kind := ""
	e.InNode(func() error {
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			t.Fatalf("ifindex %d: %v", idx, err)
		}
		qs, err := netlink.QdiscList(l)
		if err != nil {
			t.Fatalf("qdiscs of %s: %v", l.Attrs().Name, err)
		}
		for _, q := range qs {
			if q.Attrs().Parent == netlink.HANDLE_ROOT {
				kind = q.Type()
			}
		}
		return nil
	})
	return kind
}

// TestBandwidthQueueInEveryAttachState: a pod ADDed with an ingress limit
// while the agent runs (cls_bpf filters waiting for tcx) gets its ingress
// queue (HTB on the host veth), the agent's move to tcx keeps it, and a
// remote TCP stream holds the limit in both states; re-ADDed while its old
// pair waits handed off, the pod gets a queue on its new veth.
func TestBandwidthQueueInEveryAttachState(t *testing.T) {
	e := testenv.New(t)
	remote := withRemote(t, e)
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", ag.Logs())
		}
	})
	pod := e.NewPod()
	e.CleanupDel(pod, "bwq")
	const rate = 20e6
	bw := bandwidthArgs(rate, 0)

	release := e.HoldVerbs()
	r, err := e.AddBW(pod, "bwq", bw)
	if err != nil {
		t.Fatalf("ADD with an ingress limit: %v", err)
	}
	ip4, _ := testenv.PodIPs(t, r)
	hostIf, idx := e.HostVeth("bwq")
	stream := func(when string, hostIf string, idx int) {
		t.Helper()
		if k := rootQdiscKind(t, e, idx); k != "htb" {
			t.Errorf("%s: root qdisc of %s is %q, want htb", when, hostIf, k)
		}
		if err := e.CheckBW(pod, "bwq", bw); err != nil {
			t.Errorf("%s: CHECK: %v", when, err)
		}
		s := tcpStream(t, remote, pod, ip4, 4*time.Second)
		t.Logf("%s: remote TCP at a %.0f Mbit/s limit: mean %.3fx, 1 s intervals %s", when, rate/1e6, s.mean/rate, ratios(s.intervals, rate))
		if s.mean < 0.85*rate || s.mean > 1.05*rate {
			t.Errorf("%s: mean %.1f Mbit/s, want %.1f-%.1f (0.85x-1.05x of the limit)", when, s.mean/1e6, 0.85*rate/1e6, 1.05*rate/1e6)
		}
	}
	if st := e.AttachState(hostIf); st != datapath.StateTCPending {
		t.Fatalf("%s is %q after ADD with the agent running, want %q", hostIf, st, datapath.StateTCPending)
	}
	stream("cls_bpf, waiting for tcx", hostIf, idx)

	release()
	e.WaitAttachState(hostIf, datapath.StateTCX, 10*time.Second)
	stream("moved to tcx", hostIf, idx)

	release = e.HoldVerbs()
	e.MustDel(pod, "bwq")
	if !e.NodeLinkExists(state.HandedOffName(idx)) {
		t.Fatalf("DEL did not hand %s off", hostIf)
	}
	r, err = e.AddBW(pod, "bwq", bw)
	if err != nil {
		t.Fatalf("re-ADD while the old pair waits: %v", err)
	}
	ip4, _ = testenv.PodIPs(t, r)
	hostIf2, idx2 := e.HostVeth("bwq")
	stream("re-added beside the handed-off pair", hostIf2, idx2)
	release()
	e.WaitAttachState(hostIf2, datapath.StateTCX, 10*time.Second)
	if err := e.CheckBW(pod, "bwq", bw); err != nil {
		t.Errorf("CHECK after the move: %v", err)
	}
	e.MustDel(pod, "bwq")
	e.AssertClean()
}

// TestUpgradeDuringMoveToTCX: an upgrade that swaps a waiting pod's
// cls_bpf filters after the agent looked at them, before its first tcx
// attach (the agent stopped there: -tags crashpoint EBPF_CNI_STOP_AT),
// must leave the pod on tcx with this build's new programs. The move once
// attached the programs it had seen: the pod ran the old ones on tcx,
// which the upgrade had not swapped, and CHECK failed
// (TestAgentRestartAndUpgradeWithoutLoss at load 20).
func TestUpgradeDuringMoveToTCX(t *testing.T) {
	e := testenv.New(t)
	confDir := e.WriteConfDir()
	ag := e.StartAgentBin(crashAgent(t), []string{"EBPF_CNI_STOP_AT=agent-ingress"}, confDir, "--metrics-addr", "")
	t.Cleanup(func() { ag.Cmd.Process.Signal(syscall.SIGCONT) }) // Stop's SIGTERM must reach it
	pod := e.NewPod()
	e.CleanupDel(pod, "p")
	r := e.Add(pod, "p")
	hostIf, idx := e.HostVeth("p")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", ag.Cmd.Process.Pid))
		if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "T" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not stop at agent-ingress (%s is %q):\n%s", hostIf, e.AttachState(hostIf), ag.Logs())
		}
	}
	if st := e.AttachState(hostIf); st != datapath.StateTCPending {
		t.Fatalf("%s is %q with the agent stopped before its move, want %q", hostIf, st, datapath.StateTCPending)
	}
	before := filterProgIDs(t, e, idx)
	out, err := e.AgentCmd(append([]string{"upgrade", "--force"}, e.AgentArgs(confDir)...)...)
	if err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	}
	swapped := filterProgIDs(t, e, idx)
	if swapped[0] == before[0] || swapped[1] == before[1] {
		t.Fatalf("the upgrade did not swap the waiting filters: %v -> %v\n%s", before, swapped, out)
	}
	ag.Cmd.Process.Signal(syscall.SIGCONT)
	e.WaitAttachState(hostIf, datapath.StateTCX, 10*time.Second)
	if got := e.ProgIDs(idx); !slices.Equal(got, swapped) {
		t.Errorf("the pod moved to tcx with programs %v, want those the upgrade put on its filters %v (before it: %v)", got, swapped, before)
	}
	if err := e.Check(pod, "p", "eth0"); err != nil {
		t.Errorf("CHECK after the move: %v", err)
	}
	v4, v6 := testenv.PodIPs(t, r)
	e.PodReachable(t, pod, []net.IP{v4, v6})
	e.MustDel(pod, "p")
	e.AssertClean()
}
