package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
)

// Node is the node family of the maps: the node's addresses and its
// uplinks' masquerade sources (cni_node_ips) and the node hooks' config
// (cni_hp_config: whether they are set up, by which build, the node's
// netns). The node hooks read them for hostPort, masquerade and policy
// alike, so none of them is hostPort's.
type Node struct{ m *Maps }

// Node returns the node family of m.
func (m *Maps) Node() Node { return Node{m} }

// NodeConfig is the node hooks' config, cni_hp_config's value.
type NodeConfig = mapsObjHpConfig

// IPs returns the addresses the programs take for the node's own.
func (n Node) IPs() (map[string]int, error) {
	out := make(map[string]int)
	err := scan(n.m.get(nameNodeIPs), func(k *EndpointKey, v *uint32) {
		if k.Family&nodeIPUplinkSrc == 0 {
			out[k.IP().String()] = int(*v)
		}
	})
	return out, err
}

// UplinkSources returns the masquerade source kept per uplink (ifindex)
// and family, for kernels without BPF_FIB_LOOKUP_SRC (masq.h uplink_source).
func (n Node) UplinkSources() (map[int][]net.IP, error) {
	words := map[EndpointKey]uint32{}
	if err := n.scanUplinkSources(words); err != nil {
		return nil, err
	}
	type fk struct {
		idx    int
		family uint8
	}
	addrs := map[fk][]byte{}
	for k, v := range words {
		f := fk{int(binary.NativeEndian.Uint32(k.Addr[:4])), k.Family &^ nodeIPUplinkSrc}
		if addrs[f] == nil {
			addrs[f] = make([]byte, map[bool]int{true: 4, false: 16}[f.family == 2])
		}
		if i := int(k.Addr[4]); 4*i+4 <= len(addrs[f]) {
			binary.NativeEndian.PutUint32(addrs[f][4*i:], v)
		}
	}
	out := map[int][]net.IP{}
	for f, a := range addrs {
		out[f.idx] = append(out[f.idx], net.IP(a))
	}
	return out, nil
}

func (n Node) scanUplinkSources(into map[EndpointKey]uint32) error {
	return scan(n.m.get(nameNodeIPs), func(k *EndpointKey, v *uint32) {
		if k.Family&nodeIPUplinkSrc != 0 {
			into[*k] = *v
		}
	})
}

// SyncUplinkSources makes cni_node_ips' uplink entries hold exactly want:
// per uplink ifindex, its address of each family masquerade takes where
// BPF_FIB_LOOKUP_SRC is missing. Kept on every node (a few entries), so a
// node moved to the fallback needs no refresh first.
func (n Node) SyncUplinkSources(want map[int][]net.IP) error {
	mp := n.m.get(nameNodeIPs)
	wantW := map[EndpointKey]uint32{}
	for idx, ips := range want {
		for _, ip := range ips {
			var k EndpointKey
			raw, fam := ip.To4(), uint8(2)
			if raw == nil {
				raw, fam = ip.To16(), 10
			}
			if raw == nil {
				continue
			}
			k.Family = fam | nodeIPUplinkSrc
			binary.NativeEndian.PutUint32(k.Addr[:4], uint32(idx))
			for i := 0; i < len(raw)/4; i++ {
				k.Addr[4] = uint8(i)
				// The program copies the value's bytes as they are.
				wantW[k] = binary.NativeEndian.Uint32(raw[4*i:])
			}
		}
	}
	have := map[EndpointKey]uint32{}
	if err := n.scanUplinkSources(have); err != nil {
		return fmt.Errorf("read %s: %w", nameNodeIPs, err)
	}
	for k, v := range wantW {
		if cur, ok := have[k]; ok && cur == v {
			continue
		}
		if err := mp.Put(&k, &v); err != nil {
			return writeErr(mp, nameNodeIPs, "uplink source address", err)
		}
	}
	for k := range have {
		if _, ok := wantW[k]; !ok {
			if err := mp.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete an uplink source from %s: %w", nameNodeIPs, err)
			}
		}
	}
	return nil
}

// SyncIPs makes cni_node_ips hold exactly want (address -> ifindex).
func (n Node) SyncIPs(want map[string]int) error {
	mp := n.m.get(nameNodeIPs)
	have, err := n.IPs()
	if err != nil {
		return fmt.Errorf("read %s: %w", nameNodeIPs, err)
	}
	for s, idx := range want {
		if cur, ok := have[s]; ok && cur == idx {
			continue
		}
		k, err := KeyFor(net.ParseIP(s))
		if err != nil {
			return err
		}
		v := uint32(idx)
		if err := mp.Put(&k, &v); err != nil {
			return writeErr(mp, nameNodeIPs, "node address "+s, err)
		}
	}
	marked := false
	for s := range have {
		if _, ok := want[s]; ok {
			continue
		}
		// Before the address goes: the mappings made until then are
		// checked against cni_node_ips from here on.
		if !marked {
			if err := n.m.markNodeIPsGone(); err != nil {
				return err
			}
			marked = true
		}
		k, err := KeyFor(net.ParseIP(s))
		if err != nil {
			continue
		}
		if err := mp.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete node address %s from %s: %w", s, nameNodeIPs, err)
		}
	}
	return nil
}

// Config reads the node's config (cni_hp_config): whether its hooks are
// set up, by which build, and its netns.
func (n Node) Config() (NodeConfig, error) {
	var c NodeConfig
	zero := uint32(0)
	err := n.m.get(nameHPConfig).Lookup(&zero, &c)
	return c, err
}

// Enabled tells whether the config says the node hooks are set up.
func (c NodeConfig) Enabled() bool { return c.Flags&hpConfigEnabled != 0 }

// FibNoSrc tells whether masquerade picks its source without
// BPF_FIB_LOOKUP_SRC (from the uplink sources, see SyncUplinkSources).
func (c NodeConfig) FibNoSrc() bool { return c.Flags&hpConfigFibNoSrc != 0 }

// Enable records the node's netns cookie and the build of its hooks, and
// turns the paths of the node hooks on (hostPort, masquerade, policy).
// fibNoSrc: masquerade picks its source without BPF_FIB_LOOKUP_SRC. The
// tunnel's bits (Tunnel().SetMode, Tunnel().SyncSelf) are kept, under the
// maps directory's lock that their writers take too, and so is
// HP_CFG_SF_NO_PARTS (SyncNoParts).
func (n Node) Enable(netnsCookie uint64, hooksID uint32, fibNoSrc bool) error {
	return n.m.updateNodeConfig(func(c *NodeConfig) {
		keep := c.Flags & (hpConfigTunnel | hpConfigTunSelf | hpConfigTunNoMAC | hpConfigSFNoParts)
		*c = NodeConfig{NetnsCookie: netnsCookie, Flags: hpConfigEnabled | keep, HooksId: hooksID}
		if fibNoSrc {
			c.Flags |= hpConfigFibNoSrc
		}
	})
}
