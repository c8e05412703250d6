//go:build pktbudget

package datapath

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// budgetMaps makes the map writes budget_test.go needs, in this tree's
// pkg/maps API. The packet bench builds budget_test.go in a reference tree
// too, whose API predates the map families: there it writes that tree's
// own version of this file (test/bench/packet.go, refBudgetAPI).
type budgetMaps struct{ m *maps.Maps }

func (b budgetMaps) PutCT(k maps.CTKey, v maps.CTVal) error { return putCT(b.m, k, v) }

func (b budgetMaps) SyncNodeIPs(want map[string]int) error { return b.m.Node().SyncIPs(want) }

func (b budgetMaps) PutEndpoint(ip net.IP, info maps.EndpointInfo) error {
	return putEndpoint(b.m, ip, info)
}

func (b budgetMaps) PutLink(ifindex int, li maps.LinkInfo) error { return b.m.Links().Put(ifindex, li) }

// TunnelNodes puts n nodes' pod CIDRs (IPv4 and IPv6) into the tunnel maps
// and turns tunnel mode on; a reference tree without the tunnel says false.
func (b budgetMaps) TunnelNodes(n int) (bool, error) {
	var nodes []maps.TunnelNode
	for i := 0; i < n; i++ {
		a := netip.AddrFrom4([4]byte{10, 250, byte(i), 1})
		nodes = append(nodes, maps.TunnelNode{Addrs: []netip.Addr{a}, Endpoint: a, PodCIDRs: []netip.Prefix{
			netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, byte(i), 0}), 24),
			netip.MustParsePrefix(fmt.Sprintf("fd00:128:%x::/64", i)),
		}})
	}
	if err := b.m.Tunnel().Sync(nodes); err != nil {
		return false, err
	}
	return true, b.m.Tunnel().SetMode(true, true)
}

// PolicyOn turns networkPolicy on for the node (from_uplink's forged-source
// checks run); a reference tree without policy says false.
func (b budgetMaps) PolicyOn() (bool, error) { return true, b.m.Policy().Enable() }

// SelfCIDRs makes cidrs this node's own pod CIDRs (cni_self_cidrs); a
// reference tree without the map says false.
func (b budgetMaps) SelfCIDRs(cidrs []netip.Prefix) (bool, error) {
	return true, b.m.SyncSelfCIDRs(cidrs)
}
