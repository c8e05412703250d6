package agent

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// EnsureTunnelHops keeps the next hop toward every node address resolved
// (a managed neighbour entry, NTF_EXT_MANAGED: the kernel resolves it and
// keeps it so). The uplinks' check of a tunnel datagram's outer MAC
// (bpf/lib/tunnel.h, tun_hop_mismatch) drops what comes while the next hop
// toward its claimed node is unresolved, and a node that only receives
// from another (an IPv6 gateway known by its link-local address only, a
// neighbour aged out) would never resolve it. Entries already valid are
// left as they are; one missing or failed is made managed, which sends
// the first ARP or ND at once.
func EnsureTunnelHops(nodes []net.IP) error {
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
		if hopResolved(idx, nh) {
			continue
		}
		fam := netlink.FAMILY_V4
		if nh.To4() == nil {
			fam = netlink.FAMILY_V6
		}
		n := &netlink.Neigh{LinkIndex: idx, Family: fam, IP: nh, State: netlink.NUD_NONE, FlagsExt: netlink.NTF_EXT_MANAGED}
		if err := netlink.NeighSet(n); err != nil {
			errs = errors.Join(errs, fmt.Errorf("neighbour %s (next hop toward node %s) managed: %w", nh, a, err))
		}
	}
	return errs
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
