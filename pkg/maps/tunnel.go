package maps

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
)

// The node tunnel's maps (bpf/lib/tunnel.h): who may send through the
// tunnel, and where each other node's pod CIDRs are encapsulated to.
var (
	nameTunNodes = mapName(&specNames.CniTunNodes)
	nameTunCIDRs = mapName(&specNames.CniTunCidrs)
	nameTunSelf  = mapName(&specNames.CniTunSelf)
	nameTunHops  = mapName(&specNames.CniTunHops) // optional within layout 5; the programs' own (bpf/lib/tunnel.h)
)

// Tunnel is the tunnel family of the maps: the nodes that may send through
// the tunnel (cni_tun_nodes) and the other nodes' pod CIDRs with the address
// each is encapsulated to (cni_tun_cidrs).
type Tunnel struct{ m *Maps }

// Tunnel returns the tunnel family of m.
func (m *Maps) Tunnel() Tunnel { return Tunnel{m} }

// TunnelPeer is the generated twin of struct tun_peer.
type TunnelPeer = mapsObjTunPeer

// tunPeerEncap is TUN_PEER_ENCAP: the CIDR is routed into the tunnel, so
// from_uplink drops its addresses as sources in the clear.
const tunPeerEncap = 1

// TunnelNode is another node as the tunnel sees it: its addresses (each
// may send encapsulated packets), the address its pods' traffic is
// encapsulated to, and its pod CIDRs, of which Direct are routed to it
// directly (hybrid mode: its pods' packets arrive in the clear); the
// others only ever arrive through the tunnel.
type TunnelNode struct {
	Addrs    []netip.Addr
	Endpoint netip.Addr
	PodCIDRs []netip.Prefix
	Direct   []netip.Prefix
}

func addrEndpointKey(a netip.Addr) EndpointKey {
	k, _ := KeyFor(net.IP(a.Unmap().AsSlice()))
	return k
}

// Sync makes cni_tun_nodes and cni_tun_cidrs hold exactly the given
// nodes (ids 1..n in order): entries are written before stale ones go, so
// a node that stays is never missing in between. A full map is an error
// wrapping ErrFull naming it.
func (tn Tunnel) Sync(nodes []TunnelNode) error {
	nodesMap, cidrsMap := tn.m.get(nameTunNodes), tn.m.get(nameTunCIDRs)
	if nodesMap == nil || cidrsMap == nil {
		return fmt.Errorf("the pinned maps lack %s or %s (an older layout)", nameTunNodes, nameTunCIDRs)
	}
	wantNodes := map[EndpointKey]uint32{}
	wantCIDRs := map[CIDRKey]TunnelPeer{}
	var errs error
	for i, n := range nodes {
		id := uint32(i + 1)
		for _, a := range n.Addrs {
			wantNodes[addrEndpointKey(a)] = id
		}
		ep := n.Endpoint.Unmap()
		v := TunnelPeer{Node: id, Family: afInet}
		if ep.Is6() {
			v.Family = afInet6
			b := ep.As16()
			copy(v.Addr[:], b[:])
		} else {
			b := ep.As4()
			copy(v.Addr[:], b[:])
		}
		direct := map[netip.Prefix]bool{}
		for _, c := range n.Direct {
			direct[c.Masked()] = true
		}
		for _, c := range n.PodCIDRs {
			cv := v
			if !direct[c.Masked()] {
				cv.Flags |= tunPeerEncap
			}
			wantCIDRs[cidrKey(c)] = cv
		}
	}
	for k, v := range wantNodes {
		if err := nodesMap.Update(&k, &v, ebpf.UpdateAny); err != nil {
			errs = errors.Join(errs, writeErr(nodesMap, nameTunNodes, "a node address", err))
		}
	}
	for k, v := range wantCIDRs {
		if err := cidrsMap.Update(&k, &v, ebpf.UpdateAny); err != nil {
			errs = errors.Join(errs, writeErr(cidrsMap, nameTunCIDRs, k.prefix().String(), err))
		}
	}
	var staleNodes []EndpointKey
	if err := scan(nodesMap, func(k *EndpointKey, _ *uint32) {
		if _, ok := wantNodes[*k]; !ok {
			staleNodes = append(staleNodes, *k)
		}
	}); err != nil {
		errs = errors.Join(errs, fmt.Errorf("read %s: %w", nameTunNodes, err))
	}
	for _, k := range staleNodes {
		if err := nodesMap.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = errors.Join(errs, fmt.Errorf("delete from %s: %w", nameTunNodes, err))
		}
	}
	// An LPM trie has no batch ops: iterate.
	var (
		k      CIDRKey
		v      TunnelPeer
		stale  []CIDRKey
		cursor = cidrsMap.Iterate()
	)
	for cursor.Next(&k, &v) {
		if _, ok := wantCIDRs[k]; !ok {
			stale = append(stale, k)
		}
	}
	if err := cursor.Err(); err != nil {
		errs = errors.Join(errs, fmt.Errorf("read %s: %w", nameTunCIDRs, err))
	}
	for _, k := range stale {
		if err := cidrsMap.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = errors.Join(errs, fmt.Errorf("delete from %s: %w", nameTunCIDRs, err))
		}
	}
	return errs
}

// TunnelRoute is one entry of cni_tun_cidrs, decoded.
type TunnelRoute struct {
	PodCIDR  netip.Prefix
	Node     uint32
	Endpoint netip.Addr
	Direct   bool // routed directly (hybrid), not into the tunnel
}

// Routes lists cni_tun_cidrs.
func (tn Tunnel) Routes() ([]TunnelRoute, error) {
	var (
		k   CIDRKey
		v   TunnelPeer
		out []TunnelRoute
	)
	it := tn.m.get(nameTunCIDRs).Iterate()
	for it.Next(&k, &v) {
		ep := netip.AddrFrom16(v.Addr)
		if v.Family == afInet {
			ep = netip.AddrFrom4([4]byte(v.Addr[:4]))
		}
		out = append(out, TunnelRoute{PodCIDR: k.prefix(), Node: v.Node, Endpoint: ep, Direct: v.Flags&tunPeerEncap == 0})
	}
	return out, it.Err()
}

// Nodes lists cni_tun_nodes: every other node's address, with its id.
func (tn Tunnel) Nodes() (map[netip.Addr]uint32, error) {
	out := map[netip.Addr]uint32{}
	err := scan(tn.m.get(nameTunNodes), func(k *EndpointKey, v *uint32) {
		if a, ok := netip.AddrFromSlice(k.IP()); ok {
			out[a.Unmap()] = *v
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", nameTunNodes, err)
	}
	return out, nil
}

// NodeAddrs lists the node addresses of cni_tun_nodes (every address
// another node may send encapsulated packets from).
func (tn Tunnel) NodeAddrs() ([]net.IP, error) {
	var out []net.IP
	err := scan(tn.m.get(nameTunNodes), func(k *EndpointKey, _ *uint32) { out = append(out, k.IP()) })
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", nameTunNodes, err)
	}
	return out, nil
}

// Tunnel reports the tunnel's bits of the node config: whether the tunnel
// is on (pods' tunnel datagrams never leave with a node address), whether
// cni_tun_self is in force, and whether the outer-MAC check is on.
func (c NodeConfig) Tunnel() (on, self, macCheck bool) {
	return c.Flags&hpConfigTunnel != 0, c.Flags&hpConfigTunSelf != 0, c.Flags&hpConfigTunNoMAC == 0
}

// setConfigFlags sets (on) or clears bits of cni_hp_config's flags, the
// rest of the value as it is, under the maps directory's lock: the node
// hooks' Enable (an ADD's) rewrites the same value, and a write made from
// a stale read undid the other's (the hooks turned off, or the tunnel's
// bits lost).
func (m *Maps) setConfigFlags(bits uint32, on bool) error {
	return m.updateNodeConfig(func(c *NodeConfig) {
		c.Flags &^= bits
		if on {
			c.Flags |= bits
		}
	})
}

// updateNodeConfig reads cni_hp_config, lets f change it and writes it back
// when it changed, under the maps directory's lock.
func (m *Maps) updateNodeConfig(f func(*NodeConfig)) error {
	unlock, err := m.lock()
	if err != nil {
		return err
	}
	defer unlock()
	mp := m.get(nameHPConfig)
	zero := uint32(0)
	var old NodeConfig
	if err := mp.Lookup(&zero, &old); err != nil {
		return fmt.Errorf("read %s: %w", nameHPConfig, err)
	}
	c := old
	f(&c)
	if c == old {
		return nil
	}
	if err := mp.Put(&zero, &c); err != nil {
		return fmt.Errorf("write %s: %w", nameHPConfig, err)
	}
	return nil
}

// SetMode records whether the node tunnel is on (HP_CFG_TUNNEL): then
// to_uplink drops a pod's tunnel datagram that leaves with a node address,
// whatever its destination (docs/tunnel.md). macCheck false turns the
// uplinks' outer-MAC check off (HP_CFG_TUN_NO_MAC). Off clears
// cni_tun_self too, and turns the MAC check back on.
func (t Tunnel) SetMode(on, macCheck bool) error {
	m := t.m
	if on {
		return errors.Join(m.setConfigFlags(hpConfigTunnel, true), m.setConfigFlags(hpConfigTunNoMAC, !macCheck))
	}
	return errors.Join(m.setConfigFlags(hpConfigTunnel|hpConfigTunNoMAC, false), t.SyncSelf(nil))
}

// SyncSelf makes cni_tun_self hold exactly addrs, the addresses this
// node is known by, and puts it in force (HP_CFG_TUN_SELF): the tunnel
// device then drops what was sent to any other address of the node. None,
// or a write that fails (more than 16), takes it out of force (the device
// accepts any destination). A
// pin set without the map (an older build of the layout) is left alone.
func (t Tunnel) SyncSelf(addrs []netip.Addr) error {
	m := t.m
	mp := m.get(nameTunSelf)
	if mp == nil {
		return nil
	}
	if len(addrs) == 0 {
		if err := m.setConfigFlags(hpConfigTunSelf, false); err != nil {
			return err
		}
	}
	want := map[EndpointKey]bool{}
	for _, a := range addrs {
		want[addrEndpointKey(a)] = true
	}
	// The stale ones go first: with the map full (MAX_TUN_SELF), a new
	// address written before them was refused and took the check out of
	// force.
	var errs error
	var stale []EndpointKey
	if err := scan(mp, func(k *EndpointKey, _ *uint32) {
		if !want[*k] {
			stale = append(stale, *k)
		}
	}); err != nil {
		errs = errors.Join(errs, fmt.Errorf("read %s: %w", nameTunSelf, err))
	}
	for _, k := range stale {
		if err := mp.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = errors.Join(errs, fmt.Errorf("delete from %s: %w", nameTunSelf, err))
		}
	}
	for _, a := range addrs {
		k := addrEndpointKey(a)
		v := uint32(1)
		if err := mp.Update(&k, &v, ebpf.UpdateAny); err != nil {
			errs = errors.Join(errs, writeErr(mp, nameTunSelf, "this node's address "+a.String(), err))
		}
	}
	if errs != nil {
		// Not all written: out of force rather than drop a genuine node's
		// datagram (the sending node's check still holds).
		return errors.Join(errs, m.setConfigFlags(hpConfigTunSelf, false))
	}
	if len(addrs) == 0 {
		return nil
	}
	return m.setConfigFlags(hpConfigTunSelf, true)
}
