// The node's "no per-pod tables" flag (issue 30, round 11): while
// cni_stack_flow_parts holds no table, the programs skip its lookup for a
// pod without a pool slot (a pod of a build before issue 28's tables);
// a table put there clears the flag first, and the last one gone sets it.

package integration

import (
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// TestStackFlowNoPartsFlag: on a node of 2 pool slots, b holds one and
// the other is held by a live link (lo): the fresh maps say "no tables".
// Pod a, ADDed on the full pool, gets a table of its own: the flag goes
// before the table comes, and a's Service flows are recorded in that table
// (the programs looked it up) and answered. Its DEL drops the last table:
// the flag is back. Then pod c, made an old-style pod (no slot, no table,
// as a build before issue 28's tables left it): its Service replies still
// find their record (in the shared table) and reach it. IPv4 and IPv6.
// Red before round 11: the flag never set (no such flag); with putInner's
// clear taken out, a's records were not in its table.
func TestStackFlowNoPartsFlag(t *testing.T) {
	t.Parallel()
	l := newPoolLab(t)
	l.wantNoParts(t, true, "after an ADD that took a pool slot")
	slots := mapstest.Map(l.m, "cni_sf_slots")
	lo, other := uint32(1), 3-l.slot(t, l.bIdx)
	if err := slots.Update(&lo, &other, 0); err != nil {
		t.Fatal(err)
	}

	a, _ := l.e.RunPod("a")
	_, aIdx := l.e.HostVeth("a")
	if s := l.slot(t, aIdx); s != 0 {
		t.Fatalf("a took slot %d of a full pool", s)
	}
	l.wantNoParts(t, false, "with a's own table in cni_stack_flow_parts")
	l.exchangeBoth(t, a)
	rs, err := mapstest.PartRecords(l.m, aIdx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) < 2 {
		t.Errorf("a's Service flows left %d records in its own table, want one per family: %v", len(rs), rs)
	}
	if err := l.e.Del(a, "a", "eth0"); err != nil {
		t.Fatal(err)
	}
	l.wantNoParts(t, true, "after the DEL of the last pod with a table")

	if err := slots.Delete(&lo); err != nil {
		t.Fatal(err)
	}
	c, c4, c6, cIdx, _ := l.addPod(t, "c")
	makeOldStyle(t, l.m, cIdx, c4, c6)
	l.exchangeBoth(t, c)
	fs, err := l.m.StackFlows().List()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fs {
		if f.Peer.Addr() == mustAddr(c4) || f.Peer.Addr() == mustAddr(c6) {
			n++
		}
	}
	if n < 2 {
		t.Errorf("%d records of old-style c's Service flows in the shared table, want one per family", n)
	}
	l.wantNoParts(t, true, "with an old-style pod")
}

// wantNoParts fails unless cni_hp_config's HP_CFG_SF_NO_PARTS is want.
func (l *poolLab) wantNoParts(t *testing.T, want bool, when string) {
	t.Helper()
	got, err := mapstest.NoPartsFlag(l.m)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("%s: HP_CFG_SF_NO_PARTS %v, want %v", when, got, want)
	}
}

// makeOldStyle turns the pod behind idx into one of a build before the
// pool and the per-pod tables: its slot freed, its address entries
// without one.
func makeOldStyle(t *testing.T, m *maps.Maps, idx int, ips ...net.IP) {
	t.Helper()
	k := uint32(idx)
	if err := mapstest.Map(m, "cni_sf_slots").Delete(&k); err != nil {
		t.Fatal(err)
	}
	for _, ip := range ips {
		info, err := m.Endpoints().Lookup(ip)
		if err != nil {
			t.Fatal(err)
		}
		info.Flags &^= maps.EndpointFlagsOfSlot(0xffff)
		if err := m.Endpoints().Insert(ip, info, func(int) bool { return true }); err != nil {
			t.Fatal(err)
		}
	}
}
