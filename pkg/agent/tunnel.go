package agent

import (
	"fmt"
	"io"
	"log"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// TunnelOptions are the cluster's tunnel mode as the agent applies it
// (docs/tunnel.md): the device, its MTU, and how routes reach other nodes.
type TunnelOptions struct {
	Mode   datapath.TunnelMode // off (host-gw), vxlan or geneve
	Hybrid bool                // direct routes to nodes on a subnet of this node, the tunnel to the others
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
			lg.Printf("tunnel: off; removed %s", datapath.TunnelDevice)
		}
		return rt, nil
	}
	mtu := UplinkMTU() - datapath.TunnelOverhead(t.Mode, underlay6())
	idx, err := dp.EnsureTunnel(t.Mode, mtu)
	if err != nil {
		return rt, fmt.Errorf("tunnel %s: %w", t.Mode, err)
	}
	rt.Ifindex = idx
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
