package ebpfcni

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestDocsCommandsNameThisLayout: a command the docs give operators
// (`bpftool map dump pinned .../maps_vN/...`) names this build's maps
// directory; after a layout change the old one no longer exists (the docs
// said maps_v2 for three layouts).
func TestDocsCommandsNameThisLayout(t *testing.T) {
	want := fmt.Sprintf("maps_v%d", maps.LayoutVersion)
	cmd := regexp.MustCompile(`bpftool [^\n]*?/(maps_v\d+)/`)
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "README.md")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range cmd.FindAllSubmatch(b, -1) {
			if string(m[1]) != want {
				t.Errorf("%s: %q names %s; this build's maps are in %s", f, m[0], m[1], want)
			}
		}
	}
}
