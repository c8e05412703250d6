package datapath

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// A build never runs over a newer build's datapath. Rolling a node back
// from a release of a newer map layout cannot be done in place: this build
// cannot read the newer maps, so it would set up empty maps of its own and
// swap the node hooks to them (hostPort entries, masquerade and conntrack
// state gone: flows reset, pods' traffic leaving unmasqueraded), while the
// pods kept the newer programs over the newer maps. Refusing instead
// leaves the newer datapath running untouched (pods, node hooks, state):
// traffic goes on, new pods wait, and the operator rolls forward again or
// drains the node and removes the datapath first (docs/upgrade.md, "Rolling
// back").

// NewerLayoutError: the pin directory holds maps of a layout newer than
// this build's.
type NewerLayoutError struct {
	PinRoot  string
	Versions []int // the newer layouts found, lowest first
}

func (e *NewerLayoutError) Error() string {
	return fmt.Sprintf("the datapath at %s has maps of layout v%d (%s), newer than this build's v%d: refusing to touch it (a rollback to an older release?); "+
		"its pods keep running on the newer release's programs; roll forward again, or drain the node and remove the datapath first (docs/upgrade.md, Rolling back)",
		e.PinRoot, e.Versions[len(e.Versions)-1], LayoutMapsDir(e.PinRoot, e.Versions[len(e.Versions)-1]), maps.LayoutVersion)
}

// newerLayouts lists the layouts above this build's whose maps are pinned
// in pinRoot (a newer build's staging directory is not one: its maps
// belong to nothing yet).
func newerLayouts(pinRoot string) []int {
	ents, _ := os.ReadDir(pinRoot)
	var out []int
	for _, e := range ents {
		v, ok := strings.CutPrefix(e.Name(), "maps_v")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || !e.IsDir() || n <= maps.LayoutVersion {
			continue
		}
		out = append(out, n)
	}
	sort.Ints(out)
	return out
}

// RefuseNewerLayout returns a *NewerLayoutError when pinRoot holds maps of
// a newer layout than this build's, nil otherwise.
func RefuseNewerLayout(pinRoot string) error {
	if vs := newerLayouts(filepath.Clean(pinRoot)); len(vs) > 0 {
		return &NewerLayoutError{PinRoot: pinRoot, Versions: vs}
	}
	return nil
}
