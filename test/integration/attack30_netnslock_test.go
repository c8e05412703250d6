// attack30: the pod's netns lock (lockNetns) against the pod itself. The
// lock was an flock on the netns's nsfs inode, which every open of the
// netns shares: a process inside the pod opens /proc/self/ns/net (no
// capability needed) and takes the same lock. Held by the pod, the lock
// made every DEL and every ADD's ensureNetns of that pod wait out
// netnsLockWait (5 s) and then go on without it: the serialization that
// round 19 added (TestAddBesideDelNetnsEntry) and the one between two DELs
// of a pod's interfaces were the pod's to switch off. Now the lock is a
// directory under <pinDir>/locks/netns (datapath.LockNetns), the node's.

package integration

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a30PodHoldsNetnsLock starts a process in the pod's netns that takes an
// exclusive flock on its own /proc/self/ns/net, as any workload can, and
// returns once the lock is held (the nsfs inode is the pod netns file's).
func a30PodHoldsNetnsLock(t *testing.T, pod ns.NetNS) {
	t.Helper()
	cmd := exec.Command("nsenter", "--net="+pod.Path(), "flock", "-x", "/proc/self/ns/net", "sleep", "120")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its sleep goes with it
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	f, err := os.Open(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == unix.EWOULDBLOCK {
			return // the pod holds the lock of its netns file
		}
		if err == nil {
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod's process never held the flock of its netns (%v)", err)
		}
	}
}

// TestAttack30PodNetnsLockAddBesideDel: TestAddBesideDelNetnsEntry with a
// process of the pod holding the flock of its own netns. The DEL of eth0
// stops after its look (no other interface), an ADD of net1 runs, the DEL
// goes on: net1 must keep the pod's cni_netns entry, and neither verb may
// wait on the pod's lock (each under 4 s; netnsLockWait is 5 s).
//
// Red before attack30: the DEL took 5 s to reach its look (waiting for the
// pod's lock), the ADD 5 s more, and then, neither holding a lock, the DEL
// deleted the entry the ADD had found: net1 live without its entry.
func TestAttack30PodNetnsLockAddBesideDel(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	id := "a30lockadd"
	pod, cookie := podWithEth0Entry(t, e, id)
	a30PodHoldsNetnsLock(t, pod)

	start := time.Now()
	del, out := stoppedDel(t, e, pod, id, "eth0", "del-look")
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("the DEL took %v to reach its look: it waited on the lock the pod holds", d.Round(time.Millisecond))
	}
	added := make(chan error, 1)
	var res1 *current.Result
	start = time.Now()
	go func() { var err error; res1, err = a22Add(e, pod, id, "net1"); added <- err }()
	var addErr error
	select {
	case addErr = <-added:
		t.Logf("ADD net1 done while the DEL was stopped (%v): %v", time.Since(start).Round(time.Millisecond), addErr)
		del.Process.Signal(syscall.SIGCONT)
	case <-time.After(time.Second): // waiting for the lock the stopped DEL holds
		del.Process.Signal(syscall.SIGCONT)
		addErr = <-added
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("ADD net1 took %v: it waited on the lock the pod holds", d.Round(time.Millisecond))
	}
	if err := del.Wait(); err != nil {
		t.Errorf("DEL eth0: %v\n%s", err, out)
	}
	if addErr != nil {
		t.Fatalf("ADD net1: %v", addErr)
	}
	v4, v6 := testenv.PodIPs(t, res1)
	a18PingAll(t, "net1 added beside the DEL of eth0, the pod holding its netns flock: node to net1", e.Node, v4, v6)
	if _, err := testenv.LookupNetns(e.Maps(), cookie); err != nil {
		t.Errorf("net1 live, the pod holding its netns flock, and the pod's netns (cookie %d) has no cni_netns entry: %v", cookie, err)
	}
	start = time.Now()
	if err := e.Del(pod, id, "net1"); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("DEL net1 took %v: it waited on the lock the pod holds", d.Round(time.Millisecond))
	}
	if v, err := testenv.LookupNetns(e.Maps(), cookie); err == nil {
		t.Errorf("the pod's last DEL left its cni_netns entry: %+v", v)
	}
}
