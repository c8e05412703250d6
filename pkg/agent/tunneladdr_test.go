package agent

import (
	"net/netip"
	"reflect"
	"testing"
)

// TestTunnelAddrs: one address a family for the tunnel device, the pod
// CIDR's network address first, else an address the node is known by and
// holds; none for a family with neither.
func TestTunnelAddrs(t *testing.T) {
	a := netip.MustParseAddr
	p := netip.MustParsePrefix
	local := map[string]bool{"10.77.1.1": true, "fd77:1::1": true}
	for _, c := range []struct {
		self  []netip.Addr
		cidrs []netip.Prefix
		want  []netip.Addr
	}{
		{[]netip.Addr{a("10.77.1.1"), a("fd77:1::1")}, []netip.Prefix{p("10.78.1.0/24"), p("fd00:78:1::/64")}, []netip.Addr{a("10.78.1.0"), a("fd00:78:1::")}},
		{[]netip.Addr{a("10.77.1.1"), a("fd77:1::1")}, []netip.Prefix{p("fd00:78:1::/64")}, []netip.Addr{a("10.77.1.1"), a("fd00:78:1::")}},
		{[]netip.Addr{a("10.77.1.9")}, nil, nil}, // listed, not held: never claimed
		{nil, []netip.Prefix{p("10.78.1.7/24")}, []netip.Addr{a("10.78.1.0")}},
	} {
		if got := tunnelAddrs(c.self, c.cidrs, local); !reflect.DeepEqual(got, c.want) {
			t.Errorf("tunnelAddrs(%v, %v) = %v, want %v", c.self, c.cidrs, got, c.want)
		}
	}
}
