package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
)

// RouteProtocol marks the routes the agent installs to other nodes' pod
// CIDRs (rtnetlink protocol number; `ip route show proto 199`), so it can
// remove the ones whose peer is gone without touching anyone else's.
const RouteProtocol netlink.RouteProtocol = 199

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
// exactly one per pod CIDR of every peer (host-gw: "podCIDR via nodeIP" of
// the CIDR's family; the node IP must be on a link of this node): it
// replaces what changed and removes routes of peers no longer listed.
// Peers one of whose node IPs is an address of this node are this node
// itself and skipped. Returns the routes wanted.
func SyncPeerRoutes(peers []Peer) (PeerRoutes, error) {
	local := map[string]bool{}
	if addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL); err == nil {
		for _, a := range addrs {
			local[a.IP.String()] = true
		}
	}
	want := map[string]netlink.Route{}
	var out PeerRoutes
	var errs error
peers:
	for _, p := range peers {
		var gws []net.IP
		for _, a := range p.ips() {
			gw := net.ParseIP(a)
			if gw == nil {
				errs = errors.Join(errs, fmt.Errorf("peer %s: %q is not an IP address", p.name(), a))
				continue
			}
			if local[gw.String()] {
				continue peers
			}
			gws = append(gws, gw)
		}
		for _, c := range p.PodCIDRs {
			_, dst, err := net.ParseCIDR(c)
			if err != nil {
				errs = errors.Join(errs, fmt.Errorf("peer %s: podCIDR %q: %w", p.name(), c, err))
				continue
			}
			var gw net.IP
			for _, g := range gws {
				if (g.To4() == nil) == (dst.IP.To4() == nil) {
					gw = g
					break
				}
			}
			if gw == nil {
				errs = errors.Join(errs, fmt.Errorf("peer %s: no node IP of podCIDR %s's family", p.name(), c))
				continue
			}
			if o, dup := want[dst.String()]; dup && !o.Gw.Equal(gw) {
				errs = errors.Join(errs, fmt.Errorf("podCIDR %s: claimed by peers %s and %s; routed via %s", dst, o.Gw, gw, o.Gw))
				continue
			}
			want[dst.String()] = netlink.Route{Dst: dst, Gw: gw, Protocol: RouteProtocol}
		}
	}
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
		if f, ok := foreign[r.Dst.String()]; ok {
			errs = errors.Join(errs, fmt.Errorf("route %s via %s: a route to %s of protocol %s exists (not the agent's %d): left alone", r.Dst, r.Gw, r.Dst, f.Protocol, RouteProtocol))
			continue
		}
		if err := netlink.RouteReplace(&r); err != nil {
			errs = errors.Join(errs, fmt.Errorf("route %s via %s: %w", r.Dst, r.Gw, err))
			continue
		}
		out = append(out, PeerRoute{Dst: r.Dst.String(), Via: r.Gw.String()})
	}
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

// peerRoutes keeps the routes of Options.PeersFile: at start and every
// Options.ReconcileInterval (the file is re-read each time).
type peerRoutes struct {
	file     string
	interval time.Duration
	lg       *log.Logger
}

func (p *peerRoutes) sync() {
	ps, err := LoadPeers(p.file)
	if err == nil {
		var rs []PeerRoute
		rs, err = SyncPeerRoutes(ps)
		if err == nil {
			p.lg.Printf("peer routes: %d", len(rs))
		}
	}
	if err != nil {
		p.lg.Printf("peer routes: %v", err)
	}
}

// Run returns when ctx ends.
func (p *peerRoutes) Run(ctx context.Context) error {
	p.sync()
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			p.sync()
		}
	}
}
