package datapath

import "testing"

// TestIsPinDirEntry: only the names pins.go makes under the pin directory
// pass CheckPinDir; another tool's directory, or ours with a stray suffix,
// do not.
func TestIsPinDirEntry(t *testing.T) {
	for name, want := range map[string]bool{
		"progs": true, "links": true, "node": true, "locks": true,
		"build-full": true, "build-compat": true, "pacing-on": true, "pacing-off": true, "build-other": false,
		"maps_v1": true, "maps_v2": true, "maps_v12_staging": true,
		"maps_v": false, "maps_v0": false, "maps_v02": false, "maps_vx": false, "maps_v2_old": false,
		"maps": false, "ebpf-cni": false, "cilium": false, "tc": false, "progs2": false,
	} {
		if got := isPinDirEntry(name); got != want {
			t.Errorf("isPinDirEntry(%q) = %v, want %v", name, got, want)
		}
	}
}
