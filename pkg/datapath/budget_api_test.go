//go:build pktbudget

package datapath

import (
	"net"

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
