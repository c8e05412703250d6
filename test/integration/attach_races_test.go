// The agent's background work against what else happens to a pod at the
// same time: a DEL and a retried ADD of the same pod in the middle of a
// move, a retried ADD racing the deletion of its handed-off pair, the agent
// killed before the filters are deleted.

package integration

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// holdAgentLock takes the node's agent lock as a running agent does, so the
// verbs leave their background work to the test; released by the returned
// func and at the end of the test.
func holdAgentLock(t *testing.T, e *testenv.Env) (release func()) {
	t.Helper()
	// The agent creates the lock files; stopped, it leaves them.
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "").Stop()
	// The agent's own lock taker; free since the agent stopped, so a wait
	// is a failure.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	release, err := datapath.HoldAgent(ctx, e.PinDir, func() { t.Error("the agent lock is held by another process") })
	if err != nil {
		t.Fatalf("take the agent lock: %v", err)
	}
	t.Cleanup(release)
	if !datapath.AgentAlive(e.PinDir) {
		t.Fatal("the verbs do not see the lock held")
	}
	return release
}

// TestMoveRacesDelAndReAdd: a DEL and a retried ADD of the same pod (same
// host veth name, same address) land between the two tcx attaches of the
// agent's move. The move ends there without touching the new veth; the
// first hook's tcx link leaves with the handed-off pair, the new pod works,
// passes CHECK and waits for its own move, and nothing is left once an
// agent ran.
func TestMoveRacesDelAndReAdd(t *testing.T) {
	e := testenv.New(t)
	// One address per family: the re-ADD only works if DEL freed them.
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{
		{{"subnet": testenv.PodSubnet4, "rangeStart": "10.250.0.10", "rangeEnd": "10.250.0.10"}},
		{{"subnet": testenv.PodSubnet6, "rangeStart": "fd00:250::10", "rangeEnd": "fd00:250::10"}},
	}}
	releaseAgent := holdAgentLock(t, e)
	pod := e.NewPod()
	e.CleanupDel(pod, "m")
	e.Add(pod, "m")
	hostIf, idx := e.HostVeth("m")
	if st := e.AttachState(hostIf); st != datapath.StateTCPending {
		t.Fatalf("%s is %q, want %q", hostIf, st, datapath.StateTCPending)
	}

	var r2idx int
	var r *current.Result
	steps := []string{}
	err := e.InNode(func() error {
		v, ok := datapath.TCVethOf(idx, hostIf)
		if !ok || !v.Pending() {
			t.Fatalf("%s has no filters waiting for tcx", hostIf)
		}
		return datapath.Migrate(context.Background(), e.PinDir, v, func(_ context.Context, step string) error {
			steps = append(steps, step)
			if step == datapath.DirEgress {
				// The ingress hook is on tcx now; the pod goes and comes back.
				if st := datapath.AttachmentOf(e.PinDir, idx, hostIf); st != datapath.StateMoving {
					t.Errorf("between the attaches %s is %q, want %q", hostIf, st, datapath.StateMoving)
				}
				e.MustDel(pod, "m")
				r = e.Add(pod, "m")
				_, r2idx = e.HostVeth("m")
			}
			return nil
		})
	})
	if err != nil {
		t.Fatalf("the move: %v", err)
	}
	if strings.Join(steps, ",") != datapath.DirIngress+","+datapath.DirEgress {
		t.Errorf("move steps %v, want it to stop at the egress step once the veth was handed off", steps)
	}
	if r2idx == idx || r2idx == 0 {
		t.Fatalf("re-ADD ifindex %d (old %d)", r2idx, idx)
	}
	if st := e.AttachState(hostIf); st != datapath.StateTCPending {
		t.Errorf("the re-added %s is %q, want %q (nothing of the old move on it)", hostIf, st, datapath.StateTCPending)
	}
	gone := state.HandedOffName(idx)
	if st := e.AttachState(gone); st != datapath.StateMoving {
		t.Errorf("the handed-off pair %s is %q, want its ingress tcx link pinned under its new name (%q)", gone, st, datapath.StateMoving)
	}
	e.PodReachable(t, pod, []net.IP{r.IPs[0].Address.IP, r.IPs[1].Address.IP})
	if err := e.Check(pod, "m", "eth0"); err != nil {
		t.Errorf("CHECK of the re-added pod: %v", err)
	}

	// A real agent takes over: reaps the pair, moves the new pod.
	releaseAgent()
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	e.WaitAttachState(hostIf, datapath.StateTCX, 10*time.Second)
	waitGone(t, e, gone)
	e.PodReachable(t, pod, []net.IP{r.IPs[0].Address.IP, r.IPs[1].Address.IP})
	if err := e.Check(pod, "m", "eth0"); err != nil {
		t.Errorf("CHECK after the agent's move: %v", err)
	}
	e.MustDel(pod, "m")
	e.AssertClean()
}

// TestReAddRacesReap: a pod DELed and ADDed again (same name, same
// addresses) in a loop while the agent deletes the pairs handed off by the
// previous rounds: every ADD works, and once the pairs are gone (their
// IPv4 addresses still sat on the pod ends, down, in the pod's netns) the
// pod is reachable and passes CHECK.
func TestReAddRacesReap(t *testing.T) {
	e := testenv.New(t)
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
	e.CleanupDel(pod, "r")
	r := e.Add(pod, "r")
	var handedOff []string
	for i := 0; i < 8; i++ {
		_, idx := e.HostVeth("r")
		handedOff = append(handedOff, state.HandedOffName(idx))
		e.MustDel(pod, "r")
		// The agent starts on the pair as soon as DEL ends; ADD runs into it.
		r = e.Add(pod, "r")
		time.Sleep(time.Duration(i*7) * time.Millisecond)
	}
	for _, g := range handedOff {
		waitGone(t, e, g)
	}
	hostIf, _ := e.HostVeth("r")
	e.WaitAttachState(hostIf, datapath.StateTCX, 10*time.Second)
	ips := []net.IP{r.IPs[0].Address.IP, r.IPs[1].Address.IP}
	e.PodReachable(t, pod, ips)
	if err := e.Check(pod, "r", "eth0"); err != nil {
		t.Errorf("CHECK once the old pairs are gone: %v", err)
	}
	pod.Do(func(ns.NetNS) error {
		ls, _ := netlink.LinkList()
		for _, l := range ls {
			if strings.HasPrefix(l.Attrs().Name, state.HandedOffPrefix) {
				t.Errorf("pod end %s left in the pod", l.Attrs().Name)
			}
		}
		return nil
	})
	e.MustDel(pod, "r")
	e.AssertClean()
}

// TestAgentKilledBeforeFiltersDeleted: an agent killed with SIGKILL after
// both tcx links of a move are pinned, before it deleted the cls_bpf
// filters, leaves a pod that works and passes CHECK with both attached;
// the next agent reuses the pinned links (no second attach) and deletes
// the filters.
func TestAgentKilledBeforeFiltersDeleted(t *testing.T) {
	e := testenv.New(t)
	confDir := e.WriteConfDir()
	pod := e.NewPod()
	e.CleanupDel(pod, "f")
	var r *current.Result
	killedAt(t, e, confDir, "agent-filters", func() { r = e.Add(pod, "f") })
	hostIf, idx := e.HostVeth("f")
	if st := e.AttachState(hostIf); st != datapath.StateMoving {
		t.Fatalf("after the kill before the filters went %s is %q, want %q", hostIf, st, datapath.StateMoving)
	}
	ips := []net.IP{r.IPs[0].Address.IP, r.IPs[1].Address.IP}
	e.PodReachable(t, pod, ips)
	if err := e.Check(pod, "f", "eth0"); err != nil {
		t.Errorf("CHECK with tcx links and filters both attached: %v", err)
	}
	before := e.ProgIDs(idx)
	ag := e.StartAgent(confDir, "--metrics-addr", "")
	e.WaitAttachState(hostIf, datapath.StateTCX, 10*time.Second)
	if after := e.ProgIDs(idx); len(after) != 2 {
		t.Errorf("programs on %s after the next agent: %v (before: %v), want the two tcx links only", hostIf, after, before)
	}
	e.PodReachable(t, pod, ips)
	if err := e.Check(pod, "f", "eth0"); err != nil {
		t.Errorf("CHECK after the next agent finished the move: %v", err)
	}
	e.MustDel(pod, "f")
	e.AssertClean()
	ag.Stop()
}
