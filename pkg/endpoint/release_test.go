package endpoint

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// TestReconcileSparesAnADDThatFinishes: Reconcile read an ADD's
// provisional record, then the ADD committed (the complete record renamed
// over the locked one) and let go of its lock. The attachment is live (its
// veth exists): Reconcile must leave it, not tear it down as half made.
// Seen on a real node as pods losing their veth and IPs seconds after they
// started, whenever the agent reconciled during their ADD.
func TestReconcileSparesAnADDThatFinishes(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root (a network namespace and a veth); CI must run it as root")
		}
		t.Skip("needs root (a network namespace and a veth)")
	}
	runtime.LockOSThread() // the thread ends with the test netns: never unlocked
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	test, err := netns.New() // and switches this thread to it
	if err != nil {
		t.Fatal(err)
	}
	defer test.Close()
	defer netns.Set(orig)

	n := &Network{Name: "net", PinDir: t.TempDir(), StateDir: t.TempDir()}
	store := n.Store()
	const cid, ifname = "0123456789abcdef", "eth0"
	hostIf := state.HostIfName(cid, ifname)
	rec := &state.Record{ContainerID: cid, IfName: ifname, HostIf: hostIf, Provisional: true, Pid: os.Getpid()}
	claim, err := store.Claim(rec)
	if err != nil {
		t.Fatal(err)
	}
	// The ADD's veth.
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	// The ADD finishes between Reconcile's List and its look at the record.
	reconcileListed = func() {
		done := *rec
		done.Provisional, done.Pid, done.IPs = false, 0, []string{"10.0.0.5/24"}
		if err := store.Write(&done); err != nil {
			t.Error(err)
		}
		claim.Close()
	}
	defer func() { reconcileListed = func() {} }()

	removed, err := Reconcile(n, []byte(`{}`), "", false)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if len(removed) != 0 {
		t.Fatalf("reconcile removed a live attachment: %v", removed)
	}
	if _, err := netlink.LinkByName(hostIf); err != nil {
		t.Fatalf("the live attachment's veth: %v", err)
	}
	r, err := store.Read(cid, ifname)
	if err != nil || r == nil || r.Provisional {
		t.Fatalf("the live attachment's record: %+v, %v", r, err)
	}

	// A provisional record whose ADD died (no lock) is still removed.
	dead := &state.Record{ContainerID: "fedcba9876543210", IfName: ifname, HostIf: state.HostIfName("fedcba9876543210", ifname), Provisional: true, Pid: 1 << 22}
	f, err := store.Claim(dead)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	reconcileListed = func() {}
	removed, err = Reconcile(n, []byte(`{}`), "", false)
	if len(removed) != 1 {
		t.Fatalf("reconcile of a dead ADD's record: removed %v (%v), want it", removed, err)
	}
}
