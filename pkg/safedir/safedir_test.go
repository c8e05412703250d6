package safedir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Claim and WriteFile leave only the file they name: the claim's file has no
// temp name at any time (a kill before its link leaves nothing).
func TestClaimAndWriteLeaveOnlyTheirFile(t *testing.T) {
	dir := t.TempDir()
	f, err := Claim(dir, "a.json", []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if locked, err := Locked(filepath.Join(dir, "a.json")); err != nil || !locked {
		t.Fatalf("claimed file: locked %v, %v; want locked", locked, err)
	}
	if _, err := Claim(dir, "a.json", []byte("two")); !errors.Is(err, ErrExist) {
		t.Fatalf("second claim: %v, want ErrExist", err)
	}
	if err := WriteFile(dir, "a.json", []byte("three")); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFile(filepath.Join(dir, "a.json")); err != nil || string(b) != "three" {
		t.Fatalf("after WriteFile: %q, %v", b, err)
	}
	if err := WriteFile(dir, "b.json", []byte("new")); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
		if fi, _ := e.Info(); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %o, want 600", e.Name(), fi.Mode().Perm())
		}
	}
	if len(names) != 2 || names[0] != "a.json" || names[1] != "b.json" {
		t.Fatalf("dir holds %v, want [a.json b.json]", names)
	}
}
