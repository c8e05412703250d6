package endpoint

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// randomMAC returns a unicast, locally administered MAC.
func randomMAC() (net.HardwareAddr, error) {
	m := make(net.HardwareAddr, 6)
	if _, err := rand.Read(m); err != nil {
		return nil, err
	}
	m[0] = (m[0] | 0x02) &^ 0x01
	return m, nil
}

// Fallback next hops when IPAM names no gateway: the pod only needs an address
// to hang a static neighbour entry on.
var (
	fallbackGW4 = net.IPv4(169, 254, 1, 1).To4()
	fallbackGW6 = net.ParseIP("fe80::1")
)

// plan is what ADD configures, worked out once from the IPAM result.
type plan struct {
	hostIf  string
	ifname  string
	mtu     int
	hostMAC net.HardwareAddr
	podMAC  net.HardwareAddr
	ips     []*current.IPConfig
	gws     []net.IP        // one next hop per family present
	routes  []*netlinkRoute // the interface's: all in its own table
	table   int             // that table, set by configurePod
	// podIndex is the pod end's ifindex in the pod's netns, read off the
	// host end createVeth looked up (0: unknown, configurePod looks the
	// pod end up by name).
	podIndex int

	mainRoutes []*netlinkRoute // those configurePod put in the main table too
}

type netlinkRoute struct {
	dst *net.IPNet
	gw  net.IP
}

func isV4(ip net.IP) bool { return ip.To4() != nil }

// newPlan completes the plan the veth was made with (names, MTU, MACs)
// with gateways and routes from the IPAM result: a default route per family
// the pod has an address in, plus IPAM's routes, all via the gateway.
func newPlan(res *current.Result, veth *plan) (*plan, error) {
	p := &plan{hostIf: veth.hostIf, ifname: veth.ifname, mtu: veth.mtu, hostMAC: veth.hostMAC, podMAC: veth.podMAC, podIndex: veth.podIndex, ips: res.IPs}
	var gw4, gw6 net.IP
	for _, ipc := range res.IPs {
		v4 := isV4(ipc.Address.IP)
		gw := ipc.Gateway
		if gw == nil {
			if v4 {
				gw = fallbackGW4
			} else {
				gw = fallbackGW6
			}
		}
		if v4 && gw4 == nil {
			gw4 = gw.To4()
			ipc.Gateway = gw4
		} else if !v4 && gw6 == nil {
			gw6 = gw
			ipc.Gateway = gw6
		}
	}
	if gw4 == nil && gw6 == nil {
		return nil, errors.New("ipam returned no IP addresses")
	}
	haveDefault := map[bool]bool{}
	for _, r := range res.Routes {
		v4 := isV4(r.Dst.IP)
		gw := r.GW
		if gw == nil {
			gw = gw4
			if !v4 {
				gw = gw6
			}
		}
		if gw == nil {
			return nil, fmt.Errorf("ipam route %s has no gateway and the pod has no address of its family", r.Dst.String())
		}
		if ones, _ := r.Dst.Mask.Size(); ones == 0 {
			haveDefault[v4] = true
		}
		p.routes = append(p.routes, &netlinkRoute{dst: &net.IPNet{IP: r.Dst.IP, Mask: r.Dst.Mask}, gw: gw})
	}
	if gw4 != nil {
		p.gws = append(p.gws, gw4)
		if !haveDefault[true] {
			p.routes = append(p.routes, &netlinkRoute{dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, gw: gw4})
		}
	}
	if gw6 != nil {
		p.gws = append(p.gws, gw6)
		if !haveDefault[false] {
			p.routes = append(p.routes, &netlinkRoute{dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, gw: gw6})
		}
	}
	return p, nil
}

// createVeth creates the pair in the host netns with the peer born inside the
// pod's netns under its final name: no rename, no move.
func createVeth(r *rtnl, p *plan, netns ns.NetNS) (netlink.Link, error) {
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: p.hostIf, HardwareAddr: p.hostMAC, MTU: p.mtu},
		PeerName:         p.ifname,
		PeerHardwareAddr: p.podMAC,
		PeerNamespace:    netlink.NsFd(int(netns.Fd())),
	}
	if p.mtu > 0 {
		veth.PeerMTU = uint32(p.mtu)
	}
	if err := r.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, takenName(r, p)
		}
		return nil, fmt.Errorf("create veth %s (pod end %s): %w", p.hostIf, p.ifname, err)
	}
	l, err := r.LinkByName(p.hostIf)
	if err != nil {
		return nil, fmt.Errorf("find new veth %s: %w", p.hostIf, err)
	}
	// A veth's IFLA_LINK is its peer's ifindex, and IFLA_LINK_NETNSID is
	// there when the peer is in another netns: the pod's, where it was just
	// made. configurePod needs no lookup of it then, after IPAM (issue 30).
	if a := l.Attrs(); a.NetNsID >= 0 && a.ParentIndex > 0 {
		p.podIndex = a.ParentIndex
	}
	return l, nil
}

// takenName is createVeth's EEXIST: the runtime's CNI_IFNAME is taken in the
// pod, or (a leftover no record names) the host end's name on the node.
// Either is the environment's (4), named, not an internal error.
func takenName(r *rtnl, p *plan) error {
	if _, err := r.LinkByName(p.hostIf); err == nil {
		return Errorf(ErrEnv, "create veth %s: an interface of that name exists already on the node (not one of this plugin's attachments: remove it)", p.hostIf)
	}
	return Errorf(ErrEnv, "CNI_IFNAME %s: an interface of that name exists already in the pod's network namespace", p.ifname)
}

// addrAddError names the cause the kernel gives only as EACCES: IPv6 is
// disabled on the pod's interface (its netns' net.ipv6.conf.default or all
// disable_ipv6), and IPAM gave it an IPv6 address.
func addrAddError(err error, a *net.IPNet, ifname string) error {
	if errors.Is(err, unix.EACCES) && a.IP.To4() == nil {
		return fmt.Errorf("add address %s to %s: IPv6 is disabled in the pod's network namespace (net.ipv6.conf.%s.disable_ipv6), and IPAM gave it an IPv6 address: %w", a, ifname, ifname, err)
	}
	return fmt.Errorf("add address %s to %s: %w", a, ifname, err)
}

// A pod may have several interfaces (eth0 from one network, net1 from
// another, as Multus makes them; ours or another plugin's). Each of ours gets
// its own routing table in the pod, with its routes and a default route via
// its gateway, and a "from <address> lookup <table>" rule per address, so
// whatever leaves with an interface's address leaves through that interface
// (anything else would be dropped as spoofed by the other interface's host
// veth). The main table gets the IPAM routes of every interface and a default
// route per family only from the first interface of that family (whichever
// plugin made it): a second interface never takes the pod's default route.
// Gateways are "onlink", so every interface can have the same one
// (169.254.1.1) without a /32 route to it that a second interface would steal.
const (
	podTableBase    = 10000 // + the interface's ifindex in the pod
	podRulePriority = 1000  // after local (0), before main (32766)
)

// podTable is the routing table of the pod interface with that ifindex.
func podTable(ifindex int) int { return podTableBase + ifindex }

func isDefault(dst *net.IPNet) bool {
	ones, _ := dst.Mask.Size()
	return ones == 0
}

// podEnd is the pod's end of the veth: by the ifindex createVeth learned
// (every request below names the link by its index alone), else looked up
// by name.
func podEnd(r *rtnl, p *plan) (netlink.Link, error) {
	if p.podIndex > 0 {
		la := netlink.NewLinkAttrs()
		la.Index, la.Name = p.podIndex, p.ifname
		return &netlink.Veth{LinkAttrs: la}, nil
	}
	return r.LinkByName(p.ifname)
}

// configurePod sets addresses, neighbours, routes and rules inside the pod
// netns, through r, the pod's sockets.
func configurePod(r *rtnl, p *plan, netns ns.NetNS) error {
	return netns.Do(func(ns.NetNS) error {
		l, err := podEnd(r, p)
		if err != nil {
			return fmt.Errorf("find %s in pod: %w", p.ifname, err)
		}
		idx := l.Attrs().Index
		p.table = podTable(idx)
		hasV4 := false
		for _, ipc := range p.ips {
			hasV4 = hasV4 || isV4(ipc.Address.IP)
		}
		if err := upAnnouncing(r, l, p.ifname, hasV4); err != nil {
			return err
		}
		for _, ipc := range p.ips {
			// No prefix route: every destination, same subnet or not, goes via the
			// gateway and so through the host veth's programs. No DAD: the address
			// is ours alone on a point-to-point link.
			a := &netlink.Addr{IPNet: &ipc.Address, Flags: unix.IFA_F_NOPREFIXROUTE}
			if !isV4(ipc.Address.IP) {
				a.Flags |= unix.IFA_F_NODAD
			}
			if err := r.AddrAdd(l, a); err != nil {
				return addrAddError(err, &ipc.Address, p.ifname)
			}
		}
		for _, gw := range p.gws {
			// Static neighbour: the pod never ARPs/NDs for its gateway.
			n := &netlink.Neigh{LinkIndex: idx, IP: gw, HardwareAddr: p.hostMAC, State: netlink.NUD_PERMANENT, Family: family(gw)}
			if err := r.NeighSet(n); err != nil {
				return fmt.Errorf("add neighbour %s on %s: %w", gw, p.ifname, err)
			}
		}
		if err := addPodRoutes(r, p, idx); err != nil {
			return err
		}
		var ips []net.IP
		for _, ipc := range p.ips {
			if err := r.RuleAdd(podRule(ipc.Address.IP, p.table)); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("add rule from %s lookup %d: %w", ipc.Address.IP, p.table, err)
			}
			ips = append(ips, ipc.Address.IP)
		}
		// Last: the kernel's work for the addresses ran beside the rest.
		return settleLocalRoutes(r, ips, localRouteWait)
	})
}

// addPodRoutes adds the interface's routes to its own table and, unless
// another interface holds them, to main, through one nexthop object per
// gateway.
func addPodRoutes(r *rtnl, p *plan, idx int) error {
	hasDefault, err := defaultRoutes(r, p.routes)
	if err != nil {
		return err
	}
	// A nexthop object per gateway, shared by a route's two copies (see
	// nexthop.go: the path MTU the pod learns must be where it looks).
	nhs, gws, err := podNexthops(p.table, p.routes)
	if err != nil {
		return fmt.Errorf("routes of %s: %w", p.ifname, err)
	}
	for _, gw := range gws {
		if err := addNexthop(r, nhs[gw.String()], idx, gw); err != nil {
			return fmt.Errorf("%s: %w", p.ifname, err)
		}
	}
	for _, rt := range p.routes {
		id := nhs[rt.gw.String()]
		if err := addNexthopRoute(r, rt.dst, id, p.table); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add route %s via %s on %s to table %d: %w", rt.dst, rt.gw, p.ifname, p.table, err)
		}
		v4 := isV4(rt.dst.IP)
		if isDefault(rt.dst) && hasDefault[v4] != "" {
			continue // the pod's default route is another interface's
		}
		if err := addNexthopRoute(r, rt.dst, id, 0); err != nil {
			if errors.Is(err, unix.EEXIST) && isDefault(rt.dst) {
				// Another interface's ADD, running beside ours, took the
				// default route after we looked: it keeps it.
				continue
			}
			if errors.Is(err, unix.EEXIST) {
				return &conflictError{fmt.Sprintf("route %s via %s on %s: the pod already routes %s via %s; a route of another interface is never replaced",
					rt.dst, rt.gw, p.ifname, rt.dst, routeHolder(rt.dst))}
			}
			return fmt.Errorf("add route %s via %s on %s: %w", rt.dst, rt.gw, p.ifname, err)
		}
		p.mainRoutes = append(p.mainRoutes, rt)
		if isDefault(rt.dst) {
			hasDefault[v4] = p.ifname
		}
	}
	return nil
}

func podRule(ip net.IP, table int) *netlink.Rule {
	r := netlink.NewRule()
	bits := 128
	r.Family = netlink.FAMILY_V6
	if isV4(ip) {
		bits, r.Family = 32, netlink.FAMILY_V4
		ip = ip.To4()
	}
	r.Src = &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}
	r.Table = table
	r.Priority = podRulePriority
	return r
}

// deleteRules removes the rules of r's netns (nil: the calling thread's)
// that point at a table (the rules of a pod interface outlive it).
func deleteRules(r *rtnl, table int) {
	r = r.orEach()
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := r.RuleListFiltered(fam, &netlink.Rule{Table: table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			continue
		}
		for i := range rules {
			_ = r.RuleDel(&rules[i])
		}
	}
}

// defaultRoutes names, per family (true: IPv4), the interface holding the
// default route of r's netns, "" when there is none. Only the families
// of the default routes among routes are dumped: no other is asked for.
func defaultRoutes(r *rtnl, routes []*netlinkRoute) (map[bool]string, error) {
	out := map[bool]string{}
	want := map[int]bool{}
	for _, rt := range routes {
		if isDefault(rt.dst) {
			want[family(rt.dst.IP)] = true
		}
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		if !want[fam] {
			continue
		}
		routes, err := r.RouteList(nil, fam)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil || isDefault(r.Dst) {
				out[fam == netlink.FAMILY_V4] = linkName(r.LinkIndex)
			}
		}
	}
	return out, nil
}

func linkName(ifindex int) string {
	if l, err := netlink.LinkByIndex(ifindex); err == nil {
		return l.Attrs().Name
	}
	return fmt.Sprintf("ifindex %d", ifindex)
}

// routeHolder names the link of the main-table route to dst.
func routeHolder(dst *net.IPNet) string {
	fam := netlink.FAMILY_V6
	if isV4(dst.IP) {
		fam = netlink.FAMILY_V4
	}
	routes, _ := netlinksafe.RouteList(nil, fam)
	for _, r := range routes {
		if (r.Dst == nil && isDefault(dst)) || (r.Dst != nil && r.Dst.String() == dst.String()) {
			return linkName(r.LinkIndex)
		}
	}
	return "another route"
}

func family(ip net.IP) int {
	if isV4(ip) {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// ownerAlias is the alias ADD gives a host veth, so whoever finds the link
// (a conflicting ADD of any network, sharing this node's pins or not; a human
// with ip link) learns whose it is.
func ownerAlias(network, containerID, ifname string) string {
	if room := aliasIDRoom(network, ifname); len(containerID) > room {
		containerID = containerID[:room] + "..."
	}
	return aliasPrefix + network + "/" + containerID + "/" + ifname
}

// aliasIDRoom is how many bytes of a container ID ownerAlias keeps whole:
// the three parts come to at most 200 bytes, but the ID keeps at least one
// byte, whatever the network's name (a valid one is up to 255 bytes, a
// directory under stateDir: attack31c, a name of 197 bytes panicked in
// ADD, one of 196 wrote an alias without an ID). The alias stays within
// the kernel's 255 bytes for a network and interface name of up to
// aliasNamesMax bytes together; ADD refuses a longer pair (CheckNames).
func aliasIDRoom(network, ifname string) int {
	return max(200-len(network)-len(ifname), 1)
}

// aliasNamesMax is how many bytes of network and interface name together
// an alias holds with the container ID cut to one byte and "...": the
// kernel's IFALIASZ (256, with the NUL) less the prefix and the two "/".
const aliasNamesMax = 255 - len(aliasPrefix) - 2 - len("c...")

// CheckNames refuses, before ADD makes anything, the names the CNI
// library lets through that no attachment can have (names31): an
// interface name with a "%" (the kernel takes it for a pattern and picks
// the name itself, "eth%d" is eth0, or refuses it), and a network and
// interface name whose host veth alias (ownerAlias) would not fit in the
// kernel's 255 bytes (ADD failed setting it, 999, "numerical result out
// of range").
func CheckNames(network, ifname string) error {
	if strings.Contains(ifname, "%") {
		return Errorf(ErrEnv, "CNI_IFNAME %q: an interface name with a %%: the kernel takes it for a pattern (eth%%d is eth0, eth1...) and does not give the interface this name", ifname)
	}
	if n := len(network) + len(ifname); n > aliasNamesMax {
		return Errorf(ErrConfig, "name: a network name of %d bytes with CNI_IFNAME %q (%d bytes): the host veth's alias (%s<name>/<container ID>/<interface>, at most 255 bytes) holds at most %d bytes of both",
			len(network), ifname, len(ifname), aliasPrefix, aliasNamesMax)
	}
	return nil
}

const aliasPrefix = "ebpf-cni:"

// AliasOwner is the attachment a host veth's alias names (ownerAlias).
type AliasOwner struct {
	Network, ContainerID, IfName string
	// Truncated: ownerAlias cut the container ID to fit the alias;
	// ContainerID is only its start then (the alias has it followed by
	// "...").
	Truncated bool
}

// ParseOwnerAlias parses an alias ownerAlias wrote, the one place beside
// the writer that knows its format: ok is false for any other (no prefix
// of ours, not three parts, a part that is no valid CNI network name,
// container ID or interface name: skel refuses every verb whose are not).
// The alias is anyone's with CAP_NET_ADMIN to set: what it names is a
// claim to check against the record, never proof.
func ParseOwnerAlias(alias string) (o AliasOwner, ok bool) {
	rest, ok := strings.CutPrefix(alias, aliasPrefix)
	if !ok {
		return AliasOwner{}, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return AliasOwner{}, false
	}
	o = AliasOwner{Network: parts[0], ContainerID: parts[1], IfName: parts[2]}
	// Cut exactly when ownerAlias cuts: an ID that ends in "..." and fits
	// is whole (it is at most aliasIDRoom bytes long then).
	if cut, found := strings.CutSuffix(o.ContainerID, "..."); found && len(cut) == aliasIDRoom(o.Network, o.IfName) {
		o.ContainerID, o.Truncated = cut, true
	}
	if utils.ValidateNetworkName(o.Network) != nil || utils.ValidateContainerID(o.ContainerID) != nil ||
		utils.ValidateInterfaceName(o.IfName) != nil {
		return AliasOwner{}, false
	}
	return o, true
}

// idText is the alias's container ID as written ("..." when cut).
func (o AliasOwner) idText() string {
	if o.Truncated {
		return o.ContainerID + "..."
	}
	return o.ContainerID
}

// foreignLink tells whether a node link's alias names an attachment other
// than network's containerID/ifname (a link with no alias of ours, say one
// an ADD killed before it set the alias, is not foreign).
func foreignLink(l netlink.Link, network, containerID, ifname string) bool {
	alias := l.Attrs().Alias
	return strings.HasPrefix(alias, aliasPrefix) && alias != ownerAlias(network, containerID, ifname)
}

// replacedLink tells whether a node link under an attachment's host veth
// name is another tool's that took the name after the attachment's veth
// went (an operator's `ip link del`, the pod's netns gone): it lacks the
// attachment's alias, and either its record names another ifindex or no
// record is left (rec nil). Sound because ADD writes the record
// (provisional, ifindex 0) before it makes the veth, and DEL forgets the
// record only once the veth is gone: a veth of ours that an ADD killed
// before setting the alias still has its record.
//
// Whatever its name, alias or ifindex, a link that is not a veth with its
// peer in another netns is not an attachment's host veth: ADD makes the
// pair with the peer in the pod, and the pair dies with the pod's netns
// (attack26: links made under our name at our old ifindex, or with our
// alias copied, were deleted).
func replacedLink(l netlink.Link, rec *state.Record, network, containerID, ifname string) bool {
	if !podVeth(l) {
		return true
	}
	if l.Attrs().Alias == ownerAlias(network, containerID, ifname) {
		return false
	}
	return rec == nil || (rec.HostIfindex != 0 && rec.HostIfindex != l.Attrs().Index)
}

// podVeth tells whether l is a veth whose peer is in another netns, as
// every host veth of ours is from its creation on.
func podVeth(l netlink.Link) bool {
	_, veth := l.(*netlink.Veth)
	return veth && l.Attrs().NetNsID >= 0
}

// ReplacedHostVeth is replacedLink for callers outside the package (the
// uninstall's judgement): whether l, the node link under rec's host veth
// name, is another tool's that took the name after the veth of network's
// attachment rec went.
func ReplacedHostVeth(l netlink.Link, rec *state.Record, network string) bool {
	return replacedLink(l, rec, network, rec.ContainerID, rec.IfName)
}

// recordedVeth tells whether l is the host veth rec names, whatever its
// alias says: at the record's ifindex, a veth whose peer is in another
// netns, with the record's host MAC. The alias is anyone's to set (`ip
// link set alias`); the ifindex and the MAC (random) are ADD's, and the
// pair dies with the pod's netns. Another plugin's veth made at the old
// index once ours went, its peer put in the pod, has another MAC: not ours
// (attack28: DEL deleted it). Where the peer is now does not count: the
// pod may move its end into a netns of its own making (attack30: DEL left
// the veth, reconcile released the live pod's record, lease and entries).
// A record with no host MAC (an older build's) names the veth whose peer
// is in the record's netns (the node's netns id of that netns is the
// link's peer netns id). A link of another attachment sharing our name
// (another network's veth of the same container and interface, which
// refused our ADD) is not at the ifindex our record holds: that ADD
// recorded none.
func recordedVeth(r *rtnl, l netlink.Link, rec *state.Record) bool {
	if rec == nil || rec.HostIfindex == 0 || rec.HostIfindex != l.Attrs().Index || !podVeth(l) {
		return false
	}
	if rec.HostMAC != "" {
		return recordedMAC(l, rec)
	}
	if rec.Netns == "" {
		return false
	}
	pod, err := ns.GetNS(rec.Netns)
	if err != nil {
		return false
	}
	defer pod.Close()
	id, err := r.orEach().GetNetNsIdByFd(int(pod.Fd()))
	return err == nil && id >= 0 && id == l.Attrs().NetNsID
}

// renamedVeth tells whether l, the link at an attachment's recorded
// ifindex under another name than its host veth's, is that veth renamed
// (an operator's `ip link set NAME name ...`): it carries the attachment's
// alias and is a veth whose peer is in another netns, as ADD made it (a
// link another tool made at the index, even with the alias copied, has its
// peer beside it, and one made with its peer put in the pod has another
// MAC than the record's: attack28).
func renamedVeth(l netlink.Link, rec *state.Record, network, containerID, ifname string) bool {
	return podVeth(l) && l.Attrs().Alias == ownerAlias(network, containerID, ifname) && recordedMAC(l, rec)
}

// renamedHostVeth is the rule CHECK (renamedHost), DEL (findByRecord),
// GC and reconcile (vethGone) and the agent's status (RecordedHostVeth)
// share for l, the link at the record's ifindex under another name than
// its host veth's: that veth renamed (renamedVeth), or renamed and
// re-aliased (recordedVeth).
func renamedHostVeth(r *rtnl, l netlink.Link, rec *state.Record, network string) bool {
	return renamedVeth(l, rec, network, rec.ContainerID, rec.IfName) || recordedVeth(r, l, rec)
}

// RecordedHostVeth tells whether l, a node link, is the host veth of
// network's attachment rec, as the teardown finds it (newTeardown,
// findByRecord): at the record's ifindex, and under its host veth name
// neither another tool's (replacedLink) nor another attachment's
// (foreignLink, unless recordedVeth), under another name the veth renamed
// (renamedHostVeth). Another plugin's veth made at the ifindex once ours
// went, even with its peer in the pod or our alias copied, is not (its MAC
// is not the record's: attack28). The agent's status and dumps count and
// name host veths by it.
func RecordedHostVeth(l netlink.Link, rec *state.Record, network string) bool {
	if rec == nil || rec.HostIfindex == 0 || l.Attrs().Index != rec.HostIfindex {
		return false
	}
	if l.Attrs().Name != state.HostIfName(rec.ContainerID, rec.IfName) {
		return renamedHostVeth(nil, l, rec, network)
	}
	if replacedLink(l, rec, network, rec.ContainerID, rec.IfName) {
		return false
	}
	return !foreignLink(l, network, rec.ContainerID, rec.IfName) || recordedVeth(nil, l, rec)
}

// PinNameOf is the host veth name the link pins of node link l are under:
// the record's (under stateDir, any network) when l is the host veth it
// names (RecordedHostVeth: an operator may have renamed it), else l's own.
// A link under the host veth name its alias names is under its own when
// the record the alias names says it is that veth: that record alone is
// read (the agent asks on every link event of a host veth). The alias is
// anyone's to set: an operator who renamed pod 2's veth away and pod 1's to
// pod 2's old name, with pod 2's alias, had pod 1's links pinned under pod
// 2's name, where pod 2's move then replaced them and detached pod 1's
// programs (attack30b, TestAttack30bMoveAliasSpoofSharesPins).
func PinNameOf(stateDir string, l netlink.Link) string {
	a := l.Attrs()
	// The network is a directory under stateDir: ParseOwnerAlias refuses
	// any that is no valid network name ("..", "a/b").
	if o, ok := ParseOwnerAlias(a.Alias); ok && !o.Truncated && state.HostIfName(o.ContainerID, o.IfName) == a.Name {
		rec, err := state.Store{Root: stateDir, Network: o.Network}.Read(o.ContainerID, o.IfName)
		if err == nil && rec != nil && RecordedHostVeth(l, rec, o.Network) {
			return a.Name
		}
	}
	if name, ok := IndexHostVeths(stateDir).PinName(l); ok {
		return name
	}
	return a.Name
}

// HostVethIndex is the records under a state directory (every network's)
// by their host veth's ifindex: one read of them for many links.
type HostVethIndex map[int][]networkRecord

type networkRecord struct {
	network string
	rec     *state.Record
}

// IndexHostVeths reads every record under stateDir once.
func IndexHostVeths(stateDir string) HostVethIndex {
	x := HostVethIndex{}
	nets, _ := state.Networks(stateDir)
	for _, n := range nets {
		recs, _ := state.Store{Root: stateDir, Network: n}.List()
		for _, rec := range recs {
			if rec.HostIfindex != 0 {
				x[rec.HostIfindex] = append(x[rec.HostIfindex], networkRecord{n, rec})
			}
		}
	}
	return x
}

// PinName is the host veth name of the record whose host veth node link l
// is (RecordedHostVeth: its ifindex and MAC, under any name); ok false
// when l is no record's host veth.
func (x HostVethIndex) PinName(l netlink.Link) (name string, ok bool) {
	for _, r := range x[l.Attrs().Index] {
		if RecordedHostVeth(l, r.rec, r.network) {
			return state.HostIfName(r.rec.ContainerID, r.rec.IfName), true
		}
	}
	return "", false
}

// recordedMAC tells whether l has the host veth's MAC rec holds (any
// when rec holds none).
func recordedMAC(l netlink.Link, rec *state.Record) bool {
	return rec == nil || rec.HostMAC == "" || l.Attrs().HardwareAddr.String() == rec.HostMAC
}

// holderOf names what holds a node link: the attachment its alias names,
// else the link itself.
func holderOf(ifindex int) string {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return fmt.Sprintf("ifindex %d", ifindex)
	}
	a := l.Attrs()
	if o, ok := ParseOwnerAlias(a.Alias); ok {
		return fmt.Sprintf("container %s, interface %s of network %q (host veth %s)", o.idText(), o.IfName, o.Network, a.Name)
	}
	return fmt.Sprintf("link %s (ifindex %d)", a.Name, ifindex)
}

// linkAlive tells whether an ifindex names a link of the calling thread's netns.
func linkAlive(ifindex int) bool {
	_, err := netlink.LinkByIndex(ifindex)
	var nf netlink.LinkNotFoundError
	return !errors.As(err, &nf)
}

// readyHost names the host veth's owner in its alias and brings it up:
// before the addresses are known, while IPAM runs (the programs attached
// drop what the maps do not know yet, and with the pod's end down it has
// no carrier).
//
// One RTM_SETLINK carries both (the alias and IFF_UP): each request takes
// RTNL, which every ADD and DEL of the node queues for (issue 30: 100 ADDs
// at once); the kernel applies the alias, then the flags, in the one hold.
func readyHost(r *rtnl, hostIf string, host netlink.Link, alias string) error {
	req := r.request(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(host.Attrs().Index)
	msg.Flags, msg.Change = unix.IFF_UP, unix.IFF_UP
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(alias)))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("set alias of %s and bring it up: %w", hostIf, err)
	}
	return nil
}

// routeHost routes the pod's IPs to the host veth, with static neighbours
// so the node never resolves a pod it created. A route to a pod IP that
// exists already is another interface's: refused, not replaced.
func routeHost(r *rtnl, p *plan, host netlink.Link) error {
	idx := host.Attrs().Index
	for _, ipc := range p.ips {
		ip := ipc.Address.IP
		n := &netlink.Neigh{LinkIndex: idx, IP: ip, HardwareAddr: p.podMAC, State: netlink.NUD_PERMANENT, Family: family(ip)}
		if err := r.NeighSet(n); err != nil {
			return fmt.Errorf("add neighbour %s on %s: %w", ip, p.hostIf, err)
		}
		bits := 32
		if !isV4(ip) {
			bits = 128
		}
		dst := &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}
		rt := &netlink.Route{LinkIndex: idx, Dst: dst, Scope: netlink.SCOPE_LINK}
		if err := r.RouteAdd(rt); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return &conflictError{fmt.Sprintf("pod address %s: the node already routes %s to %s; an address has one owner (overlapping ranges of two networks?)",
					ip, dst, nodeRouteHolder(dst))}
			}
			return fmt.Errorf("add route to %s via %s: %w", ip, p.hostIf, err)
		}
	}
	return nil
}

// nodeRouteHolder names the holder of the node's main-table route to dst.
func nodeRouteHolder(dst *net.IPNet) string {
	fam := netlink.FAMILY_V6
	if isV4(dst.IP) {
		fam = netlink.FAMILY_V4
	}
	routes, _ := netlinksafe.RouteListFiltered(fam, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
	for _, r := range routes {
		if r.LinkIndex != 0 {
			return holderOf(r.LinkIndex)
		}
		return fmt.Sprintf("a route of type %d", r.Type)
	}
	return "another route"
}

// deleteLinkIndex removes the host veth with that ifindex (its peer and
// routes go with it) of r's netns (nil: the calling thread's); absent is
// fine. By ifindex, not by name: a teardown deletes the veth it
// identified, never a link another tool made under the same name since.
func deleteLinkIndex(r *rtnl, ifindex int) error {
	if ifindex <= 0 {
		return nil
	}
	req := r.request(unix.RTM_DELLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete ifindex %d: %w", ifindex, err)
	}
	return nil
}
