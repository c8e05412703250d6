// attack30: the pod's netns entry (cni_netns) and a failed ADD's undo. An
// ADD that created the entry deletes it when it fails later (its undo);
// another interface of the pod, ADDed meanwhile, found the entry there
// (created nothing) and uses it.

package integration

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// stoppedAdd starts an ADD of the crashpoint build, which stops itself
// (SIGSTOP) at step, and returns once it is stopped there, with its output.
func stoppedAdd(t *testing.T, e *testenv.Env, pod ns.NetNS, id, ifname, step string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	return stoppedVerb(t, e, crashBinary(t), "ADD", pod, id, ifname, step)
}

// a30BreakStore puts a file where the network's record directory is (the
// directory moved aside): the record of an ADD under way cannot be written
// (its Commit fails, on any filesystem). restore puts the directory back.
func a30BreakStore(t *testing.T, dir string) (restore func()) {
	t.Helper()
	if err := os.Rename(dir, dir+".aside"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := false
	restore = func() {
		if done {
			return
		}
		done = true
		if err := os.Remove(dir); err != nil {
			t.Error(err)
		}
		if err := os.Rename(dir+".aside", dir); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(restore)
	return restore
}

// TestAttack30FailedAddKeepsSiblingNetnsEntry: ADD net1 of a pod with no
// interface yet registers the pod's netns entry and stops right after
// (crashpoint "pod"); ADD eth0 of the pod runs meanwhile and succeeds (it
// finds the entry); then net1's ADD goes on and fails (its record cannot
// be written: a file where the network's record directory was). Its undo
// must leave the entry that the live eth0 uses (the sock_ops hook paces
// the pod's TCP by it), and the pod's last DEL must remove it. Alone in
// its pod, a failed ADD still removes the entry it made.
//
// Red before attack30: the undo deleted the entry it had created, without
// a look at the pod's other interfaces: eth0 live without it.
func TestAttack30FailedAddKeepsSiblingNetnsEntry(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := podWithLoUp(t, e)
	id := "a30undo"
	dir := e.Store().Dir()
	for _, ifn := range []string{"eth0", "net1"} {
		t.Cleanup(func() { _ = e.Del(pod, id, ifn) })
	}
	cookie := e.NetnsCookieOf(pod)
	add, out := stoppedAdd(t, e, pod, id, "net1", "pod")
	if _, err := testenv.LookupNetns(e.Maps(), cookie); err != nil {
		t.Fatalf("ADD net1, stopped after its netns entry step: no entry (cookie %d): %v\n%s", cookie, err, out)
	}
	res0, err := a22Add(e, pod, id, "eth0")
	if err != nil {
		t.Fatalf("ADD eth0: %v", err)
	}
	restore := a30BreakStore(t, dir)
	add.Process.Signal(syscall.SIGCONT)
	err = add.Wait()
	restore()
	if err == nil {
		t.Fatalf("ADD net1 succeeded with no record directory:\n%s", out)
	}
	t.Logf("ADD net1 failed, as meant: %v: %s", err, strings.TrimSpace(out.String()))
	v4, v6 := testenv.PodIPs(t, res0)
	a18PingAll(t, "eth0 beside net1's failed ADD: node to eth0", e.Node, v4, v6)
	if _, err := testenv.LookupNetns(e.Maps(), cookie); err != nil {
		t.Errorf("eth0 live, and net1's failed ADD took the pod's netns entry (cookie %d) with it: %v", cookie, err)
	}
	if err := e.Del(pod, id, "net1"); err != nil {
		t.Errorf("DEL net1 (the runtime's, after its failed ADD): %v", err)
	}
	if _, err := testenv.LookupNetns(e.Maps(), cookie); err != nil {
		t.Errorf("eth0 live, and DEL of net1 (failed ADD) deleted the pod's netns entry (cookie %d): %v", cookie, err)
	}
	if err := e.Del(pod, id, "eth0"); err != nil {
		t.Fatalf("DEL eth0: %v", err)
	}
	if v, err := testenv.LookupNetns(e.Maps(), cookie); err == nil {
		t.Errorf("the pod's last DEL left its cni_netns entry: %+v", v)
	}

	// Alone in its pod, a failed ADD's undo still takes the entry it made.
	alone := podWithLoUp(t, e)
	t.Cleanup(func() { _ = e.Del(alone, id+"b", "eth0") })
	cookie = e.NetnsCookieOf(alone)
	add, out = stoppedAdd(t, e, alone, id+"b", "eth0", "pod")
	restore = a30BreakStore(t, dir)
	add.Process.Signal(syscall.SIGCONT)
	err = add.Wait()
	restore()
	if err == nil {
		t.Fatalf("ADD of a lone eth0 succeeded with no record directory:\n%s", out)
	}
	if v, err := testenv.LookupNetns(e.Maps(), cookie); err == nil {
		t.Errorf("a failed ADD, the pod's only interface, left the netns entry it made: %+v", v)
	}
}
