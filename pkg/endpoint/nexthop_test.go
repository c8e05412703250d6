package endpoint

import (
	"net"
	"strings"
	"testing"
)

func TestPodNexthops(t *testing.T) {
	route := func(dst, gw string) *netlinkRoute {
		_, d, _ := net.ParseCIDR(dst)
		return &netlinkRoute{dst: d, gw: net.ParseIP(gw)}
	}
	routes := []*netlinkRoute{
		route("0.0.0.0/0", "169.254.1.1"), route("10.0.0.0/8", "169.254.1.1"),
		route("::/0", "fe80::1"), route("192.168.0.0/16", "10.1.1.1"),
	}
	ids, gws, err := podNexthops(podTable(2), routes)
	if err != nil {
		t.Fatal(err)
	}
	// One object per gateway: a route's table and main copies share it.
	if len(gws) != 3 || len(ids) != 3 {
		t.Fatalf("gateways %v ids %v, want 3 each", gws, ids)
	}
	base := uint32(podTable(2) * nexthopsPerTable)
	for i, gw := range gws {
		if ids[gw.String()] != base+uint32(i)+1 {
			t.Errorf("gateway %s: id %d, want %d", gw, ids[gw.String()], base+uint32(i)+1)
		}
	}
	// Another interface's table never shares an id.
	other, _, _ := podNexthops(podTable(3), routes)
	if other["169.254.1.1"] <= ids["10.1.1.1"] {
		t.Errorf("table %d's ids %v overlap table %d's %v", podTable(3), other, podTable(2), ids)
	}
	if _, _, err := podNexthops(1<<30, routes); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("table 1<<30: %v, want out of range", err)
	}
	var many []*netlinkRoute
	for i := 0; i <= nexthopsPerTable; i++ {
		many = append(many, route("10.0.0.0/8", net.IPv4(10, 9, byte(i>>8), byte(i)).String()))
	}
	if _, _, err := podNexthops(podTable(2), many); err == nil {
		t.Errorf("%d gateways: no error", len(many))
	}
}
