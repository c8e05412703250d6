package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestRefuseNewerLayout: only a directory maps_vN with N above this build's
// layout is a newer datapath; this layout's, older ones, a newer build's
// staging directory, files and other names are not.
func TestRefuseNewerLayout(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, isDir bool) {
		t.Helper()
		p := filepath.Join(dir, name)
		var err error
		if isDir {
			err = os.Mkdir(p, 0o700)
		} else {
			err = os.WriteFile(p, nil, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	v := maps.LayoutVersion
	for _, n := range []string{fmt.Sprintf("maps_v%d", v), fmt.Sprintf("maps_v%d", v-1), fmt.Sprintf("maps_v%d_staging", v+1), "maps_vx", "progs"} {
		mk(n, true)
	}
	mk(fmt.Sprintf("maps_v%d", v+3), false)
	if err := RefuseNewerLayout(dir); err != nil {
		t.Fatalf("no newer layout here, refused: %v", err)
	}
	mk(fmt.Sprintf("maps_v%d", v+2), true)
	mk(fmt.Sprintf("maps_v%d", v+1), true)
	err := RefuseNewerLayout(dir)
	var nl *NewerLayoutError
	if !errors.As(err, &nl) || fmt.Sprint(nl.Versions) != fmt.Sprint([]int{v + 1, v + 2}) {
		t.Fatalf("newer layouts v%d, v%d: got %v", v+1, v+2, err)
	}
	for _, want := range []string{fmt.Sprintf("layout v%d", v+2), fmt.Sprintf("this build's v%d", v), dir, "docs/upgrade.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}
