package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// TestSyncSelfCIDRs: cni_self_cidrs holds exactly the last CIDRs given
// (masked, IPv4-mapped ones as IPv4): one no longer given leaves, none
// empties it, more than MAX_SELF_CIDRS is ErrFull; a pin set without the
// map (an older build of layout 5) is left alone.
func TestSyncSelfCIDRs(t *testing.T) {
	needRoot(t)
	mp, err := ebpf.NewMap(&ebpf.MapSpec{Name: "self_cidrs_t", Type: ebpf.LPMTrie, KeySize: 24, ValueSize: 4,
		MaxEntries: maxSelfCIDRs, Flags: unix.BPF_F_NO_PREALLOC})
	if err != nil {
		t.Fatalf("create an LPM trie (needs root): %v", err)
	}
	defer mp.Close()
	m := &Maps{dir: t.TempDir(), byName: map[string]*ebpf.Map{nameSelfCIDRs: mp}}
	held := func() string {
		var out []string
		if err := scan(mp, func(k *CIDRKey, _ *uint32) { out = append(out, k.prefix().String()) }); err != nil {
			t.Fatal(err)
		}
		sort.Strings(out)
		return fmt.Sprint(out)
	}
	pp := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	if err := m.SyncSelfCIDRs(pp("10.250.0.7/24", "fd00:250::/64")); err != nil {
		t.Fatal(err)
	}
	if got, want := held(), "[10.250.0.0/24 fd00:250::/64]"; got != want {
		t.Fatalf("after the first sync: %s, want %s", got, want)
	}
	if err := m.SyncSelfCIDRs(pp("fd00:250::/64", "::ffff:10.251.0.0/120")); err != nil {
		t.Fatal(err)
	}
	if got, want := held(), "[10.251.0.0/24 fd00:250::/64]"; got != want {
		t.Fatalf("after a CIDR was replaced: %s, want %s", got, want)
	}
	var many []netip.Prefix
	for i := 0; i <= maxSelfCIDRs; i++ {
		many = append(many, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16))
	}
	if err := m.SyncSelfCIDRs(many); !errors.Is(err, ErrFull) {
		t.Fatalf("%d CIDRs: %v, want ErrFull", len(many), err)
	}
	if err := m.SyncSelfCIDRs(nil); err != nil {
		t.Fatal(err)
	}
	if got := held(); got != "[]" {
		t.Fatalf("after none: %s, want none", got)
	}
	if err := (&Maps{dir: t.TempDir(), byName: map[string]*ebpf.Map{}}).SyncSelfCIDRs(pp("10.250.0.0/24")); err != nil {
		t.Fatalf("without the map: %v", err)
	}
}
