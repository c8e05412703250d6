package maps

import (
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
)

// TestSyncAfterLinks: each kind's links are exactly the last ones given,
// the other kind's bits are left alone, a link both are on keeps the
// other's when one forgets it, a full map is ErrFull, and a pin set
// without the map (an older build of the layout) takes no write.
func TestSyncAfterLinks(t *testing.T) {
	needRoot(t)
	mp, err := ebpf.NewMap(&ebpf.MapSpec{Name: "after_links_t", Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 3})
	if err != nil {
		t.Fatalf("create a hash map (needs root): %v", err)
	}
	defer mp.Close()
	m := &Maps{byName: map[string]*ebpf.Map{nameAfterLinks: mp}}
	have := func() map[uint32]uint32 {
		out := map[uint32]uint32{}
		var k, v uint32
		for it := mp.Iterate(); it.Next(&k, &v); {
			out[k] = v
		}
		return out
	}
	step := func(kind AfterLink, idx []int, want map[uint32]uint32) {
		t.Helper()
		if err := m.Policy().SyncAfterLinks(kind, idx); err != nil {
			t.Fatal(err)
		}
		if got := have(); !reflect.DeepEqual(got, want) {
			t.Fatalf("after kind %d %v: %v, want %v", kind, idx, got, want)
		}
	}
	step(AfterLinkUplink, []int{3, 4}, map[uint32]uint32{3: 1, 4: 1})
	step(AfterLinkTunnel, []int{4, 9}, map[uint32]uint32{3: 1, 4: 3, 9: 2})
	step(AfterLinkUplink, []int{4}, map[uint32]uint32{4: 3, 9: 2})
	step(AfterLinkTunnel, nil, map[uint32]uint32{4: 1})
	step(AfterLinkUplink, []int{4, 5, 6}, map[uint32]uint32{4: 1, 5: 1, 6: 1})
	if err := m.Policy().SyncAfterLinks(AfterLinkTunnel, []int{7}); !IsFull(err) {
		t.Fatalf("a fourth link in a map of 3: %v, want ErrFull", err)
	}
	if err := (&Maps{byName: map[string]*ebpf.Map{}}).Policy().SyncAfterLinks(AfterLinkUplink, []int{1}); err != nil {
		t.Fatalf("without the map: %v", err)
	}
}
