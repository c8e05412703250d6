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

	hostIf := HostIfName(args.ContainerID, args.IfName)
	host, err := netlink.LinkByName(hostIf)
	if err != nil {
		return checkError("host veth %s: %v", hostIf, err)
	}
	ifindex := host.Attrs().Index

	dp, err := datapath.Open(conf.PinDir)
	if err != nil {
		return types.NewError(errPluginNotAvailable, fmt.Sprintf("datapath at %s: %v", conf.PinDir, err), "")
	}
	defer dp.Close()
	if err := dp.Attached(ifindex, hostIf); err != nil {
		return checkError("%v", err)
	}
	if _, err := dp.Maps.LookupLink(ifindex); err != nil {
		return checkError("map cni_links has no entry for %s (ifindex %d): %v", hostIf, ifindex, notExist(err))
	}
	lim, _ := parseBandwidth(conf.RuntimeConfig.Bandwidth)
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
		if podIf.Mac != "" && l.Attrs().HardwareAddr.String() != podIf.Mac {
			return checkError("interface %s has MAC %s, prevResult says %s", args.IfName, l.Attrs().HardwareAddr, podIf.Mac)
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
		return nil
	})
}

func notExist(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return errors.New("missing")
	}
	return err
}
