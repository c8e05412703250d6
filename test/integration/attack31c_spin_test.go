package integration

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a31cCPU is the CPU time (user+system, clock ticks) process pid used.
func a31cCPU(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatalf("read the agent's stat: %v", err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.Atoi(f[11])
	k, _ := strconv.Atoi(f[12])
	return u + k
}

// TestAttack31cRefusedNoSpin (attack31c, green guard, on depth31's refused
// moves): a refused move to tcx (network B's veth whose pins' name is held
// by pod A's renamed veth, TestDepth31RefusalLoggedOnce's setup) has every
// pass ask for a full pass again; a pass that made a link event of its own
// (its failed move) would then spin. The agent, idle 5 s with the refusal
// standing, uses under half a second of CPU; 100 link changes of another
// plugin's veth (noted as a possible host veth since depth31, its records
// read) end in under half a second of CPU once they stop (3 s); the
// refusal is logged once; pod A keeps its programs, B stays pending.
// Measured (2 cores, load ~2.7): 0-1 ticks idle, 26-30 ticks for the 100
// changes with or without the refusal, 0-1 after.
//
//	go test -count=1 -run 'TestAttack31cRefusedNoSpin$' -v ./test/integration/
func TestAttack31cRefusedNoSpin(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p, before := renamedTCXPod(t, e, "a31cspin", "a31csp0")
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	defer ag.Stop()
	netB, rt := netBSameAttachment(t, e, p)
	if _, err := e.AddList(netB, rt); err != nil {
		t.Fatalf("network B's ADD: %v", err)
	}
	t.Cleanup(func() { _ = e.DelList(netB, rt) })
	refusals := func() int { return strings.Count(ag.Logs(), "stays on cls_bpf") }
	for deadline := time.Now().Add(10 * time.Second); refusals() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal in the agent's log after 10 s:\n%s", ag.Logs())
		}
	}
	time.Sleep(time.Second)
	pid := ag.Cmd.Process.Pid
	c0 := a31cCPU(t, pid)
	time.Sleep(5 * time.Second)
	if c := a31cCPU(t, pid) - c0; c > 50 {
		t.Errorf("the agent used %d ticks of CPU in 5 s idle, a refused move standing (spins?)", c)
	}
	peer := e.NewPod()
	if err := e.InNode(func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "a31cfor"}, PeerName: "a31cforp", PeerNamespace: netlink.NsFd(int(peer.Fd()))})
	}); err != nil {
		t.Fatalf("make another plugin's veth: %v", err)
	}
	t.Cleanup(func() {
		e.InNode(func() error { return netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "a31cfor"}}) })
	})
	for i := 0; i < 100; i++ {
		if err := e.InNode(func() error {
			l, err := netlink.LinkByName("a31cfor")
			if err != nil {
				return err
			}
			return netlink.LinkSetTxQLen(l, 600+i)
		}); err != nil {
			t.Fatalf("change another plugin's veth: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	c1 := a31cCPU(t, pid)
	time.Sleep(3 * time.Second)
	if c := a31cCPU(t, pid) - c1; c > 50 {
		t.Errorf("the agent used %d ticks of CPU in the 3 s after the changes stopped (spins?)", c)
	}
	if n := refusals(); n != 1 {
		t.Errorf("the refusal is in the agent's log %d times, want once:\n%s", n, ag.Logs())
	}
	if !e.NodeLinkExists("a31cfor") {
		t.Errorf("another plugin's veth a31cfor is gone")
	}
	if st := e.AttachState(p.name); st != datapath.StateTCPending {
		t.Errorf("network B's veth %s is %q, want %q", p.name, st, datapath.StateTCPending)
	}
	if after := e.ProgIDs(p.idx); len(after) != 2 || after[0] != before[0] || after[1] != before[1] {
		t.Errorf("pod A's renamed veth runs programs %v, was %v", after, before)
	}
}
