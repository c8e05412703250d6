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

// TestGCReAddedAfterList: a final record not in the valid list, DELed and
// ADDed again (a new final record, a new veth) between GC's listing and its
// look at it, is the new ADD's: the runtime's valid list predates it, as
// for a provisional record whose ADD ended after the listing (Completed).
// GC must not tear the new attachment down under the old record's verdict.
func TestGCReAddedAfterList(t *testing.T) {
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
	defer func() {
		node.Close()
		testutils.UnmountNS(node)
	}()
	dir := t.TempDir()
	conf := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"gcreadd","type":"ebpf-cni","pinDir":%q,"stateDir":%q,`+
		`"cni.dev/valid-attachments":[]}`, filepath.Join(dir, "pins"), filepath.Join(dir, "state")))
	n, err := endpoint.ParseNetwork(conf)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{n.PinDir, n.Store().Dir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	store := n.Store()
	hostIf := state.HostIfName("readded", "eth0")
	veth := func() (int, error) {
		idx := 0
		err := node.Do(func(ns.NetNS) error {
			if err := addPodVeth(t, hostIf, "gcpeer"); err != nil {
				return err
			}
			l, err := netlink.LinkByName(hostIf)
			if err == nil {
				idx = l.Attrs().Index
			}
			return err
		})
		return idx, err
	}
	idx, err := veth()
	if err != nil {
		t.Fatal(err)
	}
	old := &state.Record{ContainerID: "readded", IfName: "eth0", HostIf: hostIf, HostIfindex: idx, Created: time.Now().UTC()}
	if err := store.Write(old); err != nil {
		t.Fatal(err)
	}
	var newAdd *state.Record
	gcSeam = func(held *state.Record) {
		if held != nil {
			return // after the listing only
		}
		// The runtime's DEL of the attachment, then its new ADD.
		if err := store.Remove("readded", "eth0"); err != nil {
			t.Error(err)
			return
		}
		_ = node.Do(func(ns.NetNS) error {
			if l, err := netlink.LinkByName(hostIf); err == nil {
				return netlink.LinkDel(l)
			}
			return nil
		})
		idx, err := veth()
		if err != nil {
			t.Error(err)
			return
		}
		r := *old
		r.HostIfindex, r.Created = idx, time.Now().UTC().Add(time.Millisecond)
		if err := store.Write(&r); err != nil {
			t.Error(err)
			return
		}
		newAdd = &r
	}
	defer func() { gcSeam = nil }()
	err = node.Do(func(ns.NetNS) error {
		return GC(&skel.CmdArgs{StdinData: conf})
	})
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if newAdd == nil {
		t.Fatal("the seam made no new ADD; the test would prove nothing")
	}
	now, err := store.Read("readded", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	var linkErr error
	_ = node.Do(func(ns.NetNS) error {
		_, linkErr = netlink.LinkByName(hostIf)
		return nil
	})
	if now == nil || linkErr != nil {
		t.Errorf("GC tore down the attachment an ADD made after its listing, under the DELed record's verdict (record %v, veth: %v)", now != nil, linkErr)
	}
}
