package agent

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// hopProtocol tags the neighbour entries EnsureTunnelHops makes managed
// (NDA_PROTOCOL, Linux 5.3; `ip neigh show` prints "proto 199"), as the
// peer routes carry RouteProtocol: SyncTunnelHops and the uninstall remove
// those and never an entry the kernel or someone else made.
const hopProtocol = RouteProtocol

// tunnelHop is a next hop on a link.
type tunnelHop struct {
	link int
	ip   string
}

// SyncTunnelHops keeps the next hop toward every node address resolved
// (a managed neighbour entry, NTF_EXT_MANAGED: the kernel resolves it and
// keeps it so). The uplinks' check of a tunnel datagram's outer MAC
// (bpf/lib/tunnel.h, tun_hop_mismatch) drops what comes while the next hop
// toward its claimed node is unresolved, and a node that only receives
// from another (an IPv6 gateway known by its link-local address only, a
// neighbour aged out) would never resolve it. Entries already valid are
// left as they are; one missing or failed is made managed, which sends
// the first ARP or ND at once.
//
// SyncTunnelHops does that, then removes the entries it made
// (hopProtocol) that are the next hop toward none of nodes: a node left,
// a route changed, the tunnel went off (nodes empty).
func SyncTunnelHops(nodes []net.IP) error {
	want, err := ensureTunnelHops(nodes)
	have, lerr := taggedHops()
	if lerr != nil {
		return errors.Join(err, lerr)
	}
	for _, h := range have {
		if want[h] {
			continue
		}
		if derr := deleteHop(h); derr != nil {
			err = errors.Join(err, derr)
		}
	}
	return err
}

// RemoveTunnelHops deletes every neighbour entry the agent made managed
// (uninstall); it returns them as "ip (link name)".
func RemoveTunnelHops() ([]string, error) {
	have, err := taggedHops()
	var out []string
	for _, h := range have {
		if derr := deleteHop(h); derr != nil {
			err = errors.Join(err, derr)
			continue
		}
		name := fmt.Sprint(h.link)
		if l, lerr := netlink.LinkByIndex(h.link); lerr == nil {
			name = l.Attrs().Name
		}
		out = append(out, fmt.Sprintf("%s (%s)", h.ip, name))
	}
	return out, err
}

// ensureTunnelHops does EnsureTunnelHops' work and returns the next hops
// it wants (resolved already or made managed).
func ensureTunnelHops(nodes []net.IP) (map[tunnelHop]bool, error) {
	want := map[tunnelHop]bool{}
	tun := -1
	if l, err := netlinksafe.LinkByName(datapath.TunnelDevice); err == nil {
		tun = l.Attrs().Index
	}
	var errs error
	for _, a := range nodes {
		rs, err := netlink.RouteGet(a)
		if err != nil || len(rs) == 0 {
			continue // no route to it: nothing it sends can be checked as from a next hop
		}
		nh, idx := rs[0].Gw, rs[0].LinkIndex
		if nh == nil {
			nh = a
		}
		if idx == tun || idx == 0 || rs[0].Type == unix.RTN_LOCAL {
			continue
		}
		want[tunnelHop{idx, nh.String()}] = true
		if hopResolved(idx, nh) {
			continue
		}
		if err := setManagedHop(idx, nh); err != nil {
			errs = errors.Join(errs, fmt.Errorf("neighbour %s (next hop toward node %s) managed: %w", nh, a, err))
		}
	}
	return want, errs
}

func ipFamily(ip net.IP) (int, []byte) {
	if v4 := ip.To4(); v4 != nil {
		return netlink.FAMILY_V4, v4
	}
	return netlink.FAMILY_V6, ip.To16()
}

// setManagedHop makes the neighbour ip on link idx managed, tagged
// hopProtocol (netlink.NeighSet has no protocol).
func setManagedHop(idx int, ip net.IP) error {
	fam, b := ipFamily(ip)
	req := nl.NewNetlinkRequest(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK)
	req.AddData(&netlink.Ndmsg{Family: uint8(fam), Index: uint32(idx), State: netlink.NUD_NONE})
	req.AddData(nl.NewRtAttr(netlink.NDA_DST, b))
	req.AddData(nl.NewRtAttr(netlink.NDA_PROTOCOL, []byte{byte(hopProtocol)}))
	req.AddData(nl.NewRtAttr(netlink.NDA_FLAGS_EXT, nl.Uint32Attr(netlink.NTF_EXT_MANAGED)))
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

func deleteHop(h tunnelHop) error {
	ip := net.ParseIP(h.ip)
	fam, _ := ipFamily(ip)
	err := netlink.NeighDel(&netlink.Neigh{LinkIndex: h.link, Family: fam, IP: ip})
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete neighbour %s (link %d, a next hop toward no node now): %w", h.ip, h.link, err)
	}
	return nil
}

// taggedHops lists the neighbour entries of hopProtocol, both families.
// A dump interrupted by a change is read again (three times at most).
func taggedHops() ([]tunnelHop, error) {
	var out []tunnelHop
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		var msgs [][]byte
		var err error
		for try := 0; try < 3; try++ {
			req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, unix.NLM_F_DUMP)
			req.AddData(&netlink.Ndmsg{Family: uint8(fam)})
			if msgs, err = req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH); !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			return out, fmt.Errorf("list neighbours: %w", err)
		}
		for _, m := range msgs {
			if len(m) < 12 {
				continue
			}
			idx := int(int32(nl.NativeEndian().Uint32(m[4:8])))
			attrs, err := nl.ParseRouteAttr(m[12:])
			if err != nil {
				continue
			}
			var ip net.IP
			tagged := false
			for _, a := range attrs {
				switch a.Attr.Type {
				case netlink.NDA_DST:
					ip = net.IP(a.Value)
				case netlink.NDA_PROTOCOL:
					tagged = len(a.Value) == 1 && a.Value[0] == byte(hopProtocol)
				}
			}
			if tagged && ip != nil {
				out = append(out, tunnelHop{idx, ip.String()})
			}
		}
	}
	return out, nil
}

// hopResolved tells whether the neighbour nh on link idx is usable (valid)
// or already managed.
func hopResolved(idx int, nh net.IP) bool {
	fam := netlink.FAMILY_V4
	if nh.To4() == nil {
		fam = netlink.FAMILY_V6
	}
	// lint:raw-netlink-dump: netlinksafe has no NeighList; an interrupted dump counts as unresolved, and making the entry managed again is harmless.
	ns, err := netlink.NeighList(idx, fam)
	if err != nil {
		return false
	}
	for _, n := range ns {
		if n.IP.Equal(nh) {
			return n.FlagsExt&netlink.NTF_EXT_MANAGED != 0 ||
				n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE|netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0
		}
	}
	return false
}
