package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TunnelOptions are the cluster's tunnel mode as the agent applies it
// (docs/tunnel.md): the device, its MTU, and how routes reach other nodes.
type TunnelOptions struct {
	Mode   datapath.TunnelMode // off (host-gw), vxlan or geneve
	Hybrid bool                // direct routes to nodes on a subnet of this node, the tunnel to the others
	// NoMACCheck turns the uplinks' outer-MAC check of tunnel datagrams
	// off, for underlays whose genuine datagrams come from another MAC
	// than the next hop's (ECMP, VRRP): weaker (docs/tunnel.md).
	NoMACCheck bool
}

// UplinkMTU is the smallest MTU of the links holding a default route (the
// node's way to other subnets); 1500 when it has none.
func UplinkMTU() int {
	mtu := 0
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Dst: nil}, 0)
		if err != nil {
			continue
		}
		for _, r := range rs {
			if r.Dst != nil && !isDefault(r.Dst) {
				continue
			}
			l, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil || l.Attrs().Name == datapath.TunnelDevice {
				continue
			}
			if m := l.Attrs().MTU; m > 0 && (mtu == 0 || m < mtu) {
				mtu = m
			}
		}
	}
	if mtu == 0 {
		return 1500
	}
	return mtu
}

func isDefault(n *net.IPNet) bool { ones, _ := n.Mask.Size(); return ones == 0 }

// underlay6 tells whether the node reaches other nodes over IPv6 only (no
// IPv4 default route): the outer header is then 40 bytes.
func underlay6() bool {
	rs, err := netlinksafe.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{}, 0)
	if err != nil {
		return false
	}
	for _, r := range rs {
		if r.Dst == nil || isDefault(r.Dst) {
			return false
		}
	}
	return true
}

// PodMTU is the MTU pods get in this mode: the uplink's minus the
// encapsulation's overhead (the uplink's own with the tunnel off).
func (t TunnelOptions) PodMTU() int {
	return UplinkMTU() - datapath.TunnelOverhead(t.Mode, underlay6())
}

// ensure makes the node match the mode: the tunnel device with its
// programs (on), or none (off). It returns the routing the peer routes use.
func (t TunnelOptions) ensure(dp *datapath.Datapath, lg *log.Logger) (Routing, error) {
	rt := Routing{Mode: t.Mode, Hybrid: t.Hybrid, Maps: dp.Maps}
	if t.Mode == "" || t.Mode == datapath.TunnelOff {
		rt.Mode = datapath.TunnelOff
		if datapath.TunnelIfindex() != 0 {
			if err := datapath.RemoveTunnel(dp.PinRoot); err != nil {
				return rt, err
			}
			// No device, no judging link (its ifindex may come again).
			if err := dp.Maps.Policy().SyncAfterLinks(maps.AfterLinkTunnel, nil); err != nil {
				return rt, err
			}
			lg.Printf("tunnel: off; removed %s", datapath.TunnelDevice)
		}
		// Pods may send VXLAN again; no outer destination is checked.
		return rt, dp.Maps.Tunnel().SetMode(false, true)
	}
	mtu := UplinkMTU() - datapath.TunnelOverhead(t.Mode, underlay6())
	idx, err := dp.EnsureTunnel(t.Mode, mtu, !t.NoMACCheck)
	if err != nil {
		return rt, fmt.Errorf("tunnel %s: %w", t.Mode, err)
	}
	rt.Ifindex, rt.DeviceMTU = idx, mtu
	return rt, nil
}

// SyncTunnelPeers is `ebpf-agent peers` with a tunnel mode: the device,
// then the routes and tunnel maps, once.
func SyncTunnelPeers(dp *datapath.Datapath, t TunnelOptions, peers []Peer) (PeerRoutes, error) {
	rt, err := t.ensure(dp, log.New(io.Discard, "", 0))
	if err != nil {
		return nil, err
	}
	return SyncPeerRoutesWith(peers, rt)
}

// tunnelRouteMTU is the MTU a route into the tunnel toward endpoint gets:
// the path MTU the kernel learned to the endpoint (an ICMP "fragmentation
// needed" or "packet too big" about an encapsulated packet) less the
// overhead, locked, when it is below the device's; else 0 (the device's).
// Locked, because forwarding consults only a locked route MTU (IPv4
// without ip_forward_use_pmtu, IPv6 always), and the device's own
// learning of the inner path MTU is then not needed: the stack answers
// the pod with "fragmentation needed" or "packet too big" itself.
func tunnelRouteMTU(endpoint net.IP, tunnel, devMTU int) int {
	rs, err := netlink.RouteGet(endpoint)
	if err != nil || len(rs) == 0 || rs[0].LinkIndex == tunnel || rs[0].MTU == 0 {
		return 0
	}
	mtu := rs[0].MTU - datapath.TunnelOverhead(datapath.TunnelVXLAN, endpoint.To4() == nil)
	if devMTU > 0 && mtu >= devMTU {
		return 0
	}
	if mtu < 1280 && endpoint.To4() == nil {
		mtu = 1280
	}
	return mtu
}

// pmtuWatch follows the path MTU to every node the tunnel leads to, and
// sets it on the routes of their pod CIDRs (tunnelRouteMTU) within a tick
// of the kernel learning it, and back when it expires.
type pmtuWatch struct {
	m     *maps.Maps
	every time.Duration
	lg    *log.Logger
}

func (w *pmtuWatch) Run(ctx context.Context) error {
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := RefreshTunnelMTU(w.m, w.lg); err != nil {
			w.lg.Printf("tunnel path MTU: %v", err)
		}
		// The same tick keeps the next hops toward the nodes resolved
		// (a route to a node may change) and drops those toward none:
		// tunnelhops.go.
		if addrs, err := w.m.Tunnel().NodeAddrs(); err != nil {
			w.lg.Printf("tunnel next hops: %v", err)
		} else if err := SyncTunnelHops(addrs); err != nil {
			w.lg.Printf("tunnel next hops: %v", err)
		}
	}
}

// RefreshTunnelMTU sets the path MTU on every route into the tunnel device
// (its node from cni_tun_cidrs).
func RefreshTunnelMTU(m *maps.Maps, lg *log.Logger) error {
	tun, err := netlinksafe.LinkByName(datapath.TunnelDevice)
	if err != nil {
		return nil // no tunnel (yet)
	}
	idx, devMTU := tun.Attrs().Index, tun.Attrs().MTU
	trs, err := m.Tunnel().Routes()
	if err != nil {
		return err
	}
	endpoint := map[string]net.IP{}
	for _, r := range trs {
		endpoint[r.PodCIDR.String()] = net.IP(r.Endpoint.AsSlice())
	}
	// The pods' routes to other nodes' addresses follow the cluster CIDRs
	// ADD writes, and take the same path MTU (tunnelnodes.go).
	errs := SyncTunnelNodeRoutes(m, idx, devMTU, false)
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Protocol: RouteProtocol, LinkIndex: idx},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_OIF)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		for _, r := range rs {
			ep := endpoint[r.Dst.String()]
			if r.Dst == nil || ep == nil {
				continue
			}
			want := tunnelRouteMTU(ep, idx, devMTU)
			if r.MTU == want && r.MTULock == (want != 0) {
				continue
			}
			nr := tunnelRoute(r.Dst, ep, idx)
			nr.Src, nr.MTU, nr.MTULock = r.Src, want, want != 0
			if err := netlink.RouteReplace(&nr); err != nil {
				errs = errors.Join(errs, fmt.Errorf("route %s: path MTU %d: %w", r.Dst, want, err))
				continue
			}
			lg.Printf("tunnel: route %s to %s: path MTU %d (0: the device's %d)", r.Dst, ep, want, devMTU)
		}
	}
	return errs
}
