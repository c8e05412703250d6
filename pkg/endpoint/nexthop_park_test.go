package endpoint

import (
	"net"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// TestParkNexthops: parkNexthopsOn makes the objects on one interface
// blackholes of ebpf-cni's protocol and touches neither another
// interface's nor another tool's blackhole in the same id range;
// sweepParked removes the parked ones only once their interface is gone,
// and leaves the other tool's. In a fresh netns with lo up.
func TestParkNexthops(t *testing.T) {
	netns := freshNetns(t)
	err := netns.Do(func(ns.NetNS) error {
		if err := netlink.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo"}}); err != nil {
			return err
		}
		idx := twoPodInterfaces(t)
		foreign := uint32(podTable(idx["nh0"])*nexthopsPerTable + nexthopsPerTable) // nh0's range, unused by ADD here
		req := nl.NewNetlinkRequest(unix.RTM_NEWNEXTHOP, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
		req.AddData(&nhMsg{family: unix.AF_INET, protocol: unix.RTPROT_BOOT})
		req.AddData(nl.NewRtAttr(nhaID, nl.Uint32Attr(foreign)))
		req.AddData(nl.NewRtAttr(nhaBlackhole, nil))
		if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
			return err
		}
		if !parkNexthopsOn(nil, idx["nh0"], true) {
			t.Error("parkNexthopsOn(nh0) parked nothing")
		}
		if !parkNexthopsOn(nil, idx["nh0"], true) {
			t.Error("parkNexthopsOn(nh0) again: the parked objects not reported (a retry would not sweep them)")
		}
		count := func(when string, want map[string]int) {
			t.Helper()
			nhs, err := listNexthops(nil)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for _, nh := range nhs {
				switch {
				case nh.id == foreign && nh.blackhole && !nh.parked():
					got["foreign"]++
				case nh.parked():
					got["parked"]++
				case nh.oif == uint32(idx["nh2"]):
					got["nh2"]++
				default:
					got["other"]++
				}
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s: %d %s nexthop objects, want %d (all: %v)", when, got[k], k, v, got)
				}
			}
		}
		count("parked", map[string]int{"foreign": 1, "parked": 2, "nh2": 2, "other": 0})
		if err := sweepParked(nil); err != nil {
			return err
		}
		count("swept with nh0 there", map[string]int{"foreign": 1, "parked": 2, "nh2": 2})
		if err := netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nh0"}}); err != nil {
			return err
		}
		if err := sweepParked(nil); err != nil {
			return err
		}
		count("swept with nh0 gone", map[string]int{"foreign": 1, "parked": 0, "nh2": 2})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// twoPodInterfaces makes veths nh0 and nh2 (peers nh1, nh3, in the same
// netns), each with an address, its table's nexthop objects (one per
// gateway) and a route in its table, as ADD makes them.
func twoPodInterfaces(t *testing.T) map[string]int {
	t.Helper()
	_, dst, _ := net.ParseCIDR("10.0.0.0/8")
	routes := []*netlinkRoute{{dst: dst, gw: net.ParseIP("169.254.1.1")}, {dst: dst, gw: net.ParseIP("fe80::1")}}
	idx := map[string]int{}
	for i, name := range []string{"nh0", "nh2"} {
		peer := []string{"nh1", "nh3"}[i]
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{peer, name} {
			if err := netlink.LinkSetUp(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n}}); err != nil {
				t.Fatal(err)
			}
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		idx[name] = l.Attrs().Index
		table := podTable(idx[name])
		ids, gws, err := podNexthops(table, routes)
		if err != nil {
			t.Fatal(err)
		}
		for _, gw := range gws {
			if err := addNexthop(nil, ids[gw.String()], idx[name], gw); err != nil {
				t.Fatal(err)
			}
		}
		if err := addNexthopRoute(nil, dst, ids["169.254.1.1"], table); err != nil {
			t.Fatal(err)
		}
	}
	return idx
}
