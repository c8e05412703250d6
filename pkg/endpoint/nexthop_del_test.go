package endpoint

import (
	"fmt"
	"net"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// TestDeleteNexthops: DEL with lo down (parkNexthopsOn) removes the nexthop objects
// on one interface, and their routes with them, and nothing on another
// interface. In a fresh netns.
func TestDeleteNexthops(t *testing.T) {
	netns := freshNetns(t)
	err := netns.Do(func(ns.NetNS) error {
		// Two pod interfaces (veths, their peers in the same netns), each
		// with an address, its table's nexthop objects (one per gateway)
		// and a route in its table, as ADD makes them.
		_, dst, _ := net.ParseCIDR("10.0.0.0/8")
		routes := []*netlinkRoute{{dst: dst, gw: net.ParseIP("169.254.1.1")}, {dst: dst, gw: net.ParseIP("fe80::1")}}
		idx := map[string]int{}
		for i, name := range []string{"nh0", "nh2"} {
			peer := fmt.Sprintf("nh%d", 2*i+1)
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
				return err
			}
			for _, n := range []string{peer, name} { // carrier once both ends are up
				if err := netlink.LinkSetUp(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n}}); err != nil {
					return err
				}
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			idx[name] = l.Attrs().Index
			a, _ := netlink.ParseAddr(fmt.Sprintf("10.1.1.%d/32", i+2))
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
			table := podTable(idx[name])
			ids, gws, err := podNexthops(table, routes)
			if err != nil {
				return err
			}
			for _, gw := range gws {
				if err := addNexthop(nil, ids[gw.String()], idx[name], gw); err != nil {
					return err
				}
			}
			if err := addNexthopRoute(nil, dst, ids["169.254.1.1"], table); err != nil {
				return err
			}
		}
		if n := deleteNexthopsOn(t, idx["nh0"]); n != 2 {
			t.Errorf("deleteNexthopsOn(nh0) = %d, want 2", n)
		}
		if n := deleteNexthopsOn(t, idx["nh0"]); n != 0 {
			t.Errorf("deleteNexthopsOn(nh0) again = %d, want 0", n)
		}
		for name, want := range map[string]int{"nh0": 0, "nh2": 1} {
			rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: podTable(idx[name])}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return err
			}
			if len(rs) != want {
				t.Errorf("%s's table: %d routes left, want %d", name, len(rs), want)
			}
		}
		// The other interface's objects stayed.
		if n := deleteNexthopsOn(t, idx["nh2"]); n != 2 {
			t.Errorf("deleteNexthopsOn(nh2) = %d, want 2 (the other interface's objects were touched)", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// deleteNexthopsOn is DEL's step with the pod's lo down (parkNexthopsOn, no
// blackhole possible): it says how many objects on ifindex went.
func deleteNexthopsOn(t *testing.T, ifindex int) int {
	t.Helper()
	on := func() int {
		nhs, err := listNexthops(nil)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, nh := range nhs {
			if nh.oif == uint32(ifindex) {
				n++
			}
		}
		return n
	}
	before := on()
	if parkNexthopsOn(nil, ifindex, false) {
		t.Errorf("parkNexthopsOn(%d, lo down) says it parked", ifindex)
	}
	return before - on()
}
