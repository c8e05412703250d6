// The tunnel lab with an IPv6 underlay beside the IPv4 one: every node,
// the router and the stranger get an address of fd77:1::/64 (subnet A) or
// fd77:2::/64 (subnet B), and the peers name it (nodeIPs), so each node's
// cni_tun_nodes holds the others' IPv6 addresses too. The tunnel itself
// still runs over IPv4 (the peers' first address).

package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
)

var (
	tunGWA6    = net.ParseIP("fd77:1::fe")
	tunGWB6    = net.ParseIP("fd77:2::fe")
	tunNode6   = []net.IP{net.ParseIP("fd77:1::1"), net.ParseIP("fd77:1::2"), net.ParseIP("fd77:2::1")}
	tunStrang6 = net.ParseIP("fd77:1::66")
)

// addUnderlay6 gives the current netns' uplink0 addr/64 and a default route
// via gw.
func addUnderlay6(addr, gw net.IP) error {
	l, err := netlink.LinkByName("uplink0")
	if err != nil {
		return err
	}
	if err := labAddr(l, addr.String()+"/64"); err != nil {
		return fmt.Errorf("address %s: %w", addr, err)
	}
	return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw})
}

// newTunLab6 is newTunLab with the IPv6 underlay.
func newTunLab6(t *testing.T) *tunLab {
	t.Helper()
	lab := newTunLab(t)
	err := lab.router.Do(func(ns.NetNS) error {
		for _, b := range []struct {
			name string
			gw   net.IP
		}{{"brA", tunGWA6}, {"brB", tunGWB6}} {
			br, err := netlink.LinkByName(b.name)
			if err != nil {
				return err
			}
			if err := labAddr(br, b.gw.String()+"/64"); err != nil {
				return err
			}
		}
		return tunSysctl("net.ipv6.conf.all.forwarding", "1")
	})
	if err != nil {
		t.Fatalf("router IPv6: %v", err)
	}
	var peers []agent.Peer
	for i, e := range lab.nodes {
		gw := tunGWA6
		if i == 2 {
			gw = tunGWB6
		}
		if err := e.InNode(func() error { return addUnderlay6(tunNode6[i], gw) }); err != nil {
			t.Fatalf("node %d IPv6: %v", i+1, err)
		}
		p4, p6 := tunPods(i)
		peers = append(peers, agent.Peer{NodeIP: tunNode[i].String(), NodeIPs: []string{tunNode6[i].String()}, PodCIDRs: []string{p4, p6}})
	}
	if err := lab.strang.Do(func(ns.NetNS) error { return addUnderlay6(tunStrang6, tunGWA6) }); err != nil {
		t.Fatalf("stranger IPv6: %v", err)
	}
	pj, _ := json.Marshal(peers)
	if err := os.WriteFile(lab.peers, pj, 0o600); err != nil {
		t.Fatal(err)
	}
	return lab
}
