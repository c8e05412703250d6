package cni

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

func checkError(format string, a ...any) error {
	return types.NewError(types.ErrInternal, fmt.Sprintf(format, a...), "")
}

// Check is the CNI CHECK verb: the interfaces, addresses, routes, attached
// programs and map entries must match prevResult. The error names the first
// thing that does not.
func Check(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if conf.IPAM.Type == "" {
		return confError("ipam: missing")
	}
	if err := validateRuntimeConfig(conf); err != nil {
		return err
	}
	prev, err := conf.prevResult()
	if err != nil {
		return err
	}
	if err := ipam.ExecCheck(conf.IPAM.Type, args.StdinData); err != nil {
		return ipamError(conf.IPAM.Type, err)
	}
	netns, err := openNetns(args.Netns)
	if err != nil {
		return err
	}
	defer netns.Close()

	var podIf *current.Interface
	for _, i := range prev.Interfaces {
		if i.Name == args.IfName && i.Sandbox != "" {
			podIf = i
		}
	}
	if podIf == nil {
		return checkError("prevResult has no interface %s in a sandbox", args.IfName)
	}

	if err := checkDirs(conf); err != nil {
		return err
	}
	rec, _ := readRecord(conf.StateDir, conf.Name, args.ContainerID, args.IfName)
	hostIf := HostIfName(args.ContainerID, args.IfName)
	host, err := netlink.LinkByName(hostIf)
	if err != nil {
		return checkError("host veth %s: %v", hostIf, err)
	}
	ifindex := host.Attrs().Index
	if host.Attrs().Flags&net.FlagUp == 0 {
		return checkError("host veth %s is down: the pod is cut off", hostIf)
	}
	if conf.MTU != 0 && host.Attrs().MTU != conf.MTU {
		return checkError("host veth %s has MTU %d, the network's mtu is %d", hostIf, host.Attrs().MTU, conf.MTU)
	}
	for _, ipc := range prev.IPs {
		if err := checkHostRoute(ipc.Address.IP, ifindex, hostIf); err != nil {
			return err
		}
	}

	dp, err := datapath.Open(conf.PinDir)
	if err != nil {
		return types.NewError(errPluginNotAvailable, fmt.Sprintf("datapath at %s: %v", conf.PinDir, err), "")
	}
	defer dp.Close()
	if err := dp.Attached(ifindex, hostIf); err != nil {
		return checkError("%v", err)
	}
	li, err := dp.Maps.LookupLink(ifindex)
	if err != nil {
		return checkError("map cni_links has no entry for %s (ifindex %d): %v", hostIf, ifindex, notExist(err))
	}
	mapMAC := net.HardwareAddr(li.Mac[:]).String()
	lim, _ := parseBandwidth(conf.RuntimeConfig.Bandwidth)
	if err := lim.checkQueue(dp.Maps, host); err != nil {
		return checkError("%v", err)
	}
	if err := lim.check(dp.Maps, ifindex, hostIf); err != nil {
		return checkError("%v", err)
	}
	for _, ipc := range prev.IPs {
		a := ipc.Address.IP
		e, err := dp.Maps.LookupEndpoint(a)
		if err != nil {
			return checkError("map cni_endpoints has no entry for %s: %v", a, notExist(err))
		}
		if int(e.Ifindex) != ifindex {
			return checkError("map cni_endpoints sends %s to ifindex %d, not %s (%d)", a, e.Ifindex, hostIf, ifindex)
		}
	}

	if len(conf.portMappings) > 0 {
		var ips []net.IP
		for _, ipc := range prev.IPs {
			ips = append(ips, ipc.Address.IP)
		}
		hps, err := planHostPorts(conf.portMappings, ips, ifindex)
		if err != nil {
			return err
		}
		for _, h := range hps {
			got, err := dp.Maps.LookupHostPort(h)
			if err != nil {
				return checkError("map cni_hostports has no entry for %s: %v", h.Listen(), notExist(err))
			}
			if !got.PodIP.Equal(h.PodIP) || got.PodPort != h.PodPort || got.Ifindex != ifindex {
				return checkError("map cni_hostports sends %s to %s:%d (ifindex %d), not this pod (%s:%d, ifindex %d)",
					h.Listen(), got.PodIP, got.PodPort, got.Ifindex, h.PodIP, h.PodPort, ifindex)
			}
		}
		for _, ip := range ips {
			if e, err := dp.Maps.LookupEndpoint(ip); err == nil && e.Flags&maps.EndpointFlagHostPort == 0 {
				return checkError("map cni_endpoints entry of %s lacks the hostPort flag", ip)
			}
		}
		if err := dp.CheckHostPorts(hostPortOptions(conf)); err != nil {
			return checkError("hostPort hooks: %v", err)
		}
	}

	return netns.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(args.IfName)
		if err != nil {
			return checkError("interface %s in %s: %v", args.IfName, args.Netns, err)
		}
		a := l.Attrs()
		if a.HardwareAddr.String() != mapMAC {
			return checkError("interface %s has MAC %s, the datapath delivers to %s (cni_links of %s): the pod has not sent from its new MAC yet",
				args.IfName, a.HardwareAddr, mapMAC, hostIf)
		}
		if podIf.Mac != "" && a.HardwareAddr.String() != podIf.Mac {
			return checkError("interface %s has MAC %s, prevResult says %s", args.IfName, a.HardwareAddr, podIf.Mac)
		}
		if a.Flags&net.FlagUp == 0 {
			return checkError("interface %s in %s is down", args.IfName, args.Netns)
		}
		if a.MTU != host.Attrs().MTU {
			return checkError("interface %s has MTU %d, its host veth %s %d: packets between them would be dropped", args.IfName, a.MTU, hostIf, host.Attrs().MTU)
		}
		if a.ParentIndex != ifindex {
			return checkError("interface %s is not the peer of host veth %s", args.IfName, hostIf)
		}
		// Not ip.ValidateExpectedInterfaceIPs: it wants the prefix route that
		// ADD deliberately leaves out (all traffic goes via the gateway).
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return checkError("list addresses of %s: %v", args.IfName, err)
		}
		for _, ipc := range prev.IPs {
			found := false
			for _, a := range addrs {
				if a.IPNet.String() == ipc.Address.String() {
					found = true
					break
				}
			}
			if !found {
				return checkError("address %s is missing from %s", ipc.Address.String(), args.IfName)
			}
		}
		if err := ip.ValidateExpectedRoute(prev.Routes); err != nil {
			return checkError("%v", err)
		}
		if rec != nil && rec.PodTable == 0 {
			return nil // added by a build before per-interface tables
		}
		return checkPodTable(args.IfName, a.Index, prev.IPs)
	})
}

// checkHostRoute: the node routes a pod address to its host veth, and only there.
func checkHostRoute(ip net.IP, ifindex int, hostIf string) error {
	bits, fam := 128, netlink.FAMILY_V6
	if isV4(ip) {
		bits, fam = 32, netlink.FAMILY_V4
	}
	dst := &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}
	routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
	if err != nil {
		return checkError("list the node's routes to %s: %v", dst, err)
	}
	if len(routes) == 0 {
		return checkError("the node has no route to %s (host veth %s): the pod is unreachable", dst, hostIf)
	}
	for _, r := range routes {
		if r.LinkIndex != ifindex {
			return checkError("the node routes %s to %s, not to host veth %s", dst, holderOf(r.LinkIndex), hostIf)
		}
	}
	return nil
}

// checkPodTable: the interface's own table has its default routes and every
// address has its rule (see configurePod), in the calling thread's netns.
func checkPodTable(ifname string, ifindex int, ips []*current.IPConfig) error {
	table := podTable(ifindex)
	for _, ipc := range ips {
		want := podRule(ipc.Address.IP, table)
		rules, err := netlink.RuleListFiltered(want.Family, &netlink.Rule{Table: table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return checkError("list rules: %v", err)
		}
		found := false
		for _, r := range rules {
			found = found || (r.Src != nil && r.Src.String() == want.Src.String())
		}
		if !found {
			return checkError("rule \"from %s lookup %d\" of %s is missing: replies from %s would leave by another interface", want.Src, table, ifname, ipc.Address.IP)
		}
		routes, err := netlink.RouteListFiltered(want.Family, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return checkError("list routes of table %d: %v", table, err)
		}
		found = false
		for _, r := range routes {
			found = found || (r.LinkIndex == ifindex && (r.Dst == nil || isDefault(r.Dst)))
		}
		if !found {
			return checkError("table %d of %s has no default route for %s", table, ifname, ipc.Address.IP)
		}
	}
	return nil
}

func notExist(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return errors.New("missing")
	}
	return err
}
