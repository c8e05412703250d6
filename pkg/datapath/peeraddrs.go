package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// PeerRouteProtocol marks the routes the agent installs to other nodes'
// pod CIDRs, each via that node's InternalIP (`ip route show proto 199`).
const PeerRouteProtocol netlink.RouteProtocol = 199

// AgentCIDROwner is the agent as a user of cluster CIDRs (cni_cidr_refs),
// beside the attachments whose configuration holds theirs: a CIDR both
// want stays until both let go. One per map directory, as the agent is:
// not named after the node, so that a run under another name still
// releases what an earlier run held.
var AgentCIDROwner = maps.CIDROwner("ebpf-agent")

// seedPeerAddresses makes the agent a user of the gateways of its routes
// to other nodes' pod CIDRs: those nodes' addresses, which this build's
// programs must not masquerade a pod's UDP to (a reply to a NodePort
// client kube-proxy SNATed to its node), and which a release before them
// never held. A migration runs it before its swap, whoever migrates: the
// first ADD of this build before its agent, or the agent when the API
// server did not answer its first list. The agent's next view of the
// Nodes makes its set exact (SetClusterCIDRs). Nothing without such routes
// (tunnel mode routes by device; its maps carry the node addresses).
func seedPeerAddresses(m *maps.Maps) error {
	var addrs []netip.Prefix
	var errs error
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Protocol: PeerRouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			errs = errors.Join(errs, fmt.Errorf("list the routes to other nodes' pods: %w", err))
			continue
		}
		for _, r := range rs {
			if a, ok := netip.AddrFromSlice(r.Gw); ok && r.Gw != nil {
				a = a.Unmap()
				addrs = append(addrs, netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	if len(addrs) == 0 {
		return errs
	}
	if err := m.Masq().AcquireClusterCIDRs(AgentCIDROwner, addrs); err != nil {
		errs = errors.Join(errs, fmt.Errorf("hold the other nodes' addresses %v as cluster CIDRs: %w", addrs, err))
	}
	return errs
}
