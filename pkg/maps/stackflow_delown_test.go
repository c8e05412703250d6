package maps

import (
	"net"
	"testing"

	"github.com/cilium/ebpf"
)

// TestStackFlowsDeleteOwn: NeverDelivered is true only while every address
// of the pod is this ifindex's entry with EP_F_SF_NONE (an entry gone,
// another ifindex's or without the bit is false: DEL then scans as
// before). DeleteOwn empties and frees the pod's own slot and leaves other
// tables alone; DeleteOf also removes the pod's records from the others'
// tables and the shared one. Red if NeverDelivered took a cleared bit, a
// missing entry or another's for "never delivered".
func TestStackFlowsDeleteOwn(t *testing.T) {
	m := testMaps(t, Sizing{MaxPods: 1, HostPortsPerPod: 1}) // 2 slots
	sf := m.StackFlows()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	alive := func(int) bool { return true }
	const a, b = 7, 8
	sa, err := sf.TakeSlot(a, alive)
	must(err)
	sb, err := sf.TakeSlot(b, alive)
	must(err)
	ip4, ip6 := net.ParseIP("10.1.0.7"), net.ParseIP("fd00::7")
	put := func(ip net.IP, idx int, flags uint32) {
		t.Helper()
		must(m.Endpoints().Put(ip, EndpointInfo{Ifindex: uint32(idx), Flags: flags}))
	}
	none := uint32(EndpointFlagStackFlowsNone)
	for _, c := range []struct {
		name   string
		f4, f6 uint32
		idx6   int
		drop6  bool
		want   bool
	}{
		{"both with the bit", none, none, a, false, true},
		{"v6 delivered a flow (bit cleared)", none, 0, a, false, false},
		{"v6 entry another pod's", none, none, b, false, false},
		{"v6 entry gone", none, none, a, true, false},
	} {
		put(ip4, a, c.f4)
		put(ip6, c.idx6, c.f6)
		if c.drop6 {
			must(m.Endpoints().Delete(ip6, 0))
		}
		if got := sf.NeverDelivered(a, []net.IP{ip4, ip6}); got != c.want {
			t.Errorf("%s: NeverDelivered %v, want %v", c.name, got, c.want)
		}
	}
	if sf.NeverDelivered(a, nil) {
		t.Error("NeverDelivered with no address (no record): true, want false")
	}

	rec := func(slot uint32, b byte, ifindex int) {
		t.Helper()
		k := StackFlowKey{Family: 2, Proto: 6, Port: 1000}
		k.Addr[0] = b
		must(sf.putSlotRecord(slot, k, StackFlowVal{Ifindex: uint32(ifindex), Flags: StackFlowPeerPod}))
		must(m.byName[nameStackFlows].Update(&k, &StackFlowVal{Ifindex: uint32(ifindex), Flags: StackFlowPeerPod}, ebpf.UpdateAny))
	}
	count := func(slot uint32) int {
		t.Helper()
		fs, err := sf.listSlot(slot)
		must(err)
		return len(fs)
	}
	shared := func(ifindex int) int {
		t.Helper()
		fs, err := listStackFlows(m.byName[nameStackFlows], nameStackFlows)
		must(err)
		n := 0
		for _, f := range fs {
			if f.Ifindex == ifindex {
				n++
			}
		}
		return n
	}
	rec(sa, 1, b) // a sent b a flow through the stack: a's table, for b
	rec(sb, 2, a) // and b one to a: b's table, for a
	must(sf.DeleteOwn(a))
	if s, _ := sf.SlotOf(a); s != 0 || count(sa) != 0 {
		t.Fatalf("after DeleteOwn(a): a holds slot %d, its table keeps %d records", s, count(sa))
	}
	if count(sb) != 1 || shared(a) != 1 {
		t.Fatalf("DeleteOwn(a) touched other tables: b's has %d records, the shared one %d of a's", count(sb), shared(a))
	}
	_, err = sf.DeleteOf(a)
	must(err)
	if count(sb) != 0 || shared(a) != 0 {
		t.Fatalf("DeleteOf(a) left a's records: %d in b's table, %d in the shared one", count(sb), shared(a))
	}
}
