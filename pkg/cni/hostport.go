package cni

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// portMapping is a validated runtimeConfig.portMappings entry.
type portMapping struct {
	index         int
	hostIP        net.IP // nil: every node address
	v4, v6        bool   // families the entry applies to (hostIP "" means both)
	proto         uint8
	hostPort      uint16
	containerPort uint16
}

func (p portMapping) field(name string) string {
	return fmt.Sprintf("runtimeConfig.portMappings[%d].%s", p.index, name)
}

// parsePortMappings validates runtimeConfig.portMappings. Every problem is
// error 7 naming the entry and field. Identical entries are merged; two
// entries for the same host address, port and protocol that lead to
// different places are an error.
func parsePortMappings(conf *NetConf) ([]portMapping, error) {
	var out []portMapping
	seen := map[string]portMapping{}
	for i, pm := range conf.RuntimeConfig.PortMappings {
		p := portMapping{index: i}
		f := func(name string) string { return fmt.Sprintf("runtimeConfig.portMappings[%d].%s", i, name) }
		if pm.HostPort < 1 || pm.HostPort > 65535 {
			return nil, confError("%s: %d is out of range (1-65535)", f("hostPort"), pm.HostPort)
		}
		if pm.ContainerPort < 1 || pm.ContainerPort > 65535 {
			return nil, confError("%s: %d is out of range (1-65535)", f("containerPort"), pm.ContainerPort)
		}
		p.hostPort, p.containerPort = uint16(pm.HostPort), uint16(pm.ContainerPort)
		switch strings.ToLower(pm.Protocol) {
		case "", "tcp": // the runtimes' default, as portmap's
			p.proto = maps.ProtoTCP
		case "udp":
			p.proto = maps.ProtoUDP
		case "sctp":
			return nil, confError("%s: \"sctp\" is not supported: this kernel has no SCTP and ebpf-cni's hostPort datapath translates only tcp and udp", f("protocol"))
		default:
			return nil, confError("%s: %q is not a protocol (want tcp or udp)", f("protocol"), pm.Protocol)
		}
		switch ip := net.ParseIP(pm.HostIP); {
		case pm.HostIP == "":
			p.v4, p.v6 = true, true
		case ip == nil:
			return nil, confError("%s: %q is not an IP address", f("hostIP"), pm.HostIP)
		case ip.IsUnspecified():
			// 0.0.0.0 or ::: every node address of that family.
			p.v4, p.v6 = ip.To4() != nil, ip.To4() == nil
		case ip.IsMulticast() || ip.Equal(net.IPv4bcast):
			return nil, confError("%s: %q is not a unicast address", f("hostIP"), pm.HostIP)
		default:
			if v4 := ip.To4(); v4 != nil {
				p.hostIP, p.v4 = v4, true
			} else {
				p.hostIP, p.v6 = ip, true
			}
		}
		dup := false
		for _, fam := range p.families() {
			key := fmt.Sprintf("%v/%s/%d/%d", fam, ipOrAny(p.hostIP), p.proto, p.hostPort)
			if prev, ok := seen[key]; ok {
				if prev.containerPort != p.containerPort {
					return nil, confError("%s: %d/%s on %s is also mapped by runtimeConfig.portMappings[%d], to another containerPort",
						f("hostPort"), p.hostPort, maps.ProtoName(p.proto), ipOrAny(p.hostIP), prev.index)
				}
				dup = true
			}
			seen[key] = p
		}
		if !dup {
			out = append(out, p)
		}
	}
	return out, nil
}

func (p portMapping) families() []bool { // true = IPv6
	var out []bool
	if p.v4 {
		out = append(out, false)
	}
	if p.v6 {
		out = append(out, true)
	}
	return out
}

func ipOrAny(ip net.IP) string {
	if ip == nil {
		return "any node address"
	}
	return ip.String()
}

// validateHostPorts checks runtimeConfig.portMappings (ADD and CHECK).
func validateHostPorts(conf *NetConf) error {
	pms, err := parsePortMappings(conf)
	if err != nil {
		return err
	}
	conf.portMappings = pms
	return nil
}

// planHostPorts turns the mappings into map entries for a pod with podIPs
// behind host veth ifindex: one per family the entry applies to and the pod
// has an address in. A hostIP of a family the pod has no address of is
// error 7; so is a mapping that ends up with no entry at all.
func planHostPorts(pms []portMapping, podIPs []net.IP, ifindex int) ([]maps.HostPort, error) {
	var pod4, pod6 net.IP
	for _, ip := range podIPs {
		if v4 := ip.To4(); v4 != nil {
			if pod4 == nil {
				pod4 = v4
			}
		} else if pod6 == nil {
			pod6 = ip
		}
	}
	var out []maps.HostPort
	for _, p := range pms {
		n := 0
		for _, v6 := range p.families() {
			pod := pod4
			if v6 {
				pod = pod6
			}
			if pod == nil {
				continue
			}
			out = append(out, maps.HostPort{
				HostIP: p.hostIP, IPv6: v6, Proto: p.proto, HostPort: p.hostPort,
				PodIP: pod, PodPort: p.containerPort, Ifindex: ifindex,
			})
			n++
		}
		if n == 0 {
			fam := "IPv4"
			if p.v6 && !p.v4 {
				fam = "IPv6"
			}
			what := p.field("hostIP") + ": " + p.hostIP.String() + " is " + fam
			if p.hostIP == nil {
				what = p.field("hostIP") + ": the " + fam + " wildcard"
			}
			return nil, confError("%s, but the pod has no %s address", what, fam)
		}
	}
	return out, nil
}

// hostPortError turns a failed insert into the CNI error naming the entry
// and, for a taken hostPort, the attachment holding it (looked up in the
// state records: a scan, but only on this error path).
func hostPortError(conf *NetConf, h maps.HostPort, err error) error {
	idx := 0
	for _, p := range conf.portMappings {
		if p.proto == h.Proto && p.hostPort == h.HostPort && p.hostIP.Equal(h.HostIP) {
			idx = p.index
			break
		}
	}
	var taken *maps.HostPortTakenError
	if errors.As(err, &taken) {
		owner := ""
		if recs, rerr := conf.store().List(); rerr == nil {
			for _, r := range recs {
				if r.HostIfindex == taken.Owner.Ifindex {
					owner = fmt.Sprintf(" (container %s", r.ContainerID)
					if r.PodName != "" {
						owner += fmt.Sprintf(", pod %s/%s", r.PodNamespace, r.PodName)
					}
					owner += ")"
				}
			}
		}
		return confError("runtimeConfig.portMappings[%d]: %v%s", idx, err, owner)
	}
	return types.NewError(types.ErrInternal, fmt.Sprintf("runtimeConfig.portMappings[%d]: %v", idx, err), "")
}

// recordHostPorts is how the state record keeps the pod's mappings.
func recordHostPorts(hps []maps.HostPort) []state.HostPort {
	out := make([]state.HostPort, 0, len(hps))
	for _, h := range hps {
		r := state.HostPort{IPv6: h.IPv6, Protocol: maps.ProtoName(h.Proto), HostPort: h.HostPort,
			PodIP: h.PodIP.String(), ContainerPort: h.PodPort}
		if h.HostIP != nil {
			r.HostIP = h.HostIP.String()
		}
		out = append(out, r)
	}
	return out
}

// recordedHostPort is the map entry of a recorded mapping of the pod behind ifindex.
func recordedHostPort(r state.HostPort, ifindex int) (maps.HostPort, bool) {
	h := maps.HostPort{IPv6: r.IPv6, HostPort: r.HostPort, PodIP: net.ParseIP(r.PodIP), PodPort: r.ContainerPort, Ifindex: ifindex}
	switch r.Protocol {
	case "tcp":
		h.Proto = maps.ProtoTCP
	case "udp":
		h.Proto = maps.ProtoUDP
	default:
		return h, false
	}
	if r.HostIP != "" {
		if h.HostIP = net.ParseIP(r.HostIP); h.HostIP == nil {
			return h, false
		}
		if v4 := h.HostIP.To4(); v4 != nil {
			h.HostIP = v4
		}
	}
	return h, h.PodIP != nil
}

func nodeHookOptions(conf *NetConf) datapath.NodeHookOptions {
	return datapath.NodeHookOptions{CgroupRoot: conf.CgroupRoot}
}

// removeHostPorts and purgeHostPortFlows undo what ADD made for the pod's
// mappings, in two steps around the veth's deletion. Before it (removeHostPorts): the
// mappings, so no new flow is translated to the pod. After it
// (purgeHostPortFlows): every cni_ct and cni_sock_rnat entry made for the
// pod, and the node's connected UDP sockets the hook had pointed at it.
func removeHostPorts(dp *datapath.Datapath, rec *state.Record, ifindex int) error {
	var errs error
	if rec != nil {
		for _, r := range rec.HostPorts {
			h, ok := recordedHostPort(r, ifindex)
			if !ok {
				continue
			}
			errs = errors.Join(errs, dp.Maps.DeleteHostPort(h))
		}
		return errs
	}
	if ifindex == 0 {
		return nil
	}
	// No record (ADD died before writing it): find the mappings by veth.
	hps, err := dp.Maps.ListHostPorts()
	if err != nil {
		return err
	}
	for _, h := range hps {
		if h.Ifindex == ifindex {
			errs = errors.Join(errs, dp.Maps.DeleteHostPort(h))
		}
	}
	return errs
}

func purgeHostPortFlows(dp *datapath.Datapath, ifindex int) error {
	if ifindex == 0 {
		return nil
	}
	_, err := dp.Maps.DeleteCTOf(ifindex)
	socks, serr := dp.Maps.DeleteSockRNATOf(ifindex)
	err = errors.Join(err, serr)
	cookies := map[uint64]bool{}
	for _, s := range socks {
		cookies[s.Cookie] = true
	}
	if _, derr := datapath.DestroyUDPSockets(cookies); derr != nil {
		err = errors.Join(err, derr)
	}
	return err
}
