package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// testCgroup is a cgroup2 directory of its own, removed at the end.
func testCgroup(t *testing.T) string {
	t.Helper()
	root, err := CgroupRoot("")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, fmt.Sprintf("ebpf-cni-unit-%d", os.Getpid()))
	must(t, os.Mkdir(dir, 0o755))
	t.Cleanup(func() { os.Remove(dir) })
	return dir
}

// sockOpsProgs counts the sock_ops programs attached to a cgroup.
func sockOpsProgs(t *testing.T, cg string) int {
	t.Helper()
	f, err := os.Open(cg)
	must(t, err)
	defer f.Close()
	r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	must(t, err)
	return len(r.Programs)
}

// An older build pinned the pacing link as links/node_sock_ops, where only
// host veths' links belong now. EnsurePacing and Upgrade move it to node/:
// the same link (not a second sock_ops program on the cgroup), shown by
// status with the node hooks and never taken for an orphan veth pin.
func TestPacingPinMovesToNode(t *testing.T) {
	for _, via := range []string{"EnsurePacing", "Upgrade"} {
		t.Run(via, func(t *testing.T) {
			dp := testDatapath(t)
			cg := testCgroup(t)
			l, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: dp.SockOps})
			must(t, err)
			old := legacyPacingPin(dp.PinRoot)
			must(t, mkdirFor(old))
			must(t, l.Pin(old))
			info, err := l.Info()
			must(t, err)
			l.Close()
			t.Cleanup(func() { dropLinkPin(PacingLinkPin(dp.PinRoot)); dropLinkPin(old) })
			if n := len(VethLinkPins(dp.PinRoot)); n != 0 {
				t.Errorf("the old pacing pin is taken for %d host veth link pins", n)
			}

			if via == "EnsurePacing" {
				must(t, dp.EnsurePacing(cg))
			} else {
				_, err := dp.Upgrade(false)
				must(t, err)
			}
			if _, err := os.Stat(old); !os.IsNotExist(err) {
				t.Errorf("old pin %s still there: %v", old, err)
			}
			moved, err := link.LoadPinnedLink(PacingLinkPin(dp.PinRoot), nil)
			must(t, err)
			mi, err := moved.Info()
			moved.Close()
			must(t, err)
			if mi.ID != info.ID {
				t.Errorf("pacing link at %s is link %d, the old one was %d: attached anew, not moved", PacingLinkPin(dp.PinRoot), mi.ID, info.ID)
			}
			if n := sockOpsProgs(t, cg); n != 1 {
				t.Errorf("%d sock_ops programs on the cgroup, want 1", n)
			}
			found := false
			for _, p := range NodeHookPins(dp.PinRoot) {
				found = found || p.Name == "cgroup_sock_ops"
			}
			if !found {
				t.Errorf("node hooks %v lack the pacing link", NodeHookPins(dp.PinRoot))
			}
		})
	}
}

// TestObjHashesCurrent: objhash_bpfel.go names every embedded object with
// its size, CRC-32 and SHA-256 prefix (stale after bpf/ changes until
// make generate: pins would still be named right, at the SHA-256's cost),
// and an object whose bytes differ from the table's is hashed, not named
// from it.
func TestObjHashesCurrent(t *testing.T) {
	for _, root := range []*object{objFromContainer, objToContainer, objSockOps, objFromUplink, objToUplink, objSock, objTunnel} {
		for _, o := range []*object{root, root.compat} {
			if o == nil {
				continue
			}
			sum := sha256.Sum256(o.bytes)
			want := hex.EncodeToString(sum[:6])
			k, ok := objHashes[o.name]
			if !ok || k.sha != want || k.size != len(o.bytes) || k.crc != crc32.ChecksumIEEE(o.bytes) {
				t.Errorf("objHashes[%q] = %+v, the object's SHA-256 starts %s: run make generate", o.name, k, want)
			}
			if got := (&object{name: o.name, bytes: o.bytes}).hash(); got != want {
				t.Errorf("%s: hash %s, want %s", o.name, got, want)
			}
		}
	}
	changed := append([]byte(nil), objToContainer.bytes...)
	changed[len(changed)/2] ^= 1
	sum := sha256.Sum256(changed)
	if got, want := (&object{name: objToContainer.name, bytes: changed}).hash(), hex.EncodeToString(sum[:6]); got != want || got == objHashes[objToContainer.name].sha {
		t.Fatalf("changed object: hash %s, want its own %s", got, want)
	}
}
