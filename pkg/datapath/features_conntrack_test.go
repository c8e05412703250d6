package datapath

import "testing"

// TestConntrackBTF: this kernel has conntrack built in (CONFIG_NF_CONNTRACK=y
// on the CI kernel), so struct nf_conn is in vmlinux's BTF and the
// probe_read_kernel feature carries no error: the conntrack read of
// bpf/lib/nfct.h is relocated, not relocated away.
func TestConntrackBTF(t *testing.T) {
	if err := conntrackBTF(); err != nil {
		t.Fatalf("conntrackBTF: %v", err)
	}
	if f := FeatureByName(FeatReadKernel); !f.Have || f.Err != "" {
		t.Fatalf("feature %s: %+v, want it had without error", FeatReadKernel, f)
	}
}
