package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
)

// RouteProtocol marks the routes the agent installs to other nodes' pod
// CIDRs (rtnetlink protocol number; `ip route show proto 199`), so it can
// remove the ones whose peer is gone without touching anyone else's.
const RouteProtocol netlink.RouteProtocol = 199

// Peer is another node: its address and the pod CIDRs behind it. In
// Kubernetes, one Peer per Node object: NodeIP from .status.addresses
// (InternalIP), PodCIDRs from .spec.podCIDRs.
type Peer struct {
	NodeIP   string   `json:"nodeIP"`
	PodCIDRs []string `json:"podCIDRs"`
}

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
		if _, err := netip.ParseAddr(p.NodeIP); err != nil {
			return nil, fmt.Errorf("%s: [%d].nodeIP: %q is not an IP address", path, i, p.NodeIP)
		}
		for j, c := range p.PodCIDRs {
			if _, err := netip.ParsePrefix(c); err != nil {
				return nil, fmt.Errorf("%s: [%d].podCIDRs[%d]: %q is not a CIDR", path, i, j, c)
			}
		}
	}
	return ps, nil
}

// PeerRoute is one route to another node's pod CIDR.
type PeerRoute struct {
	Dst string `json:"dst"`
	Via string `json:"via"`
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
		t.Lines = append(t.Lines, r.Dst+" via "+r.Via)
	}
	return []inspect.Table{t}
}

// SyncPeerRoutes makes the routes of RouteProtocol in the current netns
// exactly one per pod CIDR of every peer (host-gw: "podCIDR via nodeIP",
// the node IP must be on a link of this node): it replaces what changed and
// removes routes of peers no longer listed. Peers whose nodeIP is an
// address of this node are this node itself and skipped. Returns the routes
// wanted.
func SyncPeerRoutes(peers []Peer) (PeerRoutes, error) {
	local := map[string]bool{}
	if addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL); err == nil {
		for _, a := range addrs {
			local[a.IP.String()] = true
		}
	}
	want := map[string]netlink.Route{}
	var out PeerRoutes
	var errs error
	for _, p := range peers {
		gw := net.ParseIP(p.NodeIP)
		if gw == nil || local[gw.String()] {
			continue
		}
		for _, c := range p.PodCIDRs {
			_, dst, err := net.ParseCIDR(c)
			if err != nil {
				errs = errors.Join(errs, fmt.Errorf("peer %s: podCIDR %q: %w", p.NodeIP, c, err))
				continue
			}
			if (dst.IP.To4() == nil) != (gw.To4() == nil) {
				errs = errors.Join(errs, fmt.Errorf("peer %s: podCIDR %s is of another family than the node IP", p.NodeIP, c))
				continue
			}
			r := netlink.Route{Dst: dst, Gw: gw, Protocol: RouteProtocol}
			want[dst.String()] = r
		}
	}
	for _, r := range want {
		r := r
		if err := netlink.RouteReplace(&r); err != nil {
			errs = errors.Join(errs, fmt.Errorf("route %s via %s: %w", r.Dst, r.Gw, err))
			continue
		}
		out = append(out, PeerRoute{Dst: r.Dst.String(), Via: r.Gw.String()})
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		have, err := netlink.RouteListFiltered(fam, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		for _, r := range have {
			if r.Dst == nil {
				continue
			}
			if w, ok := want[r.Dst.String()]; ok && w.Gw.Equal(r.Gw) {
				continue
			}
			if err := netlink.RouteDel(&r); err != nil {
				errs = errors.Join(errs, fmt.Errorf("remove route %s: %w", r.Dst, err))
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dst < out[j].Dst })
	return out, errs
}
