package state

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHostIfName(t *testing.T) {
	a := HostIfName("abc", "eth0")
	if len(a) != 15 || !strings.HasPrefix(a, HostIfPrefix) {
		t.Fatalf("bad name %q", a)
	}
	if a != HostIfName("abc", "eth0") {
		t.Fatal("not deterministic")
	}
	if a == HostIfName("abc", "eth1") || a == HostIfName("abd", "eth0") {
		t.Fatal("different attachments share a name")
	}
}

func testStore(t *testing.T) Store {
	return Store{Root: t.TempDir(), Network: "net1"}
}

func TestStoreWriteReadListRemove(t *testing.T) {
	s := testStore(t)
	if r, err := s.Read("c1", "eth0"); r != nil || err != nil {
		t.Fatalf("read of a missing record: %v, %v; want nil, nil", r, err)
	}
	want := &Record{ContainerID: "c1", IfName: "eth0", HostIf: HostIfName("c1", "eth0"), HostIfindex: 7,
		IPs: []string{"10.0.0.2", "fd00::2"}, PodNamespace: "ns", PodName: "p",
		HostPorts: []HostPort{{Protocol: "tcp", HostPort: 80, PodIP: "10.0.0.2", ContainerPort: 8080}}}
	if err := s.Write(want); err != nil {
		t.Fatal(err)
	}
	got, err := s.Read("c1", "eth0")
	if err != nil || got == nil {
		t.Fatalf("read: %v, %v", got, err)
	}
	if got.HostIf != want.HostIf || got.HostIfindex != 7 || len(got.IPs) != 2 || len(got.HostPorts) != 1 ||
		got.HostPorts[0].ContainerPort != 8080 || got.PodLabel() != "ns/p" {
		t.Fatalf("read back %+v, wrote %+v", got, want)
	}
	if err := s.Write(&Record{ContainerID: "c2", IfName: "net1"}); err != nil {
		t.Fatal(err)
	}
	recs, err := s.List()
	if err != nil || len(recs) != 2 {
		t.Fatalf("list: %d records, %v; want 2", len(recs), err)
	}
	byIdx := ByHostIfindex(recs)
	if len(byIdx) != 1 || byIdx[7].ContainerID != "c1" {
		t.Fatalf("by ifindex: %v; want only c1 (c2 has no ifindex)", byIdx)
	}
	all, err := ListAll(s.Root)
	if err != nil || len(all) != 2 {
		t.Fatalf("list all: %d, %v", len(all), err)
	}
	for _, a := range [][2]string{{"c1", "eth0"}, {"c2", "net1"}, {"c3", "eth0"}} { // c3 never existed: fine
		if err := s.Remove(a[0], a[1]); err != nil {
			t.Fatalf("remove %s/%s: %v", a[0], a[1], err)
		}
	}
	if recs, _ := s.List(); len(recs) != 0 {
		t.Fatalf("records after removing all: %d", len(recs))
	}
}

func TestClaimIsExclusiveAndLocked(t *testing.T) {
	s := testStore(t)
	r := &Record{ContainerID: "c1", IfName: "eth0", Provisional: true, Pid: os.Getpid()}
	f, err := s.Claim(r)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Busy(r) {
		t.Fatal("a claimed record is not busy while its claim is held")
	}
	if _, err := s.Claim(r); !errors.Is(err, ErrClaimed) {
		t.Fatalf("second claim: %v, want ErrClaimed", err)
	}
	if s.WaitIdle("c1", "eth0", 20*time.Millisecond) {
		t.Fatal("WaitIdle returned while the claim was held")
	}
	f.Close()
	if s.Busy(r) {
		t.Fatal("busy after the claim was released")
	}
	if !s.WaitIdle("c1", "eth0", time.Second) {
		t.Fatal("WaitIdle timed out after the claim was released")
	}
	// A complete record is never busy, even while a file handle is open.
	r.Provisional = false
	if s.Busy(r) {
		t.Fatal("a complete record is busy")
	}
}

func TestLongContainerIDIsHashed(t *testing.T) {
	s := testStore(t)
	id := strings.Repeat("a", 300)
	if err := s.Write(&Record{ContainerID: id, IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if n := len(filepath.Base(s.Path(id, "eth0"))); n > 200 {
		t.Fatalf("record file name is %d bytes long", n)
	}
	recs, err := s.List()
	if err != nil || len(recs) != 1 || recs[0].ContainerID != id {
		t.Fatalf("list: %v, %v; want the record with the full ID", recs, err)
	}
}

func TestReadRefusesSymlink(t *testing.T) {
	s := testStore(t)
	if err := os.MkdirAll(s.Dir(), 0o700); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "elsewhere.json")
	if err := os.WriteFile(target, []byte(`{"containerID":"x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, s.Path("c1", "eth0")); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Read("c1", "eth0"); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("read through a symlink: %v, %v; want an error naming the symlink", r, err)
	}
	if recs, _ := s.List(); len(recs) != 0 {
		t.Fatalf("list followed a symlink: %v", recs)
	}
}

func TestStaleTempsRemovedFreshKept(t *testing.T) {
	s := testStore(t)
	if err := os.MkdirAll(s.Dir(), 0o700); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(s.Dir(), ".c1_eth0.json.0011.tmp")
	stale := filepath.Join(s.Dir(), ".c2_eth0.json.0022.tmp")
	for _, p := range []string{fresh, stale} {
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * StaleTempAge)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if recs, err := s.List(); err != nil || len(recs) != 0 {
		t.Fatalf("list read temp files: %v, %v", recs, err)
	}
	if err := s.RemoveStaleTemps(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temp file kept: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh temp file (a write in progress) removed: %v", err)
	}
}

func TestHandedOffName(t *testing.T) {
	for _, idx := range []int{1, 42, 2147483647} {
		name := HandedOffName(idx)
		if len(name) > 15 {
			t.Errorf("HandedOffName(%d) = %q: longer than IFNAMSIZ-1", idx, name)
		}
		if got, ok := HandedOffIfindex(name); !ok || got != idx {
			t.Errorf("HandedOffIfindex(%q) = %d, %v; want %d", name, got, ok, idx)
		}
		if strings.HasPrefix(name, HostIfPrefix) {
			t.Errorf("%q looks like a live host veth", name)
		}
	}
	for _, bad := range []string{"ebpz", "ebpz0", "ebpz-1", "ebpz01", "ebpzab", "ebpf12", "eth0"} {
		if _, ok := HandedOffIfindex(bad); ok {
			t.Errorf("HandedOffIfindex(%q) accepted", bad)
		}
	}
}

// Container IDs and interface names may both hold "_": (pod_x, eth0) and
// (pod, x_eth0) keep records of their own, and a record an earlier build
// wrote under the ambiguous name is found and removed only by its owner.
func TestStoreUnderscores(t *testing.T) {
	s := testStore(t)
	a := &Record{ContainerID: "pod_x", IfName: "eth0", HostIfindex: 1}
	b := &Record{ContainerID: "pod", IfName: "x_eth0", HostIfindex: 2}
	for _, r := range []*Record{a, b} {
		if err := s.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []*Record{a, b} {
		got, err := s.Read(r.ContainerID, r.IfName)
		if err != nil || got == nil || got.HostIfindex != r.HostIfindex {
			t.Fatalf("read %s/%s: %+v, %v", r.ContainerID, r.IfName, got, err)
		}
	}
	if err := s.Remove("pod", "x_eth0"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Read("pod_x", "eth0"); got == nil {
		t.Fatal("removing (pod, x_eth0) removed (pod_x, eth0)'s record")
	}
	if err := s.Remove("pod_x", "eth0"); err != nil {
		t.Fatal(err)
	}

	// An earlier build's record of (pod_x, eth0), at pod_x_eth0.json.
	legacy := filepath.Join(s.Dir(), "pod_x_eth0.json")
	if err := os.WriteFile(legacy, []byte(`{"containerID":"pod_x","ifName":"eth0","hostIfindex":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Read("pod", "x_eth0"); got != nil || err != nil {
		t.Fatalf("(pod, x_eth0) read (pod_x, eth0)'s legacy record: %+v, %v", got, err)
	}
	if err := s.Remove("pod", "x_eth0"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Read("pod_x", "eth0"); err != nil || got == nil || got.HostIfindex != 1 {
		t.Fatalf("(pod_x, eth0)'s legacy record after (pod, x_eth0)'s Remove: %+v, %v", got, err)
	}
	if err := s.Remove("pod_x", "eth0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(legacy); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("(pod_x, eth0)'s legacy record left by its own Remove: %v", err)
	}
}

// TestRecheckNewAddEndsBetweenReadAndLock: a record found unlocked (its
// ADD died) is removed by a DEL and claimed by a new ADD before Recheck
// reads it again; that ADD ends before Recheck looks at its lock. Its
// stale provisional copy is not taken for one an ADD left half made: the
// new ADD's pod is alive.
func TestRecheckNewAddEndsBetweenReadAndLock(t *testing.T) {
	s := testStore(t)
	dead := &Record{ContainerID: "c1", IfName: "eth0", Provisional: true, Pid: 1, Created: time.Now().UTC()}
	if err := s.Write(dead); err != nil {
		t.Fatal(err)
	}
	listed, err := s.List()
	if err != nil || len(listed) != 1 {
		t.Fatalf("List: %v, %v", listed, err)
	}
	next := &Record{ContainerID: "c1", IfName: "eth0", Provisional: true, Pid: os.Getpid(), Created: dead.Created.Add(time.Second)}
	var claim *os.File
	defer func() {
		recheckStep = func(string) {}
		if claim != nil {
			claim.Close()
		}
	}()
	recheckStep = func(step string) {
		var err error
		switch step {
		case "reread": // a DEL of the dead claim, then a new ADD claims it
			if err = s.Remove("c1", "eth0"); err == nil {
				claim, err = s.Claim(next)
			}
		case "relock": // the new ADD ends
			final := *next
			final.Provisional = false
			if err = s.Write(&final); err == nil {
				err = claim.Close()
			}
		}
		if err != nil {
			t.Error(err)
		}
	}
	st, now, err := s.Recheck(listed[0])
	if err != nil {
		t.Fatal(err)
	}
	if st != Completed || now == nil || now.Provisional {
		t.Fatalf("Recheck: status %d, record %+v; want Completed (%d) with the final record", st, now, Completed)
	}
	// Without any of that, an unlocked claim is what a dead ADD left.
	recheckStep = func(string) {}
	if err := s.Write(dead); err != nil {
		t.Fatal(err)
	}
	if st, _, err := s.Recheck(dead); st != Abandoned || err != nil {
		t.Fatalf("Recheck of a dead ADD's claim: status %d, %v; want Abandoned (%d)", st, err, Abandoned)
	}
}

// TestHoldAbandonedClaim: a held abandoned claim reads as an ADD at work
// (Busy: DEL waits) and keeps a new ADD from claiming the attachment; a
// second Hold, or one of a claim the file no longer holds, gets nothing.
func TestHoldAbandonedClaim(t *testing.T) {
	s := testStore(t)
	dead := &Record{ContainerID: "c1", IfName: "eth0", Provisional: true, Pid: 1, Created: time.Now().UTC()}
	if err := s.Write(dead); err != nil {
		t.Fatal(err)
	}
	release, ok, err := s.Hold(dead)
	if err != nil || !ok {
		t.Fatalf("Hold of an abandoned claim: %v, %v", ok, err)
	}
	if !s.Busy(dead) {
		t.Error("a held claim is not Busy: a DEL would not wait for its teardown")
	}
	if _, err := s.Claim(&Record{ContainerID: "c1", IfName: "eth0", Provisional: true, Pid: os.Getpid()}); !errors.Is(err, ErrClaimed) {
		t.Errorf("Claim of a held attachment: %v, want ErrClaimed", err)
	}
	if _, ok, err := s.Hold(dead); ok || err != nil {
		t.Errorf("second Hold: %v, %v; want nothing held", ok, err)
	}
	release()
	if s.Busy(dead) {
		t.Error("released claim still Busy")
	}
	other := *dead
	other.Pid = 2
	if _, ok, err := s.Hold(&other); ok || err != nil {
		t.Errorf("Hold of a claim the file does not hold: %v, %v; want nothing held", ok, err)
	}
	if err := s.Remove("c1", "eth0"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Hold(dead); ok || err != nil {
		t.Errorf("Hold of a removed claim: %v, %v; want nothing held", ok, err)
	}
}
