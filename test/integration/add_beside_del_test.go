// An ADD of a second interface of a pod beside a DEL of its first: the
// pod's netns entry (cni_netns, keyed by the netns cookie) is the pod's,
// not an interface's; the DEL removes it only when no other interface of
// the pod uses it, which it looks at under the pod's netns lock
// (lockNetns), and an ADD registers it under the same lock.

package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAddBesideDelNetnsEntry: pod with eth0; its DEL (the crashpoint
// build) stopped right after its look at the pod's other interfaces
// (EBPF_CNI_STOP_AT=del-look: there are none), the pod's netns lock held;
// an ADD of net1 of the same pod runs meanwhile; then the DEL goes on.
// Both succeed, net1 is routed (its table's routes through its gateway,
// reached from the node), and the pod's netns
// keeps its cni_netns entry, which net1 uses (the sock_ops hook paces the
// pod's TCP by it).
//
// Red before byname26: the ADD took no lock; it found the entry (eth0's),
// created nothing, and returned; the DEL, resumed, deleted the entry it had
// decided on before net1 existed: the live net1 without its netns entry.
// (The pod has no main-table default route after: eth0 held it when net1
// was added, as when net1 is added before the DEL, not beside it.)
func TestAddBesideDelNetnsEntry(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	id := "addbeside"
	pod, cookie := podWithEth0Entry(t, e, id)
	del, out := stoppedDel(t, e, pod, id, "eth0", "del-look")
	added := make(chan error, 1)
	var res1 *current.Result
	go func() { var err error; res1, err = a22Add(e, pod, id, "net1"); added <- err }()
	var addErr error
	select {
	case addErr = <-added: // no wait for the DEL: the race as it was
		t.Logf("ADD net1 done while the DEL was stopped: %v", addErr)
		del.Process.Signal(syscall.SIGCONT)
	case <-time.After(time.Second): // waiting for the pod's netns lock
		del.Process.Signal(syscall.SIGCONT)
		addErr = <-added
	}
	if err := del.Wait(); err != nil {
		t.Errorf("DEL eth0: %v\n%s", err, out)
	}
	if addErr != nil {
		t.Fatalf("ADD net1: %v", addErr)
	}
	v4, v6 := testenv.PodIPs(t, res1)
	a18PingAll(t, "net1 added beside the DEL of eth0: node to net1", e.Node, v4, v6)
	routes := ipInPod(t, pod, "route", "show", "table", "all")
	for _, ipc := range res1.IPs {
		if ipc.Gateway != nil && !strings.Contains(routes, "via "+ipc.Gateway.String()+" dev net1") {
			t.Errorf("net1 added beside the DEL of eth0: nothing routes via its gateway %s:\n%s", ipc.Gateway, routes)
		}
	}
	if _, err := testenv.LookupNetns(e.Maps(), cookie); err != nil {
		t.Errorf("net1 live, and the pod's netns (cookie %d) has no cni_netns entry: %v", cookie, err)
	}
	if err := e.Del(pod, id, "net1"); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	if v, err := testenv.LookupNetns(e.Maps(), cookie); err == nil {
		t.Errorf("the pod's last DEL left its cni_netns entry: %+v", v)
	}
}

// podWithEth0Entry is a pod (lo up: a DEL parks eth0's nexthops before its
// look) with eth0 of attachment id added, DELs of its eth0 and net1 at the
// test's end, and its netns's cni_netns entry, whose cookie it returns.
func podWithEth0Entry(t *testing.T, e *testenv.Env, id string) (ns.NetNS, uint64) {
	t.Helper()
	pod := podWithLoUp(t, e)
	for _, ifn := range []string{"eth0", "net1"} {
		t.Cleanup(func() { _ = e.Del(pod, id, ifn) })
	}
	if _, err := a22Add(e, pod, id, "eth0"); err != nil {
		t.Fatalf("ADD eth0: %v", err)
	}
	cookie := e.NetnsCookieOf(pod)
	if _, err := testenv.LookupNetns(e.Maps(), cookie); err != nil {
		t.Fatalf("the pod's netns (cookie %d) has no cni_netns entry after ADD: %v", cookie, err)
	}
	return pod, cookie
}

// stoppedDel starts a DEL of the crashpoint build, which stops itself
// (SIGSTOP) at step, and returns once it is stopped there, with its output.
func stoppedDel(t *testing.T, e *testenv.Env, pod interface{ Path() string }, id, ifname, step string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	return stoppedVerb(t, e, crashBinary(t), "DEL", pod, id, ifname, step)
}

// stoppedVerb starts verb of the plugin bin (a crashpoint build), which
// stops itself (SIGSTOP) at step, and returns once it is stopped there,
// with its output.
func stoppedVerb(t *testing.T, e *testenv.Env, bin, verb string, pod interface{ Path() string }, id, ifname, step string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + id, "CNI_IFNAME=" + ifname, "CNI_PATH=" + testenv.BinDir,
		"CNI_NETNS=" + pod.Path(), "EBPF_CNI_STOP_AT=" + step}
	cmd.Stdin = bytes.NewReader(e.StdinConf(nil))
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := e.InNode(cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGCONT); cmd.Process.Kill() })
	if !stoppedWithin(cmd.Process.Pid, 20*time.Second) {
		t.Fatalf("the %s did not stop at %s:\n%s", verb, step, out)
	}
	return cmd, out
}

// stoppedWithin tells whether process pid is stopped (state T) within d.
func stoppedWithin(pid int, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "T" {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
