package cni

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// HostIfName is the deterministic host-side veth name of an attachment, so
// DEL finds it with no state: "ebpf" + 11 hex digits (15 chars, IFNAMSIZ-1).
func HostIfName(containerID, ifname string) string {
	h := sha256.Sum256([]byte(containerID + "/" + ifname))
	return "ebpf" + hex.EncodeToString(h[:])[:11]
}

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
	gws     []net.IP // one next hop per family present
	routes  []*netlinkRoute

	netnsCookie uint64 // filled by configurePod
}

type netlinkRoute struct {
	dst *net.IPNet
	gw  net.IP
}

func isV4(ip net.IP) bool { return ip.To4() != nil }

// newPlan derives gateways and routes from the IPAM result: a default route per
// family the pod has an address in, plus IPAM's routes, all via the gateway.
func newPlan(res *current.Result, hostIf, ifname string, mtu int) (*plan, error) {
	p := &plan{hostIf: hostIf, ifname: ifname, mtu: mtu, ips: res.IPs}
	var err error
	if p.hostMAC, err = randomMAC(); err != nil {
		return nil, err
	}
	if p.podMAC, err = randomMAC(); err != nil {
		return nil, err
	}
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
func createVeth(p *plan, netns ns.NetNS) (netlink.Link, error) {
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: p.hostIf, HardwareAddr: p.hostMAC, MTU: p.mtu},
		PeerName:         p.ifname,
		PeerHardwareAddr: p.podMAC,
		PeerNamespace:    netlink.NsFd(int(netns.Fd())),
	}
	if p.mtu > 0 {
		veth.PeerMTU = uint32(p.mtu)
	}
	if err := netlink.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create veth %s/%s: an interface of that name already exists (host %s, or %s in the pod)", p.hostIf, p.ifname, p.hostIf, p.ifname)
		}
		return nil, fmt.Errorf("create veth %s (pod end %s): %w", p.hostIf, p.ifname, err)
	}
	l, err := netlink.LinkByName(p.hostIf)
	if err != nil {
		return nil, fmt.Errorf("find new veth %s: %w", p.hostIf, err)
	}
	return l, nil
}

// configurePod sets addresses, neighbours and routes inside the pod netns.
func configurePod(p *plan, netns ns.NetNS) error {
	return netns.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(p.ifname)
		if err != nil {
			return fmt.Errorf("find %s in pod: %w", p.ifname, err)
		}
		idx := l.Attrs().Index
		for _, ipc := range p.ips {
			// No prefix route: every destination, same subnet or not, goes via the
			// gateway and so through the host veth's programs. No DAD: the address
			// is ours alone on a point-to-point link.
			a := &netlink.Addr{IPNet: &ipc.Address, Flags: unix.IFA_F_NOPREFIXROUTE}
			if !isV4(ipc.Address.IP) {
				a.Flags |= unix.IFA_F_NODAD
			}
			if err := netlink.AddrAdd(l, a); err != nil {
				return fmt.Errorf("add address %s to %s: %w", ipc.Address.String(), p.ifname, err)
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", p.ifname, err)
		}
		for _, gw := range p.gws {
			// Static neighbour: the pod never ARPs/NDs for its gateway.
			n := &netlink.Neigh{LinkIndex: idx, IP: gw, HardwareAddr: p.hostMAC, State: netlink.NUD_PERMANENT, Family: family(gw)}
			if err := netlink.NeighSet(n); err != nil {
				return fmt.Errorf("add neighbour %s on %s: %w", gw, p.ifname, err)
			}
			bits := 32
			if !isV4(gw) {
				bits = 128
			}
			r := &netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(bits, bits)}, Scope: netlink.SCOPE_LINK}
			if err := netlink.RouteReplace(r); err != nil {
				return fmt.Errorf("add route to gateway %s on %s: %w", gw, p.ifname, err)
			}
		}
		for _, rt := range p.routes {
			r := &netlink.Route{LinkIndex: idx, Dst: rt.dst, Gw: rt.gw}
			if err := netlink.RouteReplace(r); err != nil {
				return fmt.Errorf("add route %s via %s on %s: %w", rt.dst.String(), rt.gw, p.ifname, err)
			}
		}
		p.netnsCookie, err = datapath.NetnsCookie()
		return err
	})
}

func family(ip net.IP) int {
	if isV4(ip) {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// configureHost brings the host veth up and routes the pod's IPs to it, with
// static neighbours so the node never resolves a pod it created.
func configureHost(p *plan, host netlink.Link) error {
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("set %s up: %w", p.hostIf, err)
	}
	idx := host.Attrs().Index
	for _, ipc := range p.ips {
		ip := ipc.Address.IP
		n := &netlink.Neigh{LinkIndex: idx, IP: ip, HardwareAddr: p.podMAC, State: netlink.NUD_PERMANENT, Family: family(ip)}
		if err := netlink.NeighSet(n); err != nil {
			return fmt.Errorf("add neighbour %s on %s: %w", ip, p.hostIf, err)
		}
		bits := 32
		if !isV4(ip) {
			bits = 128
		}
		r := &netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}, Scope: netlink.SCOPE_LINK}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("add route to %s via %s: %w", ip, p.hostIf, err)
		}
	}
	return nil
}

// enableForwarding turns on IP forwarding for pods to leave the node, as ptp
// does; reading first keeps the common case to one read.
func enableForwarding(v4, v6 bool) error {
	set := func(path string) error {
		b, err := os.ReadFile(path)
		if err == nil && len(b) > 0 && b[0] == '1' {
			return nil
		}
		if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("enable forwarding (%s): %w", path, err)
		}
		return nil
	}
	if v4 {
		if err := set("/proc/sys/net/ipv4/ip_forward"); err != nil {
			return err
		}
	}
	if v6 {
		if err := set("/proc/sys/net/ipv6/conf/all/forwarding"); err != nil {
			return err
		}
	}
	return nil
}

// deleteLink removes a host veth (its peer and routes go with it); absent is fine.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}
