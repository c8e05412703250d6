package agent

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// syncTunnelAddrs gives the tunnel device exactly this node's own sources
// toward its peers (the src of the routes into it), as /32 and /128, and
// no other global address.
//
// Why: a packet the stack masquerades on its way out of the device
// (kube-proxy's MASQUERADE of a NodePort client or of a node process's
// ClusterIP connection, whose endpoint is on another node) takes the
// address the kernel selects for the device; with none of its own, the
// first global address of any link in the netns (lo's, a second NIC's),
// which no peer lists as this node's, and the peer's trust rule drops it
// (drop_tunnel_source; TestTunnelServicesAcross). The same address stays
// on the uplink; the node hooks do not count the device as one.
func syncTunnelAddrs(ifindex int, want []net.IP) error {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return fmt.Errorf("tunnel device addresses: %w", err)
	}
	have, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("tunnel device addresses: %w", err)
	}
	keep := map[string]bool{}
	for _, ip := range want {
		keep[ip.String()] = true
	}
	var errs error
	present := map[string]bool{}
	for _, a := range have {
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		if keep[a.IP.String()] {
			present[a.IP.String()] = true
			continue
		}
		if err := netlink.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = errors.Join(errs, fmt.Errorf("remove %s from the tunnel device: %w", a.IP, err))
		}
	}
	for _, ip := range want {
		if present[ip.String()] {
			continue
		}
		bits := 32
		if ip.To4() == nil {
			bits = 128
		}
		// No DAD: a tentative address is never selected, and this one is
		// the uplink's already.
		a := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrReplace(l, a); err != nil {
			errs = errors.Join(errs, fmt.Errorf("add %s to the tunnel device: %w", ip, err))
		}
	}
	return errs
}

// tunnelSources: the distinct src of the planned routes into the device.
func tunnelSources(pl peerRoutePlan, ifindex int) []net.IP {
	var out []net.IP
	seen := map[string]bool{}
	for _, r := range pl.want {
		if r.LinkIndex != ifindex || r.Src == nil || seen[r.Src.String()] {
			continue
		}
		seen[r.Src.String()] = true
		out = append(out, r.Src)
	}
	return out
}
