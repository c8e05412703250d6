package maps

import (
	"net"
	"testing"
)

// TestInsertEndpointStackFlowsNone: ADD's EP_F_SF_NONE is kept on a new
// entry, and never written over a live one of the same host veth (an ADD
// retried, a reused ifindex): stack flows of that address may be recorded
// already, and from_container must look them up.
func TestInsertEndpointStackFlowsNone(t *testing.T) {
	m := testMaps(t, DefaultSizing)
	ip := net.ParseIP("10.77.0.2")
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	alive := func(int) bool { return true }

	if err := m.Endpoints().Insert(ip, NewEndpointInfo(7, mac, mac, EndpointFlagStackFlowsNone), alive); err != nil {
		t.Fatal(err)
	}
	if e, err := m.Endpoints().Lookup(ip); err != nil || e.Flags&EndpointFlagStackFlowsNone == 0 {
		t.Fatalf("new entry: flags %#x (%v), want EP_F_SF_NONE", e.Flags, err)
	}
	if err := m.Endpoints().Insert(ip, NewEndpointInfo(7, mac, mac, EndpointFlagStackFlowsNone|EndpointFlagPolicy), alive); err != nil {
		t.Fatal(err)
	}
	e, err := m.Endpoints().Lookup(ip)
	if err != nil || e.Flags != EndpointFlagPolicy {
		t.Fatalf("entry rewritten over its own: flags %#x (%v), want only EP_F_POLICY", e.Flags, err)
	}
}

// TestClearStackFlowsNone: the upgrade's pass takes EP_F_SF_NONE off every
// entry that has it and leaves the other flags and entries alone.
func TestClearStackFlowsNone(t *testing.T) {
	m := testMaps(t, DefaultSizing)
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	a, b, c := net.ParseIP("10.77.0.2"), net.ParseIP("fd00:77::2"), net.ParseIP("10.77.0.3")
	for ip, flags := range map[string]uint32{a.String(): EndpointFlagStackFlowsNone | EndpointFlagPolicy,
		b.String(): EndpointFlagStackFlowsNone, c.String(): EndpointFlagMasq} {
		if err := m.Endpoints().Put(net.ParseIP(ip), NewEndpointInfo(7, mac, mac, flags)); err != nil {
			t.Fatal(err)
		}
	}
	n, err := m.StackFlows().ClearNone()
	if err != nil || n != 2 {
		t.Fatalf("StackFlows().ClearNone: %d changed (%v), want 2", n, err)
	}
	for ip, want := range map[string]uint32{a.String(): EndpointFlagPolicy, b.String(): 0, c.String(): EndpointFlagMasq} {
		e, err := m.Endpoints().Lookup(net.ParseIP(ip))
		if err != nil || e.Flags != want {
			t.Errorf("%s: flags %#x (%v), want %#x", ip, e.Flags, err, want)
		}
	}
}
