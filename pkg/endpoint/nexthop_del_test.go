package endpoint

import (
	"net"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

// TestDeleteNexthops: DEL's deleteNexthops removes the nexthop objects of
// one interface's table (ids from the table's first, as ADD gives them),
// and their routes with them, and nothing of another interface's table.
// In a fresh netns.
func TestDeleteNexthops(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root; CI runs as root")
		}
		t.Skip("needs root (a netns)")
	}
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		netns.Close()
		testutils.UnmountNS(netns)
	}()
	err = netns.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nh0"}, PeerName: "nh1"}); err != nil {
			return err
		}
		l, err := netlink.LinkByName("nh0")
		if err != nil {
			return err
		}
		for _, name := range []string{"nh1", "nh0"} { // a veth has carrier once both ends are up
			if err := netlink.LinkSetUp(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
				return err
			}
		}
		idx := l.Attrs().Index
		// As in a pod: an address of its own, then routes via the gateway.
		a, _ := netlink.ParseAddr("10.1.1.2/32")
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
		mine, other := podTable(idx), podTable(idx+1)
		_, dst, _ := net.ParseCIDR("10.0.0.0/8")
		routes := []*netlinkRoute{{dst: dst, gw: net.ParseIP("169.254.1.1")}, {dst: dst, gw: net.ParseIP("fe80::1")}}
		for _, table := range []int{mine, other} {
			ids, gws, err := podNexthops(table, routes)
			if err != nil {
				return err
			}
			for _, gw := range gws {
				if err := addNexthop(ids[gw.String()], idx, gw); err != nil {
					return err
				}
			}
			if err := addNexthopRoute(dst, ids["169.254.1.1"], table); err != nil {
				return err
			}
		}
		if n := deleteNexthops(mine); n != 2 {
			t.Errorf("deleteNexthops(%d) = %d, want 2", mine, n)
		}
		if n := deleteNexthops(mine); n != 0 {
			t.Errorf("deleteNexthops(%d) again = %d, want 0", mine, n)
		}
		for table, want := range map[int]int{mine: 0, other: 1} {
			rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return err
			}
			if len(rs) != want {
				t.Errorf("table %d: %d routes left, want %d", table, len(rs), want)
			}
		}
		// The other table's objects stay: its routes still resolve.
		if n := deleteNexthops(other); n != 2 {
			t.Errorf("deleteNexthops(%d) = %d, want 2 (the other table's objects were touched)", other, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
