package endpoint

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// PortMapping is one entry of the portMappings capability.
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// hostPorts is the Feature of the portMappings capability
// (bpf/lib/hostport.h): map entries the uplink and host-veth programs
// translate by, and the node hooks.
type hostPorts struct {
	conf     []PortMapping
	limit    int           // the network's maxHostPortsPerPod
	mappings []portMapping // set by Validate
}

func (h *hostPorts) NeedsNodeHooks() bool { return len(h.conf) > 0 }

// Validate parses the mappings and holds the pod to its share of
// cni_hostports: the map is sized for maxPods pods with maxHostPortsPerPod
// mappings each, so no pod can take the node's hostPorts from the others.
func (h *hostPorts) Validate() (err error) {
	if h.mappings, err = parsePortMappings(h.conf); err != nil {
		return err
	}
	if len(h.mappings) > h.limit {
		return ConfError("runtimeConfig.portMappings: %d mappings, more than maxHostPortsPerPod (%d) allows a pod", len(h.mappings), h.limit)
	}
	return nil
}

// Install inserts the pod's mappings (BPF_NOEXIST: of two ADDs racing for
// a hostPort exactly one wins, and the loser undoes everything, mappings it
// did get included) and flags its endpoint entries, so from_container looks
// its replies up in cni_ct.
func (h *hostPorts) Install(a *Attachment) error {
	if len(h.mappings) == 0 {
		return nil
	}
	hps, err := planHostPorts(h.mappings, a.PodIPs(), a.Ifindex)
	if err != nil {
		return err
	}
	if _, err := a.NodeHooks(); err != nil {
		return Errorf(ErrUnavailable, "hostPort hooks at %s: %w", a.Net.PinDir, err)
	}
	a.Trace.Mark("hostport-hooks")
	m := a.DP.Maps
	for _, hp := range hps {
		if err := m.HostPorts().Insert(hp); err != nil {
			return hostPortError(a.Net, h.mappings, hp, err)
		}
		a.OnUndo(func() error { return m.HostPorts().Delete(hp) })
	}
	a.Flags |= maps.EndpointFlagHostPort
	a.Record.HostPorts = recordHostPorts(hps)
	a.Trace.Mark("hostports")
	return nil
}

func (h *hostPorts) Check(a *Attachment) error {
	if len(h.mappings) == 0 {
		return nil
	}
	hps, err := planHostPorts(h.mappings, a.PodIPs(), a.Ifindex)
	if err != nil {
		return err
	}
	m := a.DP.Maps
	for _, hp := range hps {
		got, err := m.HostPorts().Lookup(hp)
		if err != nil {
			return checkError("map cni_hostports has no entry for %s: %v", hp.Listen(), notExist(err))
		}
		if !got.PodIP.Equal(hp.PodIP) || got.PodPort != hp.PodPort || got.Ifindex != a.Ifindex {
			return checkError("map cni_hostports sends %s to %s:%d (ifindex %d), not this pod (%s:%d, ifindex %d)",
				hp.Listen(), got.PodIP, got.PodPort, got.Ifindex, hp.PodIP, hp.PodPort, a.Ifindex)
		}
	}
	for _, ip := range a.PodIPs() {
		if e, err := m.Endpoints().Lookup(ip); err == nil && e.Flags&maps.EndpointFlagHostPort == 0 {
			return checkError("map cni_endpoints entry of %s lacks the hostPort flag", ip)
		}
	}
	if err := a.DP.CheckNodeHooks(a.Net.nodeHookOptions()); err != nil {
		return checkError("hostPort hooks: %w", err)
	}
	return nil
}

// Teardown removes the pod's mappings before its endpoint entries, so no
// new flow is translated to it, and while its veth goes every cni_ct and
// cni_sock_rnat entry made for it, and the node's connected UDP sockets the
// socket hook had pointed at it. A record without mappings has nothing to
// purge; with no (complete) record, the maps are searched by ifindex.
func (h *hostPorts) Teardown(t *Teardown) {
	t.BeforeEndpoints(func() error { return removeHostPorts(t.DP, t.Complete, t.Ifindex) })
	if t.Complete == nil || len(t.Complete.HostPorts) > 0 {
		t.WithVeth(func() error { return purgeHostPortFlows(t.DP, t.Ifindex) })
	}
}

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
func parsePortMappings(pms []PortMapping) ([]portMapping, error) {
	var out []portMapping
	seen := map[string]portMapping{}
	for i, pm := range pms {
		p := portMapping{index: i}
		f := func(name string) string { return fmt.Sprintf("runtimeConfig.portMappings[%d].%s", i, name) }
		if pm.HostPort < 1 || pm.HostPort > 65535 {
			return nil, ConfError("%s: %d is out of range (1-65535)", f("hostPort"), pm.HostPort)
		}
		if pm.ContainerPort < 1 || pm.ContainerPort > 65535 {
			return nil, ConfError("%s: %d is out of range (1-65535)", f("containerPort"), pm.ContainerPort)
		}
		p.hostPort, p.containerPort = uint16(pm.HostPort), uint16(pm.ContainerPort)
		switch strings.ToLower(pm.Protocol) {
		case "", "tcp": // the runtimes' default, as portmap's
			p.proto = maps.ProtoTCP
		case "udp":
			p.proto = maps.ProtoUDP
		case "sctp":
			return nil, ConfError("%s: \"sctp\" is not supported: ebpf-cni's hostPort datapath translates only tcp and udp", f("protocol"))
		default:
			return nil, ConfError("%s: %q is not a protocol (want tcp or udp)", f("protocol"), pm.Protocol)
		}
		switch ip := net.ParseIP(pm.HostIP); {
		case pm.HostIP == "":
			p.v4, p.v6 = true, true
		case ip == nil:
			return nil, ConfError("%s: %q is not an IP address", f("hostIP"), pm.HostIP)
		case ip.IsUnspecified():
			// 0.0.0.0 or ::: every node address of that family.
			p.v4, p.v6 = ip.To4() != nil, ip.To4() == nil
		case ip.IsMulticast() || ip.Equal(net.IPv4bcast):
			return nil, ConfError("%s: %q is not a unicast address", f("hostIP"), pm.HostIP)
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
					return nil, ConfError("%s: %d/%s on %s is also mapped by runtimeConfig.portMappings[%d], to another containerPort",
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
			return nil, ConfError("%s, but the pod has no %s address", what, fam)
		}
	}
	return out, nil
}

// hostPortError turns a failed insert into the CNI error naming the entry
// and, for a taken hostPort, the attachment holding it (looked up in the
// state records: a scan, but only on this error path).
func hostPortError(n *Network, mappings []portMapping, h maps.HostPort, err error) error {
	idx := 0
	for _, p := range mappings {
		if p.proto == h.Proto && p.hostPort == h.HostPort && p.hostIP.Equal(h.HostIP) {
			idx = p.index
			break
		}
	}
	var taken *maps.HostPortTakenError
	if errors.As(err, &taken) {
		owner := ""
		if recs, rerr := n.Store().List(); rerr == nil {
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
		return ConfError("runtimeConfig.portMappings[%d]: %w%s", idx, err, owner)
	}
	return mapError(fmt.Errorf("runtimeConfig.portMappings[%d]: %w", idx, err))
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

// removeHostPorts removes the pod's mappings: the recorded ones, or (no
// complete record) those leading to its host veth.
func removeHostPorts(dp *datapath.Datapath, rec *state.Record, ifindex int) error {
	var errs error
	if rec != nil {
		for _, r := range rec.HostPorts {
			h, ok := recordedHostPort(r, ifindex)
			if !ok {
				continue
			}
			errs = errors.Join(errs, dp.Maps.HostPorts().Delete(h))
		}
		return errs
	}
	if ifindex == 0 {
		return nil
	}
	// No record (ADD died before writing it): find the mappings by veth.
	hps, err := dp.Maps.HostPorts().List()
	if err != nil {
		return err
	}
	for _, h := range hps {
		if h.Ifindex == ifindex {
			errs = errors.Join(errs, dp.Maps.HostPorts().Delete(h))
		}
	}
	return errs
}

// purgeHostPortFlows removes the flows translated for the pod and the node
// sockets sent to it, aborting those sockets (see datapath.DestroyUDPSockets).
func purgeHostPortFlows(dp *datapath.Datapath, ifindex int) error {
	if ifindex == 0 {
		return nil
	}
	_, err := dp.Maps.HostPorts().DeleteCTOf(ifindex)
	socks, serr := dp.Maps.HostPorts().DeleteSockRNATOf(ifindex)
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

// PruneHostPorts drops hostPort mappings and flows of host veths that no
// longer exist (GC, the agent). A pod being added has its veth before its
// mappings, so a concurrent ADD never loses its entries to this.
func PruneHostPorts(m *maps.Maps) (int, error) {
	return m.HostPorts().Prune(func(ifindex int) bool { return ifindex != 0 && linkAlive(ifindex) })
}
