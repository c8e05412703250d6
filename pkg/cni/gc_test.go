package cni

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// TestGCAddEndsAfterList: an ADD that ends between GC's listing of the
// records (its record still provisional, locked) and its look at that
// record is not taken for one that died part way: the runtime's valid list
// predates that ADD, and its pod is alive. In the same GC a record an ADD
// left half made (provisional, unlocked) and a final record not in the
// valid list are torn down; a valid one and one an ADD holds stay.
func TestGCAddEndsAfterList(t *testing.T) {
	node, conf, store := newGCNode(t, "gcrace", `[{"containerID":"valid","ifname":"eth0"}]`)
	rec := func(id string, provisional bool) *state.Record {
		return &state.Record{ContainerID: id, IfName: "eth0", HostIf: state.HostIfName(id, "eth0"), Provisional: provisional, Pid: os.Getpid()}
	}
	racing := rec("racing", true)   // its ADD ends after the listing
	adding := rec("adding", true)   // its ADD runs through the GC
	died := rec("died", true)       // its ADD was killed
	stale := rec("stale", false)    // not in the valid list
	validRec := rec("valid", false) // in the valid list
	claim, err := store.Claim(racing)
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Close()
	hold, err := store.Claim(adding)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	for _, r := range []*state.Record{died, stale, validRec} {
		if err := store.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	all := []*state.Record{racing, adding, died, stale, validRec}
	err = node.Do(func(ns.NetNS) error {
		for i, r := range all {
			if err := addPodVeth(t, r.HostIf, fmt.Sprintf("gcpeer%d", i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gcSeam = func(r *state.Record) {
		if r != nil {
			return // after the listing only
		}
		// The ADD ends: its final record replaces the provisional one.
		final := *racing
		final.Provisional = false
		if err := store.Write(&final); err != nil {
			t.Error(err)
		}
		claim.Close()
	}
	defer func() { gcSeam = nil }()
	err = node.Do(func(ns.NetNS) error {
		return GC(&skel.CmdArgs{StdinData: conf})
	})
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	for _, c := range []struct {
		r    *state.Record
		kept bool
		why  string
	}{
		{racing, true, "its ADD ended during the GC"},
		{adding, true, "an ADD holds it"},
		{validRec, true, "it is in the valid list"},
		{died, false, "its ADD died part way"},
		{stale, false, "it is final and not in the valid list"},
	} {
		now, linkErr := attachmentLeft(t, node, store, c.r.ContainerID, c.r.HostIf)
		switch {
		case c.kept && (now == nil || linkErr != nil):
			t.Errorf("%s torn down (record %v, veth: %v); want kept: %s", c.r.ContainerID, now != nil, linkErr, c.why)
		case !c.kept && (now != nil || linkErr == nil):
			t.Errorf("%s kept (record %v, veth: %v); want torn down: %s", c.r.ContainerID, now != nil, linkErr, c.why)
		}
	}
}

// TestGCAbandonedReclaimed: between GC's verdict on a claim an ADD left half
// made and its teardown, a DEL of the attachment and a new ADD of it may
// run (the runtime retrying the pod). GC must not then tear down the new
// ADD's attachment: while it tears the abandoned claim down it holds it as
// an ADD at work would, so the DEL waits and the new ADD is refused (11)
// until GC is done. The seam does what del.go and claimRecord do: DEL
// removes a record only when no one holds it; ADD claims only a free one.
func TestGCAbandonedReclaimed(t *testing.T) {
	node, conf, store := newGCNode(t, "gcreclaim", `[]`)
	hostIf := state.HostIfName("retried", "eth0")
	died := &state.Record{ContainerID: "retried", IfName: "eth0", HostIf: hostIf, Provisional: true, Pid: 1, Created: time.Now().UTC()}
	if err := store.Write(died); err != nil {
		t.Fatal(err)
	}
	veth := func() error {
		return node.Do(func(ns.NetNS) error {
			return addPodVeth(t, hostIf, "gcpeer")
		})
	}
	if err := veth(); err != nil {
		t.Fatal(err)
	}
	var newAdd *state.Record
	gcSeam = func(r *state.Record) {
		if r == nil {
			return // before the teardown only
		}
		// DEL of the attachment: only a record nobody holds is its to remove.
		if rec, err := store.Read(r.ContainerID, r.IfName); err != nil || rec == nil || store.Busy(rec) {
			return
		}
		if err := store.Remove(r.ContainerID, r.IfName); err != nil {
			t.Error(err)
			return
		}
		_ = node.Do(func(ns.NetNS) error {
			if l, err := netlink.LinkByName(hostIf); err == nil {
				return netlink.LinkDel(l)
			}
			return nil
		})
		// The runtime's new ADD claims it, makes its veth and ends.
		next := &state.Record{ContainerID: r.ContainerID, IfName: r.IfName, HostIf: hostIf, Provisional: true, Pid: os.Getpid(), Created: time.Now().UTC()}
		claim, err := store.Claim(next)
		if err != nil {
			return // refused: GC holds it
		}
		defer claim.Close()
		if err := veth(); err != nil {
			t.Error(err)
			return
		}
		final := *next
		final.Provisional = false
		if err := store.Write(&final); err != nil {
			t.Error(err)
		}
		newAdd = &final
	}
	defer func() { gcSeam = nil }()
	err := node.Do(func(ns.NetNS) error {
		return GC(&skel.CmdArgs{StdinData: conf})
	})
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	now, linkErr := attachmentLeft(t, node, store, "retried", hostIf)
	switch {
	case newAdd != nil && (now == nil || linkErr != nil):
		t.Errorf("GC tore down the attachment a new ADD made while GC was at its abandoned claim (record %v, veth: %v)", now != nil, linkErr)
	case newAdd == nil && (now != nil || linkErr == nil):
		t.Errorf("the abandoned claim kept (record %v, veth: %v); want torn down", now != nil, linkErr)
	}
}

// newGCNode is a node netns and a network of name whose GC valid list is
// valid (JSON), with its pin and state directories; removed after the test.
func newGCNode(t *testing.T, name, valid string) (node ns.NetNS, conf []byte, store state.Store) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root; CI runs as root")
		}
		t.Skip("needs root (a netns and veths)")
	}
	node, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		node.Close()
		testutils.UnmountNS(node)
	})
	dir := t.TempDir()
	conf = []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"ebpf-cni","pinDir":%q,"stateDir":%q,"cni.dev/valid-attachments":%s}`,
		name, filepath.Join(dir, "pins"), filepath.Join(dir, "state"), valid))
	n, err := endpoint.ParseNetwork(conf)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{n.PinDir, n.Store().Dir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return node, conf, n.Store()
}

// attachmentLeft reads what is left of an attachment after GC: its record
// (nil if gone) and the lookup error of its host veth in node.
func attachmentLeft(t *testing.T, node ns.NetNS, store state.Store, containerID, hostIf string) (*state.Record, error) {
	t.Helper()
	now, err := store.Read(containerID, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	var linkErr error
	_ = node.Do(func(ns.NetNS) error {
		_, linkErr = netlink.LinkByName(hostIf)
		return nil
	})
	return now, linkErr
}

// addPodVeth makes, in the calling thread's netns, a host veth whose peer
// is in a pod netns of its own, as ADD makes them (a veth with its peer
// beside it is another tool's to the teardown: replacedLink).
func addPodVeth(t *testing.T, hostIf, peer string) error {
	t.Helper()
	pod, err := testutils.NewNS()
	if err != nil {
		return err
	}
	t.Cleanup(func() {
		pod.Close()
		testutils.UnmountNS(pod)
	})
	return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: peer,
		PeerNamespace: netlink.NsFd(int(pod.Fd()))})
}
