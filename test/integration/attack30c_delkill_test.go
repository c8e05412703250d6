package integration

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack30cDelKilledAfterHandOff (attack30c, twodel30): a pod with eth0
// and net1, an agent running (DEL hands its veth off), eth0's DEL killed
// with SIGKILL after its hand-off and the netns unlock (del-unlocked:
// the veth renamed ebpz<ifindex>, its cni_links entry not yet removed).
// The runtime's retries of eth0's DEL and net1's DEL succeed; the pod's
// cni_netns entry, the handed-off veth and its pins go (the agent's reap,
// AssertClean waits for it), the pod keeps nothing; an ADD of the same
// attachment works again and its DEL leaves nothing.
//
//	go test -count=1 -run 'TestAttack30cDelKilledAfterHandOff$' -v ./test/integration/
func TestAttack30cDelKilledAfterHandOff(t *testing.T) {
	t.Parallel()
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
	envv["EBPF_CNI_CRASH_AT"] = "del-unlocked"
	out, err := e.RunPlugin(crashBinary(t), envv, e.StdinConf(nil))
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("DEL eth0 at del-unlocked: %v, want SIGKILL; %s", err, out)
	}
	if !e.NodeLinkExists(state.HandedOffName(eth0)) {
		t.Logf("eth0's host veth (ifindex %d) is not there as %s after the killed DEL (reaped already?)", eth0, state.HandedOffName(eth0))
	}
	for i := 0; i < 2; i++ {
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Fatalf("DEL eth0 retry #%d: %v", i+1, err)
		}
	}
	if err := e.Del(pod, id, "net1"); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	if v, err := testenv.LookupNetns(e.Maps(), cookie); err == nil {
		t.Errorf("the cni_netns entry of the pod's netns (cookie %d) is left after the DELs: %+v", cookie, v)
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
