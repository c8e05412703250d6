package state

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestHoldLegacyNamedClaim: a build before 0fdba74 wrote the claim of a
// container ID with "_" under its legacy name (pod_x_eth0.json), and an ADD
// of it killed part way leaves it there. GC and reconcile find it (Read
// looks there), judge it Abandoned and Hold it while they tear it down; a
// DEL must then wait (Busy, WaitIdle) and a new ADD be refused (Claim:
// ErrClaimed), as for a claim under its own name. Otherwise the new ADD
// claims the hashed name, makes its veth (same host veth name), and the
// teardown's Remove deletes both files and that veth.
func TestHoldLegacyNamedClaim(t *testing.T) {
	s := testStore(t)
	if err := os.MkdirAll(s.Dir(), 0o700); err != nil {
		t.Fatal(err)
	}
	dead := &Record{ContainerID: "pod_x", IfName: "eth0", Provisional: true, Pid: 1, Created: time.Now().UTC()}
	b, err := json.Marshal(dead)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir(), "pod_x_eth0.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	recs, err := s.List()
	if err != nil || len(recs) != 1 {
		t.Fatalf("List: %v, %v", recs, err)
	}
	st, now, err := s.Recheck(recs[0])
	if err != nil || st != Abandoned {
		t.Fatalf("Recheck of a dead ADD's legacy-named claim: %d, %v; want Abandoned", st, err)
	}
	release, ok, err := s.Hold(now)
	if err != nil || !ok {
		t.Fatalf("Hold of a legacy-named abandoned claim: %v, %v", ok, err)
	}
	defer release()
	if !s.Busy(now) {
		t.Error("a held legacy-named claim is not Busy: a DEL would not wait for its teardown")
	}
	if s.WaitIdle("pod_x", "eth0", 50*time.Millisecond) {
		t.Error("WaitIdle returned at once on a held legacy-named claim: a DEL would run beside the teardown")
	}
	f, err := s.Claim(&Record{ContainerID: "pod_x", IfName: "eth0", Provisional: true, Pid: os.Getpid(), Created: time.Now().UTC()})
	if err == nil {
		f.Close()
	}
	if !errors.Is(err, ErrClaimed) {
		t.Errorf("Claim of an attachment whose legacy-named claim is held: %v, want ErrClaimed (a new ADD must get 11)", err)
	}
	// The other attachment that legacy name could stand for is not held.
	if s.Busy(&Record{ContainerID: "pod", IfName: "x_eth0", Provisional: true}) {
		t.Error("(pod, x_eth0) Busy through (pod_x, eth0)'s legacy-named claim")
	}
}

// TestHoldRefusesSymlink: a symlink planted in place of an abandoned claim
// after GC's verdict is not followed: Hold holds nothing and says why.
func TestHoldRefusesSymlink(t *testing.T) {
	s := testStore(t)
	dead := &Record{ContainerID: "c1", IfName: "eth0", Provisional: true, Pid: 1, Created: time.Now().UTC()}
	if err := s.Write(dead); err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(t.TempDir(), "claim.json")
	b, _ := json.Marshal(dead)
	if err := os.WriteFile(elsewhere, b, 0o600); err != nil {
		t.Fatal(err)
	}
	p := s.Path("c1", "eth0")
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, p); err != nil {
		t.Fatal(err)
	}
	release, ok, err := s.Hold(dead)
	if ok {
		release()
		t.Fatal("Hold followed a symlink planted in place of the claim")
	}
	if err == nil {
		t.Error("Hold of a claim replaced by a symlink: no error; want one naming it")
	}
	if s.Busy(dead) {
		t.Error("Busy through a symlink")
	}
}
