// attack30b: the node's netns locks (datapath.LockNetns, attack30) against
// a verb killed while it holds one, and against another pod's verb holding
// the stripe a pod's netns shares (two netns whose nsfs inodes agree modulo
// the stripes, or a verb stopped or hung holding it).

package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a30bNetnsIno is the nsfs inode of a pod's netns, which names its stripe.
func a30bNetnsIno(t *testing.T, pod ns.NetNS) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(pod.Path(), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestAttack30bNetnsLockKilledAndHeld: (1) a DEL killed (SIGKILL) right
// after its look, holding its pod's netns lock, leaves the lock's
// directory but not the lock: the runtime's retried DEL finishes at once
// and removes the veth and the pod's cni_netns entry. (2) With the stripe of
// pod B's netns held by another verb that never lets go (a pod whose nsfs
// inode meets B's in the stripe, its DEL stopped), each verb of B waits at
// most netnsLockWait (5 s) and goes on: DEL eth0 keeps the entry net1 uses,
// DEL net1 removes it.
func TestAttack30bNetnsLockKilledAndHeld(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)

	// (1) killed holding the lock.
	podA := podWithLoUp(t, e)
	idA := "a30bkill"
	t.Cleanup(func() { _ = e.Del(podA, idA, "eth0") })
	if _, err := a22Add(e, podA, idA, "eth0"); err != nil {
		t.Fatalf("ADD A: %v", err)
	}
	_, idxA := e.HostVeth(idA)
	cookieA := e.NetnsCookieOf(podA)
	envv := pluginEnv("DEL", idA, podA, "eth0")
	envv["EBPF_CNI_CRASH_AT"] = "del-look"
	out, err := e.RunPlugin(crashBinary(t), envv, e.StdinConf(nil))
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("DEL at del-look: %v, want SIGKILL; %s", err, out)
	}
	stripe := filepath.Join(e.PinDir, "locks", "netns", fmt.Sprintf("%03x", a30bNetnsIno(t, podA)%1024))
	if _, err := os.Stat(stripe); err != nil {
		t.Errorf("the killed DEL's lock directory %s: %v", stripe, err)
	}
	start := time.Now()
	if err := e.Del(podA, idA, "eth0"); err != nil {
		t.Fatalf("retried DEL of A: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the retried DEL took %v: it waited on the lock of the killed one", d.Round(time.Millisecond))
	}
	if v, err := testenv.LookupNetns(e.Maps(), cookieA); err == nil {
		t.Errorf("A's cni_netns entry left after the retried DEL: %+v", v)
	}
	if err := e.InNode(func() error { _, err := netlink.LinkByIndex(idxA); return err }); err == nil {
		t.Errorf("A's host veth (ifindex %d) left after the retried DEL", idxA)
	}

	// (2) B's stripe held by another's verb that never lets go.
	podB := podWithLoUp(t, e)
	idB := "a30bheld"
	for _, ifn := range []string{"eth0", "net1"} {
		t.Cleanup(func() { _ = e.Del(podB, idB, ifn) })
		if _, err := a22Add(e, podB, idB, ifn); err != nil {
			t.Fatalf("ADD B %s: %v", ifn, err)
		}
	}
	cookieB := e.NetnsCookieOf(podB)
	release := datapath.LockNetns(e.PinDir, a30bNetnsIno(t, podB), time.Second)
	if release == nil {
		t.Fatal("could not take B's stripe")
	}
	t.Cleanup(release)
	const bound = 5*time.Second + 2*time.Second // netnsLockWait, and the DEL's own work under load
	for _, ifn := range []string{"eth0", "net1"} {
		start := time.Now()
		if err := e.Del(podB, idB, ifn); err != nil {
			t.Fatalf("DEL B %s beside the held stripe: %v", ifn, err)
		}
		d := time.Since(start)
		t.Logf("DEL B %s beside the held stripe: %v", ifn, d.Round(time.Millisecond))
		if d > bound {
			t.Errorf("DEL B %s took %v beside the held stripe (bound %v)", ifn, d.Round(time.Millisecond), bound)
		}
		_, err := testenv.LookupNetns(e.Maps(), cookieB)
		if ifn == "eth0" && err != nil {
			t.Errorf("DEL B eth0 took the cni_netns entry net1 uses: %v", err)
		}
		if ifn == "net1" && err == nil {
			t.Errorf("B's last DEL left its cni_netns entry")
		}
	}
}
