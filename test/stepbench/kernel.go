package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The kernel operations the scenarios time, each as the plugin does it (or
// would, for the pool). Functions named node* run on a thread in the node
// netns; the caller arranges that (e.node.Do).

func randomMAC() net.HardwareAddr {
	m := make(net.HardwareAddr, 6)
	_, _ = rand.Read(m)
	m[0] = (m[0] | 0x02) &^ 0x01
	return m
}

// vethBorn creates a pair with the peer born in the pod under its final
// name, as ADD does today.
func vethBorn(host, peer string, pod ns.NetNS) (int, error) {
	v := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: host, HardwareAddr: randomMAC()},
		PeerName:  peer, PeerHardwareAddr: randomMAC(),
		PeerNamespace: netlink.NsFd(int(pod.Fd())),
	}
	if err := netlink.LinkAdd(v); err != nil {
		return 0, err
	}
	l, err := netlink.LinkByName(host)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}

// vethNode creates a pair with both ends in the node, down: a pool entry.
func vethNode(host, peer string) (hostIdx, peerIdx int, err error) {
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: peer}
	if err := netlink.LinkAdd(v); err != nil {
		return 0, 0, err
	}
	h, err := netlink.LinkByName(host)
	if err != nil {
		return 0, 0, err
	}
	p, err := netlink.LinkByName(peer)
	if err != nil {
		return 0, 0, err
	}
	return h.Attrs().Index, p.Attrs().Index, nil
}

var tcxHooks = []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress}

func hookName(a ebpf.AttachType) string {
	if a == ebpf.AttachTCXIngress {
		return "ingress"
	}
	return "egress"
}

// attachTCX attaches prog to one hook and pins the link (the pin is then
// the link's only reference), as datapath.Attach does.
func attachTCX(prog *ebpf.Program, ifindex int, a ebpf.AttachType, pin string) error {
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: a})
	if err != nil {
		return err
	}
	defer l.Close()
	return l.Pin(pin)
}

func pinPath(dir, ifname string, a ebpf.AttachType) string {
	return filepath.Join(dir, ifname+"_"+hookName(a))
}

func unpin(dir, ifname string) error {
	var errs error
	for _, a := range tcxHooks {
		if err := os.Remove(pinPath(dir, ifname, a)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = errors.Join(errs, err)
		}
	}
	return errs
}

// attachTC is clsact + two direct-action cls_bpf filters (attachMode tc).
func attachTC(prog *ebpf.Program, ifindex int) error {
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscReplace(q); err != nil {
		return err
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		f := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: parent, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1},
			Fd:          prog.FD(), Name: "stepbench", DirectAction: true,
		}
		if err := netlink.FilterReplace(f); err != nil {
			return err
		}
	}
	return nil
}

func deleteClsact(ifindex int) error {
	return netlink.QdiscDel(&netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	})
}

// setLink is one RTM_SETLINK carrying every change at once (the kernel
// applies them under one RTNL hold): netns (fd >= 0), name, MAC, MTU, alias
// and up/down (up nil: unchanged).
type setLink struct {
	index int
	nsFd  int
	name  string
	mac   net.HardwareAddr
	mtu   int
	alias string
	up    *bool
}

func (s setLink) do() error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(s.index)
	if s.up != nil {
		msg.Change = unix.IFF_UP
		if *s.up {
			msg.Flags = unix.IFF_UP
		}
	}
	req.AddData(msg)
	if s.nsFd >= 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(s.nsFd))))
	}
	if s.name != "" {
		req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(s.name)))
	}
	if s.mac != nil {
		req.AddData(nl.NewRtAttr(unix.IFLA_ADDRESS, s.mac))
	}
	if s.mtu > 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(s.mtu))))
	}
	if s.alias != "" {
		req.AddData(nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(s.alias)))
	}
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

var (
	upTrue  = true
	upFalse = false
)

// podAddr is the address every scenario gives its pod (each pod is its own
// netns, and on the node the /32 route is per host veth).
func podAddr(i int) net.IP { return net.IPv4(10, 99, byte(i>>8), byte(i)).To4() }

var gw = net.IPv4(169, 254, 1, 1).To4()

// configurePod is the pod half of ADD's netlink work: address (no prefix
// route), up, a permanent neighbour for the gateway, an onlink default route
// in the interface's table and in main, a source rule.
func configurePod(pod ns.NetNS, ifname string, ip net.IP, hostMAC net.HardwareAddr) error {
	return pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		idx := l.Attrs().Index
		a := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}, Flags: unix.IFA_F_NOPREFIXROUTE}
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		n := &netlink.Neigh{LinkIndex: idx, IP: gw, HardwareAddr: hostMAC, State: netlink.NUD_PERMANENT, Family: netlink.FAMILY_V4}
		if err := netlink.NeighSet(n); err != nil {
			return err
		}
		table := 10000 + idx
		for _, t := range []int{table, 0} {
			r := &netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: gw,
				Flags: int(netlink.FLAG_ONLINK), Table: t}
			if err := netlink.RouteAdd(r); err != nil {
				return err
			}
		}
		rule := netlink.NewRule()
		rule.Src = &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}
		rule.Table, rule.Priority = table, 1000
		return netlink.RuleAdd(rule)
	})
}

// configureHost is the node half: alias, up, permanent neighbour and /32
// route to the pod.
func configureHost(ifindex int, ip net.IP, podMAC net.HardwareAddr, alias string) error {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return err
	}
	if alias != "" {
		if err := netlink.LinkSetAlias(l, alias); err != nil {
			return err
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return err
	}
	return configureHostRoutes(ifindex, ip, podMAC)
}

func configureHostRoutes(ifindex int, ip net.IP, podMAC net.HardwareAddr) error {
	n := &netlink.Neigh{LinkIndex: ifindex, IP: ip, HardwareAddr: podMAC, State: netlink.NUD_PERMANENT, Family: netlink.FAMILY_V4}
	if err := netlink.NeighSet(n); err != nil {
		return err
	}
	return netlink.RouteAdd(&netlink.Route{LinkIndex: ifindex, Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK})
}

func linkMAC(ifindex int) (net.HardwareAddr, error) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return nil, err
	}
	return l.Attrs().HardwareAddr, nil
}

func deleteLink(ifindex int) error {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return err
	}
	return netlink.LinkDel(l)
}

// peerMAC reads the MAC of the pod interface.
func peerMAC(pod ns.NetNS, ifname string) (net.HardwareAddr, error) {
	var mac net.HardwareAddr
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		mac = l.Attrs().HardwareAddr
		return nil
	})
	return mac, err
}

func errf(format string, a ...any) error { return fmt.Errorf(format, a...) }
