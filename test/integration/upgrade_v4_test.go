package integration

import "testing"

// layoutV4Commit is the last commit whose maps are of layout 4 (before
// drop_tunnel_mac resized cni_stats in layout 5).
const layoutV4Commit = "de8c97a56f2dfa75cde60712b3afa83498361969"

// TestUpgradeFromLayout4 is TestUpgradeFromLayout3 from the last build of
// layout 4 (layout 5 added a drop reason, so cni_stats grew; the tunnel
// maps are copied as they were).
func TestUpgradeFromLayout4(t *testing.T) { upgradeFromLayout(t, layoutV4Commit, 4) }
