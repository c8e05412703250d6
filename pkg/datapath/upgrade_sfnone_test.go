package datapath

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestUpgradeClearsStackFlowsNone: an upgrade over another build's pinned
// programs takes EP_F_SF_NONE off every address entry before any pod runs
// this build's from_container (the other build's to_container recorded
// flows without clearing it); an upgrade with only this build's programs
// pinned (an agent restarting) leaves it.
func TestUpgradeClearsStackFlowsNone(t *testing.T) {
	none := uint32(maps.EndpointFlagStackFlowsNone)
	for _, other := range []bool{false, true} {
		name := map[bool]string{false: "same build", true: "another build pinned"}[other]
		t.Run(name, func(t *testing.T) {
			dp := testDatapath(t)
			must(t, putEndpoint(dp.Maps, podIP, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, none|maps.EndpointFlagPolicy)))
			if other {
				// A program pin of another build: this build's program
				// under a name no catalog entry of this build has.
				must(t, dp.FromContainer.Pin(filepath.Join(dp.PinRoot, progsDir, "cni_from_container_000000000000")))
			}
			_, err := dp.Upgrade(false)
			must(t, err)
			e, err := dp.Maps.Endpoints().Lookup(podIP)
			must(t, err)
			want := none | maps.EndpointFlagPolicy
			if other {
				want = maps.EndpointFlagPolicy
			}
			if e.Flags != uint32(want) {
				t.Fatalf("flags %#x after the upgrade, want %#x", e.Flags, want)
			}
			if other {
				if _, err := os.Stat(filepath.Join(dp.PinRoot, progsDir, "cni_from_container_000000000000")); !os.IsNotExist(err) {
					t.Errorf("the other build's pin is still there: %v", err)
				}
			}
		})
	}
}
