package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/linkconf"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TunnelDevice is the node's one tunnel device (docs/tunnel.md): a
// collect_md ("external") VXLAN or Geneve device whose programs pick the
// remote node of every packet (bpf/lib/tunnel.h).
const TunnelDevice = "ebpf-tun"

// TunnelMode is how pods reach other nodes' pods.
type TunnelMode string

const (
	TunnelOff    TunnelMode = "off"    // host-gw routes only: every node on one L2 segment
	TunnelVXLAN  TunnelMode = "vxlan"  // VXLAN, UDP 4789
	TunnelGeneve TunnelMode = "geneve" // Geneve, UDP 6081
)

// The IANA ports.
const (
	VXLANPort  = 4789
	GenevePort = 6081
)

// ParseTunnelMode reads a mode ("" is off).
func ParseTunnelMode(s string) (TunnelMode, error) {
	switch m := TunnelMode(strings.ToLower(strings.TrimSpace(s))); m {
	case "", TunnelOff:
		return TunnelOff, nil
	case TunnelVXLAN, TunnelGeneve:
		return m, nil
	}
	return "", fmt.Errorf("tunnel mode %q: want off, vxlan or geneve", s)
}

// TunnelOverhead is what encapsulation adds to every packet: the outer IP
// header (20 bytes; 40 over IPv6), UDP (8), the VXLAN or option-less
// Geneve header (8) and the inner Ethernet header (14).
func TunnelOverhead(m TunnelMode, underlay6 bool) int {
	if m == TunnelOff || m == "" {
		return 0
	}
	if underlay6 {
		return 70
	}
	return 50
}

// EnsureTunnel makes the node's tunnel device exist in the current netns
// as mode says, with mtu (the uplink's minus TunnelOverhead), up and
// without ARP (the programs address every packet; the stack resolves
// nothing on it), and runs this build's tunnel programs on it (tcx links
// pinned under node/, swapped in place by Upgrade). It returns the
// device's ifindex. macCheck false turns the uplinks' outer-MAC check of
// tunnel datagrams off (docs/tunnel.md). Idempotent; under the pin
// directory's lock.
func (dp *Datapath) EnsureTunnel(mode TunnelMode, mtu int, macCheck bool) (int, error) {
	if mode == TunnelOff {
		return 0, errors.New("EnsureTunnel: tunnel mode off")
	}
	if err := haveTCX(); err != nil {
		return 0, fmt.Errorf("tunnel mode %s needs tcx on the tunnel device (Linux 6.6): %w", mode, err)
	}
	unlock, err := lockDir(dp.PinRoot)
	if err != nil {
		return 0, err
	}
	defer unlock()
	l, err := ensureTunnelDevice(mode, mtu)
	if err != nil {
		return 0, err
	}
	idx := l.Attrs().Index
	progs, err := loadPrograms(dp.PinRoot, dp.Maps, tunnelHookPrograms(), loadMissing)
	if err != nil {
		return 0, err
	}
	defer closePrograms(progs)
	for _, p := range tunnelHookPrograms() {
		if err := ensureUplinkHook(dp.PinRoot, p, progs[p.Name], TunnelDevice, idx); err != nil {
			return 0, fmt.Errorf("tunnel device %s: %w", TunnelDevice, err)
		}
	}
	// Its egress program runs: pods' denied egress may be deferred to it.
	if err := dp.Maps.Policy().SyncAfterLinks(maps.AfterLinkTunnel, []int{idx}); err != nil {
		return 0, fmt.Errorf("tunnel device %s: %w", TunnelDevice, err)
	}
	// Under the lock, as Enable writes the same value: from now on no
	// pod's tunnel datagram leaves with a node address (to_uplink).
	if err := dp.Maps.Tunnel().SetMode(true, macCheck); err != nil {
		return 0, fmt.Errorf("tunnel device %s: %w", TunnelDevice, err)
	}
	return idx, nil
}

// ensureTunnelDevice creates the device, or re-creates one of another
// kind or port; it sets the MTU, switches ARP off and brings it up.
func ensureTunnelDevice(mode TunnelMode, mtu int) (netlink.Link, error) {
	var want netlink.Link
	attrs := netlink.LinkAttrs{Name: TunnelDevice, MTU: mtu}
	switch mode {
	case TunnelVXLAN:
		want = &netlink.Vxlan{LinkAttrs: attrs, FlowBased: true, Port: VXLANPort, Learning: false}
	case TunnelGeneve:
		want = &netlink.Geneve{LinkAttrs: attrs, FlowBased: true, Dport: GenevePort}
	default:
		return nil, fmt.Errorf("tunnel mode %q: want vxlan or geneve", mode)
	}
	l, err := netlinksafe.LinkByName(TunnelDevice)
	if err == nil && !sameTunnel(l, want) {
		if err := netlink.LinkDel(l); err != nil {
			return nil, fmt.Errorf("replace tunnel device %s (a %s): %w", TunnelDevice, l.Type(), err)
		}
		err = netlink.LinkNotFoundError{}
	}
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		if err := netlink.LinkAdd(want); err != nil {
			if mode == TunnelGeneve && (errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "not supported")) {
				return nil, fmt.Errorf("create tunnel device %s: the kernel has no geneve device (module geneve): %w", TunnelDevice, err)
			}
			return nil, fmt.Errorf("create %s tunnel device %s: %w", mode, TunnelDevice, err)
		}
		if l, err = netlinksafe.LinkByName(TunnelDevice); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if mtu > 0 && l.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(l, mtu); err != nil {
			return nil, fmt.Errorf("tunnel device %s: set MTU %d: %w", TunnelDevice, mtu, err)
		}
	}
	if l.Attrs().RawFlags&0x80 == 0 { // IFF_NOARP
		if err := netlink.LinkSetARPOff(l); err != nil {
			return nil, fmt.Errorf("tunnel device %s: arp off: %w", TunnelDevice, err)
		}
	}
	// Loose reverse-path filtering on the device: what comes out of it with
	// a node's address as source (that node's own packets to this node's
	// pods, its pods' replies to this node as a NodePort client, which
	// conntrack gives back the node's address) has its route on the
	// uplink, and a node with strict rp_filter (=1; the kernel takes the
	// larger of "all" and the device's) dropped it. The trust rule on the
	// device (cni_from_tunnel: the outer source a node, the inner one that
	// node's) is the stronger check. Once per device, not per pod.
	if err := setTunnelRPFilter(l.Attrs().Index); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("tunnel device %s: up: %w", TunnelDevice, err)
	}
	return l, nil
}

func sameTunnel(have, want netlink.Link) bool {
	switch w := want.(type) {
	case *netlink.Vxlan:
		h, ok := have.(*netlink.Vxlan)
		return ok && h.FlowBased && h.Port == w.Port
	case *netlink.Geneve:
		h, ok := have.(*netlink.Geneve)
		return ok && h.FlowBased && h.Dport == w.Dport
	}
	return false
}

// TunnelIfindex is the tunnel device's ifindex, 0 when there is none.
func TunnelIfindex() int {
	l, err := netlinksafe.LinkByName(TunnelDevice)
	if err != nil {
		return 0
	}
	return l.Attrs().Index
}

// RemoveTunnel deletes the tunnel device and its link pins (tunnel mode
// off, uninstall). Idempotent.
func RemoveTunnel(pinRoot string) error {
	var errs error
	if l, err := netlinksafe.LinkByName(TunnelDevice); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = errors.Join(errs, fmt.Errorf("delete tunnel device %s: %w", TunnelDevice, err))
		}
	}
	for _, p := range tunnelHookPrograms() {
		path := filepath.Join(pinRoot, nodeDir, p.Link+TunnelDevice)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = errors.Join(errs, err)
		}
	}
	return errs
}

// setTunnelRPFilter makes the device's reverse-path check loose (see
// ensureTunnelDevice), by netlink: the agent's container has /proc/sys
// read-only (the Kubernetes run failed so).
func setTunnelRPFilter(ifindex int) error {
	if err := linkconf.SetIPv4(ifindex, linkconf.RPFilter, 2); err != nil {
		return fmt.Errorf("tunnel device %s: loose reverse-path filter (rp_filter 2): %w", TunnelDevice, err)
	}
	return nil
}
