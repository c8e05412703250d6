package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// tunnelAddrs is what the tunnel device holds, one address a family: the
// network address of this node's pod CIDR of that family (which IPAM never
// hands out; flannel's choice), else the address this node is known by
// (self, when the node holds it). The stack's masquerade into the tunnel
// (kube-proxy's, for a NodePort whose endpoint is on another node) takes
// its source from the outgoing device first: with no address there it
// took another device's, which the receiving node does not know as this
// node's and drops (drop_tunnel_source). An address of the pod CIDR also
// brings the endpoint's reply back through the tunnel (a route to the
// node's address would take it over the underlay with a pod's source,
// which the other node masquerades and a cloud's source check drops).
func tunnelAddrs(self []netip.Addr, podCIDRs []netip.Prefix, local map[string]bool) []netip.Addr {
	var out []netip.Addr
	for _, v4 := range []bool{true, false} {
		var pick netip.Addr
		for _, c := range podCIDRs {
			if c.Addr().Is4() == v4 {
				pick = c.Masked().Addr()
				break
			}
		}
		for _, a := range self {
			if !pick.IsValid() && a.Is4() == v4 && local[a.String()] {
				pick = a
			}
		}
		if pick.IsValid() {
			out = append(out, pick)
		}
	}
	return out
}

// syncTunnelAddrs makes the tunnel device (ifindex) hold exactly addrs,
// each alone (/32, /128: no prefix route), IPv6 without DAD (the node
// holds it already, or it is its pod CIDR's own).
func syncTunnelAddrs(ifindex int, addrs []netip.Addr) error {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return fmt.Errorf("tunnel device %d: %w", ifindex, err)
	}
	have, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("tunnel device %s: addresses: %w", l.Attrs().Name, err)
	}
	want := map[netip.Addr]bool{}
	for _, a := range addrs {
		want[a] = true
	}
	var errs error
	for _, h := range have {
		a, _ := netip.AddrFromSlice(h.IP)
		a = a.Unmap()
		if a.IsLinkLocalUnicast() {
			continue // the kernel's own
		}
		ones, bits := h.Mask.Size()
		if want[a] && ones == bits {
			delete(want, a)
			continue
		}
		if err := netlink.AddrDel(l, &h); err != nil {
			errs = errors.Join(errs, fmt.Errorf("tunnel device %s: remove address %s: %w", l.Attrs().Name, h.IPNet, err))
		}
	}
	for _, a := range addrs {
		if !want[a] {
			continue
		}
		bits := 32
		if a.Is6() {
			bits = 128
		}
		na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}, Flags: unix.IFA_F_NOPREFIXROUTE}
		if a.Is6() {
			na.Flags |= unix.IFA_F_NODAD
		}
		if err := netlink.AddrReplace(l, na); err != nil {
			errs = errors.Join(errs, fmt.Errorf("tunnel device %s: address %s: %w", l.Attrs().Name, na.IPNet, err))
		}
	}
	return errs
}
