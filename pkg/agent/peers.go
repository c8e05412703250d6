package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/nodes"
)

// RouteProtocol marks the routes the agent installs to other nodes' pod
// CIDRs (rtnetlink protocol number; `ip route show proto 199`), so it can
// remove the ones whose peer is gone without touching anyone else's. The
// datapath reads their gateways in a migration (datapath.PeerRouteProtocol).
const RouteProtocol = datapath.PeerRouteProtocol

// Peer is another node: its address (one per family on a dual-stack node)
// and the pod CIDRs behind it. In Kubernetes, one Peer per Node object (see
// follow.go): NodeIPs from .status.addresses (InternalIP), PodCIDRs from
// .spec.podCIDRs.
type Peer struct {
	NodeIP   string   `json:"nodeIP,omitempty"`
	NodeIPs  []string `json:"nodeIPs,omitempty"` // more addresses: an IPv6 one beside an IPv4 nodeIP
	PodCIDRs []string `json:"podCIDRs"`
}

// ips: NodeIP and NodeIPs.
func (p Peer) ips() []string {
	if p.NodeIP == "" {
		return p.NodeIPs
	}
	return append([]string{p.NodeIP}, p.NodeIPs...)
}

// name: how errors name the peer.
func (p Peer) name() string { return strings.Join(p.ips(), ",") }

// LoadPeers reads a JSON array of peers.
func LoadPeers(path string) ([]Peer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var ps []Peer
	if err := json.Unmarshal(b, &ps); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, p := range ps {
		if len(p.ips()) == 0 {
			return nil, fmt.Errorf("%s: [%d]: nodeIP missing", path, i)
		}
		if _, err := netip.ParseAddr(p.NodeIP); p.NodeIP != "" && err != nil {
			return nil, fmt.Errorf("%s: [%d].nodeIP: %q is not an IP address", path, i, p.NodeIP)
		}
		for j, a := range p.NodeIPs {
			if _, err := netip.ParseAddr(a); err != nil {
				return nil, fmt.Errorf("%s: [%d].nodeIPs[%d]: %q is not an IP address", path, i, j, a)
			}
		}
		for j, c := range p.PodCIDRs {
			if _, err := netip.ParsePrefix(c); err != nil {
				return nil, fmt.Errorf("%s: [%d].podCIDRs[%d]: %q is not a CIDR", path, i, j, c)
			}
		}
	}
	if err := checkPodCIDRs(ps); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ps, nil
}

// checkPodCIDRs refuses pod CIDRs that cannot be one node's, so that a
// mistaken file does not turn the world into cluster addresses (held as
// such, pods' traffic to them is neither masqueraded nor routed out, but
// to that node): a default route (0.0.0.0/0, ::/0), an IPv4-mapped IPv6
// prefix (routed as neither family), one holding a listed node's address
// (a pod CIDR that wide covers the underlay: 128.0.0.0/1 and its
// siblings), and two entries' CIDRs that overlap (which node holds an
// address in both is a guess). The whole file is refused, as one that does
// not parse: what the agent installed from the last good one stays. The
// file is the node's configuration, written by its admin: these catch
// mistakes, not a writer who means harm.
func checkPodCIDRs(ps []Peer) error {
	type owned struct {
		p    netip.Prefix
		i, j int
	}
	var seen []owned
	for i, p := range ps {
		for j, c := range p.PodCIDRs {
			pr := netip.MustParsePrefix(c).Masked() // LoadPeers parsed it
			switch {
			case pr.Bits() == 0:
				return fmt.Errorf("[%d].podCIDRs[%d]: %q is a default route, not a node's pod CIDR", i, j, c)
			case pr.Addr().Is4In6():
				return fmt.Errorf("[%d].podCIDRs[%d]: %q is an IPv4-mapped IPv6 prefix: write IPv4 pod CIDRs as IPv4", i, j, c)
			}
			if k, a := nodeAddrIn(ps, pr); a.IsValid() {
				return fmt.Errorf("[%d].podCIDRs[%d]: %q holds node address %s of [%d]: a pod CIDR names one node's pods, not the underlay",
					i, j, c, a, k)
			}
			for _, o := range seen {
				if o.i != i && o.p.Overlaps(pr) {
					return fmt.Errorf("[%d].podCIDRs[%d]: %q overlaps [%d].podCIDRs[%d] %q: a pod address would belong to two nodes",
						i, j, c, o.i, o.j, o.p)
				}
			}
			seen = append(seen, owned{pr, i, j})
		}
	}
	return nil
}

// nodeAddrIn is the first listed node address in pr, and its entry.
func nodeAddrIn(ps []Peer, pr netip.Prefix) (int, netip.Addr) {
	for k, p := range ps {
		for _, s := range p.ips() {
			if a, err := netip.ParseAddr(s); err == nil && pr.Contains(a.Unmap()) {
				return k, a
			}
		}
	}
	return 0, netip.Addr{}
}

// PeerRoute is one route to another node's pod CIDR.
type PeerRoute struct {
	Dst string `json:"dst"`
	Via string `json:"via"`
	// Tunnel is the node address the CIDR's traffic is encapsulated to
	// (the route leads into the tunnel device); "" for a direct route.
	Tunnel string `json:"tunnel,omitempty"`
}

// PeerRoutes is what `peers` installed.
type PeerRoutes []PeerRoute

// MarshalJSON is the list, empty rather than null.
func (rs PeerRoutes) MarshalJSON() ([]byte, error) {
	if rs == nil {
		return []byte("[]"), nil
	}
	return json.Marshal([]PeerRoute(rs))
}

func (rs PeerRoutes) Tables() []inspect.Table {
	t := inspect.Table{}
	for _, r := range rs {
		if r.Tunnel != "" {
			t.Lines = append(t.Lines, r.Dst+" via "+r.Via+" to "+r.Tunnel)
			continue
		}
		t.Lines = append(t.Lines, r.Dst+" via "+r.Via)
	}
	return []inspect.Table{t}
}

// Routing is how SyncPeerRoutesWith reaches other nodes' pods.
type Routing struct {
	// Mode off: host-gw routes only. vxlan, geneve: through the tunnel
	// device (Ifindex, made by datapath.EnsureTunnel), whose maps (Maps)
	// get every peer.
	Mode      datapath.TunnelMode
	Hybrid    bool // with a tunnel: host-gw to peers on a subnet of this node (no gateway between), the tunnel to the others
	Ifindex   int
	DeviceMTU int
	Maps      *maps.Maps
	// Self: the addresses this node is known by (its Node object's
	// InternalIPs) and its pod CIDRs; the peer list's entry of this node
	// adds to them.
	Self         []net.IP
	SelfPodCIDRs []netip.Prefix
}

// SyncPeerRoutes is SyncPeerRoutesWith host-gw routing.
func SyncPeerRoutes(peers []Peer) (PeerRoutes, error) {
	return SyncPeerRoutesWith(peers, Routing{Mode: datapath.TunnelOff})
}

// onLink tells whether ip is on a subnet of one of this node's links: the
// kernel's route to it has no gateway and does not lead into the tunnel.
func onLink(ip net.IP, tunnel int) bool {
	rs, err := netlink.RouteGet(ip)
	if err != nil || len(rs) == 0 {
		return false
	}
	return rs[0].Gw == nil && rs[0].LinkIndex != tunnel && rs[0].Type != unix.RTN_LOCAL
}

// srcFor is this node's address the kernel would send from to reach ip
// (nil when it has no route to it): the source of the node's own packets
// into the tunnel, which the receiving node accepts as this node's.
func srcFor(ip net.IP, tunnel int) net.IP {
	rs, err := netlink.RouteGet(ip)
	if err != nil || len(rs) == 0 || rs[0].LinkIndex == tunnel {
		return nil
	}
	return rs[0].Src
}

// SyncPeerRoutesWith makes the routes of RouteProtocol in the current
// netns exactly one per pod CIDR of every peer, replacing what changed and
// removing routes of peers no longer listed: host-gw ("podCIDR via nodeIP"
// of the CIDR's family; the node IP must be on a link of this node), or
// with a tunnel "podCIDR dev ebpf-tun src <this node's address>" and the
// peer in the tunnel maps. Peers one of whose node IPs is an address of
// this node are this node itself and skipped; with rt.Maps, their pod
// CIDRs and rt.SelfPodCIDRs become cni_self_cidrs (maps.SyncSelfCIDRs).
// Returns the routes wanted.
func SyncPeerRoutesWith(peers []Peer, rt Routing) (PeerRoutes, error) {
	tunnel := rt.Mode != datapath.TunnelOff && rt.Mode != ""
	pl := planPeerRoutes(peers, rt, tunnel)
	errs := pl.errs
	if tunnel && rt.Maps != nil {
		// The maps before the routes: a packet routed into the tunnel finds
		// its node, and the peer's replies are accepted.
		if err := rt.Maps.Tunnel().Sync(pl.tunNodes); err != nil {
			errs = errors.Join(errs, fmt.Errorf("tunnel maps: %w", err))
		}
	}
	out, err := applyPeerRoutes(pl)
	errs = errors.Join(errs, err, removeStalePeerRoutes(pl.want))
	if rt.Maps != nil {
		// This node's own pod CIDRs, which no packet off the wire may
		// claim as source (from_uplink, nodes with networkPolicy): its
		// Node object's and its peer list entry's, every sync (those gone
		// leave the map). None known: the map is emptied.
		self := append(append([]netip.Prefix{}, rt.SelfPodCIDRs...), pl.selfCIDRs...)
		if err := rt.Maps.SyncSelfCIDRs(self); err != nil {
			errs = errors.Join(errs, fmt.Errorf("this node's pod CIDRs: %w", err))
		}
	}
	if tunnel && rt.Maps != nil {
		self := pl.selfAddrs(rt)
		if err := rt.Maps.Tunnel().SyncSelf(self); err != nil {
			errs = errors.Join(errs, fmt.Errorf("tunnel: this node's addresses: %w", err))
		}
		if rt.Ifindex != 0 {
			cidrs := append(append([]netip.Prefix{}, rt.SelfPodCIDRs...), pl.selfCIDRs...)
			if err := syncTunnelAddrs(rt.Ifindex, tunnelAddrs(self, cidrs, pl.local)); err != nil {
				errs = errors.Join(errs, err)
			}
			// The pods' packets to other nodes' addresses: tunnelnodes.go.
			_, err := syncTunnelNodeRules(cidrs)
			errs = errors.Join(errs, err, SyncTunnelNodeRoutes(rt.Maps, rt.Ifindex, rt.DeviceMTU, true))
		}
	}
	if tunnel {
		var addrs []net.IP
		for _, n := range pl.tunNodes {
			for _, a := range n.Addrs {
				addrs = append(addrs, net.IP(a.AsSlice()))
			}
		}
		if err := SyncTunnelHops(addrs); err != nil {
			errs = errors.Join(errs, fmt.Errorf("tunnel next hops: %w", err))
		}
	}
	if !tunnel && rt.Maps != nil {
		// No tunnel: none of the managed next hops the tunnel made stays.
		errs = errors.Join(errs, rt.Maps.Tunnel().Sync(nil), RemoveTunnelNodeRouting())
		if err := SyncTunnelHops(nil); err != nil {
			errs = errors.Join(errs, fmt.Errorf("tunnel next hops: %w", err))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dst < out[j].Dst })
	return out, errs
}

// peerRoutePlan is the routes SyncPeerRoutesWith wants, by destination,
// with the node each goes to and the tunnel maps' nodes.
type peerRoutePlan struct {
	want      map[string]netlink.Route
	tunnelTo  map[string]string
	tunNodes  []maps.TunnelNode
	self      []net.IP       // this node's entry of the peer list
	selfCIDRs []netip.Prefix // and its pod CIDRs
	local     map[string]bool
	errs      error
}

// selfAddrs is what the tunnel device accepts as outer destination
// (cni_tun_self): the addresses this node is known by, rt.Self and its
// own entry of the peer list; with neither, the addresses it sends to the
// tunnel's nodes from (those the other nodes must list for its datagrams
// to pass their trust rule, so the ones they encapsulate to).
func (pl *peerRoutePlan) selfAddrs(rt Routing) []netip.Addr {
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	add := func(ip net.IP) {
		a, ok := netip.AddrFromSlice(ip)
		if a = a.Unmap(); ok && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, ip := range append(append([]net.IP{}, rt.Self...), pl.self...) {
		add(ip)
	}
	if len(out) == 0 {
		for _, n := range pl.tunNodes {
			if src := srcFor(net.IP(n.Endpoint.AsSlice()), rt.Ifindex); src != nil {
				add(src)
			}
		}
	}
	return out
}

// planPeerRoutes computes the routes of peers (see SyncPeerRoutesWith).
func planPeerRoutes(peers []Peer, rt Routing, tunnel bool) peerRoutePlan {
	local := map[string]bool{}
	if addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL); err == nil {
		for _, a := range addrs {
			local[a.IP.String()] = true
		}
	}
	pl := peerRoutePlan{want: map[string]netlink.Route{}, tunnelTo: map[string]string{}, local: local}
	for _, p := range peers {
		pl.addPeer(p, rt, tunnel, local)
	}
	return pl
}

// addPeer plans the routes of one peer; none when one of its node IPs is
// an address of this node (it is this node).
func (pl *peerRoutePlan) addPeer(p Peer, rt Routing, tunnel bool, local map[string]bool) {
	var gws []net.IP
	for _, a := range p.ips() {
		gw := net.ParseIP(a)
		if gw == nil {
			pl.errs = errors.Join(pl.errs, fmt.Errorf("peer %s: %q is not an IP address", p.name(), a))
			continue
		}
		if local[gw.String()] {
			for _, a := range p.ips() {
				if ip := net.ParseIP(a); ip != nil {
					pl.self = append(pl.self, ip)
				}
			}
			for _, c := range p.PodCIDRs {
				if pr, err := netip.ParsePrefix(c); err == nil {
					pl.selfCIDRs = append(pl.selfCIDRs, pr.Masked())
				}
			}
			return
		}
		gws = append(gws, gw)
	}
	if len(gws) == 0 {
		return
	}
	// The tunnel endpoint: the peer's first address (nodeIP).
	direct := !tunnel
	if tunnel && rt.Hybrid {
		direct = onLink(gws[0], rt.Ifindex)
	}
	if tunnel {
		tn := maps.TunnelNode{}
		for _, g := range gws {
			a, _ := netip.AddrFromSlice(g)
			tn.Addrs = append(tn.Addrs, a.Unmap())
		}
		tn.Endpoint = tn.Addrs[0]
		for _, c := range p.PodCIDRs {
			pr, err := netip.ParsePrefix(c)
			if err != nil {
				continue
			}
			pr = pr.Masked()
			tn.PodCIDRs = append(tn.PodCIDRs, pr)
			// As addPodCIDR routes it: directly when the peer is direct
			// and has an address of the CIDR's family.
			if direct && hasFamily(gws, pr.Addr().Is4()) {
				tn.Direct = append(tn.Direct, pr)
			}
		}
		pl.tunNodes = append(pl.tunNodes, tn)
	}
	for _, c := range p.PodCIDRs {
		pl.addPodCIDR(p, c, gws, rt, tunnel, direct)
	}
}

// hasFamily tells whether ips has an address of IPv4 (v4) or IPv6.
func hasFamily(ips []net.IP, v4 bool) bool {
	for _, ip := range ips {
		if (ip.To4() != nil) == v4 {
			return true
		}
	}
	return false
}

// addPodCIDR plans the route to one pod CIDR of a peer.
func (pl *peerRoutePlan) addPodCIDR(p Peer, c string, gws []net.IP, rt Routing, tunnel, direct bool) {
	_, dst, err := net.ParseCIDR(c)
	if err != nil {
		pl.errs = errors.Join(pl.errs, fmt.Errorf("peer %s: podCIDR %q: %w", p.name(), c, err))
		return
	}
	var gw net.IP
	for _, g := range gws {
		if (g.To4() == nil) == (dst.IP.To4() == nil) {
			gw = g
			break
		}
	}
	r := netlink.Route{Dst: dst, Gw: gw, Protocol: RouteProtocol}
	// Hybrid: a family the peer has no address of goes into the
	// tunnel (over the family it has).
	if !direct || (tunnel && gw == nil) {
		// Into the tunnel; the node's own packets leave from its
		// address of the CIDR's family (the peer accepts its nodes'
		// addresses as inner sources).
		r = tunnelRoute(dst, gws[0], rt.Ifindex)
		if gw != nil {
			r.Src = srcFor(gw, rt.Ifindex)
		}
		if mtu := tunnelRouteMTU(gws[0], rt.Ifindex, rt.DeviceMTU); mtu != 0 {
			r.MTU, r.MTULock = mtu, true
		}
		gw = gws[0]
	} else if gw == nil {
		pl.errs = errors.Join(pl.errs, fmt.Errorf("peer %s: no node IP of podCIDR %s's family (a tunnel mode would carry it)", p.name(), c))
		return
	}
	if o, dup := pl.want[dst.String()]; dup {
		if !o.Gw.Equal(r.Gw) || o.LinkIndex != r.LinkIndex {
			pl.errs = errors.Join(pl.errs, fmt.Errorf("podCIDR %s: claimed by peers %s and %s; routed via %s", dst, pl.tunnelTo[dst.String()], gw, pl.tunnelTo[dst.String()]))
		}
		return
	}
	pl.want[dst.String()] = r
	pl.tunnelTo[dst.String()] = gw.String()
}

// applyPeerRoutes installs the planned routes, leaving another owner's
// route to a pod CIDR alone.
func applyPeerRoutes(pl peerRoutePlan) (PeerRoutes, error) {
	var (
		out  PeerRoutes
		errs error
	)
	want, tunnelTo := pl.want, pl.tunnelTo
	// Another owner's route to a pod CIDR (a static one, another agent's)
	// is left alone: replacing it would take it over.
	foreign := map[string]netlink.Route{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		for _, r := range rs {
			if r.Dst != nil && r.Protocol != RouteProtocol {
				foreign[r.Dst.String()] = r
			}
		}
	}
	for _, r := range want {
		r := r
		via := r.Gw.String()
		if r.Gw == nil {
			via = datapath.TunnelDevice
		}
		if f, ok := foreign[r.Dst.String()]; ok {
			errs = errors.Join(errs, fmt.Errorf("route %s via %s: a route to %s of protocol %s exists (not the agent's %d): left alone", r.Dst, via, r.Dst, f.Protocol, RouteProtocol))
			continue
		}
		if err := netlink.RouteReplace(&r); err != nil {
			errs = errors.Join(errs, fmt.Errorf("route %s via %s: %w", r.Dst, via, err))
			continue
		}
		pr := PeerRoute{Dst: r.Dst.String(), Via: via}
		if r.Gw == nil {
			pr.Tunnel = tunnelTo[r.Dst.String()]
		}
		out = append(out, pr)
	}
	return out, errs
}

// removeStalePeerRoutes removes the agent's routes that are not wanted.
func removeStalePeerRoutes(want map[string]netlink.Route) error {
	var errs error
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		have, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		for _, r := range have {
			if r.Dst == nil {
				continue
			}
			if w, ok := want[r.Dst.String()]; ok && w.Gw.Equal(r.Gw) && (w.Gw != nil || w.LinkIndex == r.LinkIndex) {
				continue
			}
			if err := netlink.RouteDel(&r); err != nil {
				errs = errors.Join(errs, fmt.Errorf("remove route %s: %w", r.Dst, err))
			}
		}
	}
	return errs
}

// peersView is a peers file as the view of the cluster the Kubernetes path
// has (every node, this one's entry included, with its addresses and pod
// CIDRs), for the cluster CIDRs (follower.nodeClusterCIDRs).
func peersView(peers []Peer) nodes.View {
	var v nodes.View
	for _, p := range peers {
		var n nodes.Node
		for _, a := range p.ips() {
			if ip, err := netip.ParseAddr(a); err == nil {
				n.InternalIPs = append(n.InternalIPs, ip.Unmap())
			}
		}
		for _, c := range p.PodCIDRs {
			if pr, err := netip.ParsePrefix(c); err == nil {
				n.PodCIDRs = append(n.PodCIDRs, pr.Masked())
			}
		}
		v.Nodes = append(v.Nodes, n)
	}
	return v
}

// peers applies Options.PeersFile, re-read each time, as apply does a
// view: the cluster CIDRs first (--cluster-cidrs, else every listed
// node's pod CIDRs and addresses), so that no pod reaching a new peer's
// pods is masqueraded, then the routes. A file that cannot be read
// changes nothing: routes and cluster CIDRs stay as they are.
func (f *follower) peers() {
	ps, err := LoadPeers(f.o.PeersFile)
	if err == nil {
		if want := f.o.ClusterCIDRs; len(want) > 0 {
			f.clusterCIDRs(want)
		} else {
			f.nodeClusterCIDRs(peersView(ps))
		}
		rt := Routing{Mode: datapath.TunnelOff}
		if f.dp != nil {
			// The device again at every sync: one deleted by hand comes back.
			rt, err = f.o.Tunnel.ensure(f.dp, f.o.Logger)
		}
		if err == nil {
			var rs []PeerRoute
			rs, err = SyncPeerRoutesWith(ps, rt)
			if err == nil {
				f.logf("peer routes (tunnel %s): %s", rt.Mode, routeList(rs))
			}
		}
	}
	if err != nil {
		f.logf("peer routes: %v", err)
	}
}
