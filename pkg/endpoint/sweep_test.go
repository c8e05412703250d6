package endpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// TestReconcileAddEndsAfterList: an ADD that ends between Reconcile's
// listing of the records (its record still provisional, locked) and its
// look at that record is not taken for one that died part way: its pod is
// alive (the agent's timer once tore down 59 pods of a burst of ADDs so).
func TestReconcileAddEndsAfterList(t *testing.T) {
	node, pod := freshNetns(t), freshNetns(t)
	dir := t.TempDir()
	conf := []byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"recon","type":"ebpf-cni","pinDir":%q,"stateDir":%q}`,
		filepath.Join(dir, "pins"), filepath.Join(dir, "state")))
	n, err := ParseNetwork(conf)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{n.PinDir, n.Store().Dir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	store := n.Store()
	rec := &state.Record{ContainerID: "c1", IfName: "eth0", HostIf: state.HostIfName("c1", "eth0"), Provisional: true, Pid: os.Getpid()}
	claim, err := store.Claim(rec)
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Close()
	err = node.Do(func(ns.NetNS) error {
		// Its peer in a pod netns, as ADD makes it (a host veth with its
		// peer beside it is another tool's: replacedLink).
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: rec.HostIf}, PeerName: "peer-c1",
			PeerNamespace: netlink.NsFd(int(pod.Fd()))}
		return netlink.LinkAdd(veth)
	})
	if err != nil {
		t.Fatal(err)
	}
	afterList := func(r *state.Record) {
		if r != nil {
			return // after the listing only
		}
		// The ADD ends: its final record replaces the provisional one.
		final := *rec
		final.Provisional = false
		if err := store.Write(&final); err != nil {
			t.Error(err)
		}
		claim.Close()
	}
	var done []string
	err = node.Do(func(ns.NetNS) error {
		var err error
		s := reconcileSweep(n, conf, "", true)
		s.Seam = afterList
		done, err = s.Run()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(done) > 0 {
		t.Errorf("Reconcile would remove a pod whose ADD just ended: %v", done)
	}
	// Still provisional and no longer locked: that ADD died; it goes.
	if err := store.Write(rec); err != nil {
		t.Fatal(err)
	}
	err = node.Do(func(ns.NetNS) error {
		var err error
		done, err = Reconcile(n, conf, "", true)
		return err
	})
	if err != nil || len(done) != 1 {
		t.Errorf("Reconcile of a record an ADD left half made: %v, %v; want it listed", done, err)
	}
}
