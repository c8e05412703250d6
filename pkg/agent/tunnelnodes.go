package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// A pod's packet to another node's address (a hostNetwork server, a
// hostPort or NodePort at that address, a ClusterIP whose endpoint is a
// node, as the API server's is) goes through the tunnel when the pod keeps
// its address toward it, as it does to that node's pods (docs/tunnel.md,
// "Pods to other nodes' addresses"): in the clear, its pod source crosses
// the underlay, which a source-checking router drops and the receiving
// node's from_uplink drops as a forgery (drop_tunnel_source). Only the
// pods' packets: the node's own, the tunnel's outer datagrams among them,
// go to those addresses over the underlay, so the routes live in a table
// of their own that only sources of this node's pod CIDRs consult.
const (
	// TunnelNodeTable holds a route into the tunnel device for every
	// tunnelled node's address the pods keep their address toward.
	TunnelNodeTable = 199
	// tunnelNodeRulePref: before the main table's rule (32766), after the
	// local table's (0), so a node's own addresses stay local.
	tunnelNodeRulePref = 32000
)

// Table 199 may be another tool's too: the agent's rules carry
// FRA_PROTOCOL RouteProtocol (kernel 4.17 and later) and its routes
// RouteProtocol, as the peer routes do, and only what carries that tag is
// ever changed or removed.

// ourTunnelNodeRules is this node's rules consulting TunnelNodeTable that
// carry the agent's protocol, by family.
func ourTunnelNodeRules() ([]netlink.Rule, error) {
	var (
		out  []netlink.Rule
		errs error
	)
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		have, err := netlinksafe.RuleListFiltered(fam, &netlink.Rule{Table: TunnelNodeTable}, netlink.RT_FILTER_TABLE)
		if err != nil {
			errs = errors.Join(errs, fmt.Errorf("list rules of table %d: %w", TunnelNodeTable, err))
			continue
		}
		for _, r := range have {
			if r.Protocol == uint8(RouteProtocol) {
				out = append(out, r)
			}
		}
	}
	return out, errs
}

// syncTunnelNodeRules makes the agent's rules sending this node's pod CIDRs
// (sources) to TunnelNodeTable exactly those of cidrs; none removes them.
// Returns whether any rule of the agent's was there.
func syncTunnelNodeRules(cidrs []netip.Prefix) (bool, error) {
	want := map[string]netip.Prefix{}
	for _, c := range cidrs {
		want[c.Masked().String()] = c.Masked()
	}
	have, errs := ourTunnelNodeRules()
	for _, r := range have {
		if r.Src != nil && r.Priority == tunnelNodeRulePref {
			if _, ok := want[r.Src.String()]; ok {
				delete(want, r.Src.String())
				continue
			}
		}
		r := r
		if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = errors.Join(errs, fmt.Errorf("remove rule from %v lookup %d: %w", r.Src, TunnelNodeTable, err))
		}
	}
	for _, c := range want {
		r := netlink.NewRule()
		r.Src = &net.IPNet{IP: c.Addr().AsSlice(), Mask: net.CIDRMask(c.Bits(), c.Addr().BitLen())}
		r.Table, r.Priority, r.Protocol = TunnelNodeTable, tunnelNodeRulePref, uint8(RouteProtocol)
		r.Family = netlink.FAMILY_V4
		if c.Addr().Is6() {
			r.Family = netlink.FAMILY_V6
		}
		if err := netlink.RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = errors.Join(errs, fmt.Errorf("rule from %s lookup %d: %w", c, TunnelNodeTable, err))
		}
	}
	return len(have) != 0, errs
}

// tunnelNodeRoutes are the routes TunnelNodeTable wants, from the tunnel
// maps: every address of a node whose pod CIDRs of that address's family
// are routed into the tunnel (TUN_PEER_ENCAP; a direct node in hybrid
// mode is reached in the clear), unless the pods' masquerade would take
// it (outside the node's cluster CIDRs, when some are set: it then leaves
// with this node's address, and needs no tunnel). The agent following
// Nodes makes every node's address a cluster CIDR.
func tunnelNodeRoutes(m *maps.Maps, ifindex, devMTU int) (map[string]netlink.Route, error) {
	trs, err := m.Tunnel().Routes()
	if err != nil {
		return nil, err
	}
	nodes, err := m.Tunnel().Nodes()
	if err != nil {
		return nil, err
	}
	cluster, err := m.Masq().ClusterCIDRs()
	if err != nil {
		return nil, err
	}
	type famKey struct {
		node uint32
		v4   bool
	}
	encap := map[famKey]bool{}
	endpoint := map[uint32]netip.Addr{}
	for _, r := range trs {
		endpoint[r.Node] = r.Endpoint
		k := famKey{r.Node, r.PodCIDR.Addr().Is4()}
		if _, seen := encap[k]; !seen {
			encap[k] = true
		}
		encap[k] = encap[k] && !r.Direct
	}
	inCluster := func(a netip.Addr) bool {
		if len(cluster) == 0 {
			return true
		}
		for _, c := range cluster {
			if c.Contains(a) {
				return true
			}
		}
		return false
	}
	want := map[string]netlink.Route{}
	for a, id := range nodes {
		ep, ok := endpoint[id]
		if !ok || !encap[famKey{id, a.Is4()}] || !inCluster(a) {
			continue
		}
		dst := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
		r := tunnelRoute(dst, net.IP(ep.AsSlice()), ifindex)
		r.Table = TunnelNodeTable
		if mtu := tunnelRouteMTU(net.IP(ep.AsSlice()), ifindex, devMTU); mtu != 0 {
			r.MTU, r.MTULock = mtu, true
		}
		want[dst.String()] = r
	}
	return want, nil
}

// SyncTunnelNodeRoutes makes TunnelNodeTable hold exactly the routes
// tunnelNodeRoutes wants (m nil or ifindex 0: none). At every peer sync
// (force: each route written again, for a listed route's tunnel key is
// not decoded) and every tick of the path MTU watch: the cluster CIDRs
// come with the first ADD, after the agent's first sync.
func SyncTunnelNodeRoutes(m *maps.Maps, ifindex, devMTU int, force bool) error {
	want := map[string]netlink.Route{}
	var errs error
	if m != nil && ifindex != 0 {
		w, err := tunnelNodeRoutes(m, ifindex, devMTU)
		if err != nil {
			return fmt.Errorf("routes of table %d: %w", TunnelNodeTable, err)
		}
		want = w
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		have, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Table: TunnelNodeTable, Protocol: RouteProtocol},
			netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		for _, r := range have {
			if r.Dst == nil {
				continue
			}
			if w, ok := want[r.Dst.String()]; ok && !force && r.LinkIndex == w.LinkIndex && r.MTU == w.MTU && r.MTULock == w.MTULock {
				delete(want, r.Dst.String())
				continue
			}
			if _, ok := want[r.Dst.String()]; ok {
				continue // replaced below
			}
			r := r
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = errors.Join(errs, fmt.Errorf("remove route %s from table %d: %w", r.Dst, TunnelNodeTable, err))
			}
		}
	}
	for _, r := range want {
		r := r
		if err := netlink.RouteReplace(&r); err != nil {
			errs = errors.Join(errs, fmt.Errorf("route %s into the tunnel (table %d): %w", r.Dst, TunnelNodeTable, err))
		}
	}
	return errs
}

// RemoveTunnelNodeRouting removes the agent's rules and routes of
// TunnelNodeTable, and nothing of another tool's (tunnel off, at every
// peer sync): one rule dump per family when none of the agent's rules is
// left. Its routes lead into the tunnel device and went with it; a route
// is looked for only after a rule was found.
func RemoveTunnelNodeRouting() error {
	had, err := syncTunnelNodeRules(nil)
	if !had {
		return err
	}
	return errors.Join(err, SyncTunnelNodeRoutes(nil, 0, 0, false))
}

// PurgeTunnelNodeRouting removes every rule and route of the agent's in
// TunnelNodeTable, whether a rule is left or not (uninstall).
func PurgeTunnelNodeRouting() error {
	_, err := syncTunnelNodeRules(nil)
	return errors.Join(err, SyncTunnelNodeRoutes(nil, 0, 0, false))
}
