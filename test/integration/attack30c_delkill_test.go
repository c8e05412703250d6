package integration

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack30cDelKilledAfterHandOff (attack30c, twodel30, depth31): a pod
// with eth0 and net1, an agent running (DEL hands its veth off), eth0's DEL
// killed with SIGKILL after its hand-off: at del-veth-removed (the veth
// renamed ebpz<ifindex>, its cni_links entry not yet removed, the pod's
// netns lock still held, released by the kill) and at del-unlocked (the
// entry removed, the lock released). Either way the agent reaps the
// handed-off veth on its own: the veth, its pins and its cni_links entry
// go, and net1's DEL (before any retry of eth0's) is the pod's last and
// removes the pod's cni_netns entry. The runtime's retries of eth0's DEL
// succeed, the pod keeps nothing; an ADD of the same attachment works
// again and its DEL leaves nothing.
//
//	go test -count=1 -run 'TestAttack30cDelKilledAfterHandOff$' -v ./test/integration/
func TestAttack30cDelKilledAfterHandOff(t *testing.T) {
	t.Parallel()
	for _, step := range []string{"del-veth-removed", "del-unlocked"} {
		t.Run(step, func(t *testing.T) { delKilledAfterHandOff(t, step) })
	}
}

func delKilledAfterHandOff(t *testing.T, step string) {
	e := testenv.New(t)
	ag := e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	defer ag.Stop()
	pod := podWithLoUp(t, e)
	id := testenv.RandName("a30ck")
	for _, ifn := range []string{"eth0", "net1"} {
		t.Cleanup(func() { _ = e.Del(pod, id, ifn) })
		if _, err := a22Add(e, pod, id, ifn); err != nil {
			t.Fatalf("ADD %s: %v", ifn, err)
		}
	}
	cookie := e.NetnsCookieOf(pod)
	_, eth0 := e.HostVeth(id)
	envv := pluginEnv("DEL", id, pod, "eth0")
	envv["EBPF_CNI_CRASH_AT"] = step
	out, err := e.RunPlugin(crashBinary(t), envv, e.StdinConf(nil))
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("DEL eth0 at %s: %v, want SIGKILL; %s", step, err, out)
	}
	handed := state.HandedOffName(eth0)
	if !e.NodeLinkExists(handed) {
		t.Logf("eth0's host veth (ifindex %d) is not there as %s after the killed DEL (reaped already?)", eth0, handed)
	}
	// The agent's reap, with no retry of the DEL: the veth, its pins and
	// its link entry go.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, lerr := e.Maps().Links().Lookup(eth0)
		if !e.NodeLinkExists(handed) && lerr != nil && !slices.ContainsFunc(datapath.VethLinkPins(e.PinDir),
			func(p datapath.VethLinkPin) bool { return p.HostIf == handed }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after eth0's DEL was killed at %s the agent has not reaped its handed-off veth: link %s there %v, cni_links entry of %d: %v, pins %v",
				step, handed, e.NodeLinkExists(handed), eth0, lerr, datapath.VethLinkPins(e.PinDir))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := e.Del(pod, id, "net1"); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	if v, err := testenv.LookupNetns(e.Maps(), cookie); err == nil {
		t.Errorf("the cni_netns entry of the pod's netns (cookie %d) is left after net1's DEL, eth0's handed-off veth reaped: %+v", cookie, v)
	}
	for i := 0; i < 2; i++ {
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Fatalf("DEL eth0 retry #%d: %v", i+1, err)
		}
	}
	if l := podLeftovers(t, pod); len(l) > 0 {
		t.Errorf("the pod after the DELs:\n  %s", strings.Join(l, "\n  "))
	}
	e.AssertClean()
	if _, err := a22Add(e, pod, id, "eth0"); err != nil {
		t.Fatalf("ADD eth0 again: %v", err)
	}
	if err := e.Del(pod, id, "eth0"); err != nil {
		t.Fatalf("DEL eth0 after ADD again: %v", err)
	}
	e.AssertClean()
}
