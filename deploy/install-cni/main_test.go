package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestInstallBinariesAtomicAndIdempotent(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "bin")
	for _, n := range []string{"ebpf-cni", "host-local"} {
		if err := os.WriteFile(filepath.Join(src, n), []byte("#!"+n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := installBinaries(src, dst, nil)
	if err != nil || c.total != 2 || c.updated != 2 {
		t.Fatalf("first install: %+v %v", c, err)
	}
	st, err := os.Stat(filepath.Join(dst, "ebpf-cni"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("installed binary: %v %v", st, err)
	}
	if c, err = installBinaries(src, dst, nil); err != nil || c.updated != 0 {
		t.Fatalf("second install rewrote files: %+v %v", c, err)
	}
	// A node's own host-local is kept; ebpf-cni is always ours.
	if err := os.WriteFile(filepath.Join(src, "host-local"), []byte("newer"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "ebpf-cni"), []byte("newer"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err = installBinaries(src, dst, []string{"host-local", "loopback"}); err != nil || c.updated != 1 || c.kept != 1 {
		t.Fatalf("install with -if-missing: %+v %v", c, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "host-local")); string(b) != "#!host-local" {
		t.Fatalf("node's host-local was replaced: %q", b)
	}
	ents, _ := os.ReadDir(dst)
	if len(ents) != 2 {
		t.Fatalf("temporary files left behind: %v", ents)
	}
}
