package endpoint

import (
	"errors"
	"net/netip"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// masq is the Feature of ipMasq (bpf/lib/masq.h): the pod's IPv4 and IPv6
// traffic to destinations outside the cluster CIDRs leaves with the node's
// address, translated on the uplink's egress; replies are translated back
// on its ingress.
type masq struct {
	on           bool
	clusterCIDRs []netip.Prefix // configured; none: the pod's subnets
	portRange    *[2]uint16     // ipMasqPortRange; nil: the default (masqports.go)
	rangeKey     string         // ipMasqPortRange as configured
	podLimit     int            // ipMasqPodPortLimit; 0: the default
}

// newMasq validates the network's ipMasq keys (every verb: they are the
// network's, not the attachment's).
func newMasq(on bool, clusterCIDRs []string, portRange string, podLimit int) (*masq, error) {
	m := &masq{on: on, podLimit: podLimit, rangeKey: portRange}
	if len(clusterCIDRs) > maps.MaxClusterCIDRsPerNetwork {
		return nil, ConfError("clusterCIDRs: %d entries, more than the %d a network may have (cni_cluster_cidrs holds %d node-wide)",
			len(clusterCIDRs), maps.MaxClusterCIDRsPerNetwork, maps.MaxClusterCIDRs)
	}
	for i, c := range clusterCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, ConfError("clusterCIDRs[%d]: %q is not a CIDR", i, c)
		}
		m.clusterCIDRs = append(m.clusterCIDRs, p.Masked())
	}
	if portRange != "" {
		r, err := parsePortRange(portRange)
		if err != nil {
			return nil, err
		}
		m.portRange = &r
	}
	if podLimit < 0 {
		return nil, ConfError("%s: %d is negative", masqPodLimitKey, podLimit)
	}
	return m, nil
}

func (m *masq) NeedsNodeHooks() bool { return m.on }

func (m *masq) Validate() error { return nil }

// Install puts the node hooks and the cluster CIDRs in place before the
// flag that makes the pod use them. Only the uplink programs matter: the
// socket hooks (which need cgroup2) are hostPort's.
func (m *masq) Install(a *Attachment) error {
	if !m.on {
		return nil
	}
	if err := m.coversFamilies(a); err != nil {
		return err
	}
	ports, toReserve, err := m.ports()
	if err != nil {
		return err
	}
	if toReserve != nil {
		// Node-wide and kept (as ip_forward is): the node's connections
		// never take these ports again.
		n, err := ReadNodePorts()
		if err == nil {
			err = reserve(n, *toReserve)
		}
		if err != nil {
			return internal("ipMasq: reserve the masquerade ports %d-%d in %s (the node's ip_local_port_range %d-%d leaves too few outside it): %w",
				toReserve[0], toReserve[1], reservedSysctl, n.Ephemeral[0], n.Ephemeral[1], err)
		}
	}
	if uplinks, err := a.NodeHooks(); err != nil && !uplinks {
		return Errorf(ErrUnavailable, "ipMasq uplink hooks at %s: %w", a.Net.PinDir, err)
	}
	// Node-wide: networks sharing a pin directory share the ports, so
	// one whose keys differ is refused while another's pods use them.
	keys := maps.MasqKeys{Network: a.Net.Name, PortRange: m.rangeKey, PodLimit: m.podLimit}
	if err := a.DP.Maps.Masq().ClaimConfig(keys, ports, a.PodIPs()); err != nil {
		var c *maps.MasqKeysConflict
		if errors.As(err, &c) {
			return ConfError("%s %q, %s %d: %v at %s; networks sharing a pin directory must give the same %s and %s (or use their own pinDir)",
				masqPortRangeKey, m.rangeKey, masqPodLimitKey, m.podLimit, c, a.Net.PinDir, masqPortRangeKey, masqPodLimitKey)
		}
		return internalErr(err)
	}
	// The attachment is a user of its cluster CIDRs: they stay while any
	// user does, and go with the last (Teardown).
	owner := cidrOwner(a.Net, a.ID.ContainerID, a.ID.IfName)
	if err := a.DP.Maps.Masq().AcquireClusterCIDRs(owner, m.cidrs(a)); err != nil {
		return mapError(err)
	}
	a.OnUndo(func() error { _, err := a.DP.Maps.Masq().ReleaseClusterCIDRs(owner); return err })
	m.warnOutside(a)
	a.Flags |= maps.EndpointFlagMasq
	a.Record.Masq = true
	a.Trace.Mark("masq")
	return nil
}

// Check: the pod's endpoint entries carry the flag, and its cluster CIDRs
// are never masqueraded.
func (m *masq) Check(a *Attachment) error {
	if !m.on {
		return nil
	}
	for _, ip := range a.PodIPs() {
		if e, err := a.DP.Maps.Endpoints().Lookup(ip); err == nil && e.Flags&maps.EndpointFlagMasq == 0 {
			return checkError("map cni_endpoints entry of %s lacks the ipMasq flag", ip)
		}
	}
	want, _, err := m.ports()
	if err != nil {
		return err
	}
	if got, err := a.DP.Maps.Masq().Config(); err != nil {
		return checkError("%w", err)
	} else if got.String() != want.String() || got.PodLimit != want.PodLimit {
		return checkError("map cni_masq_config holds ports %q with pod limit %d, want %q with %d", got, got.PodLimit, want, want.PodLimit)
	}
	have, err := a.DP.Maps.Masq().ClusterCIDRs()
	if err != nil {
		return checkError("read map cni_cluster_cidrs: %w", err)
	}
	for _, want := range m.cidrs(a) {
		found := false
		for _, p := range have {
			found = found || p == want
		}
		if !found {
			return checkError("map cni_cluster_cidrs lacks %s: the pod's traffic to it would be masqueraded", want)
		}
	}
	mine, err := a.DP.Maps.Masq().ClusterCIDRsOf(cidrOwner(a.Net, a.ID.ContainerID, a.ID.IfName))
	if err != nil {
		return checkError("read map cni_cidr_refs: %w", err)
	}
	// An attachment of an older layout's build holds its CIDRs through
	// what that layout left (owner 0).
	inherited, err := a.DP.Maps.Masq().ClusterCIDRsOf(0)
	if err != nil {
		return checkError("read map cni_cidr_refs: %w", err)
	}
	for _, want := range m.cidrs(a) {
		if !mine[want] && !inherited[want] {
			return checkError("map cni_cidr_refs does not list this attachment as a user of %s: another attachment's DEL would remove it", want)
		}
	}
	return nil
}

// Teardown purges the pod's masqueraded flows while its veth goes (a
// record without ipMasq has none; with no complete record, a scan).
func (m *masq) Teardown(t *Teardown) {
	masq := t.Complete == nil || t.Complete.Masq
	if masq {
		t.WithVeth(func() error {
			_, err := t.DP.Maps.Masq().DeleteSNATOf(t.Ifindex)
			return err
		})
	}
	t.BeforeEndpoints(func() error {
		var err error
		if masq {
			// The attachment no longer uses its cluster CIDRs; those no
			// other attachment uses go (by its identity: the veth may be
			// long gone).
			_, err = t.DP.Maps.Masq().ReleaseClusterCIDRs(cidrOwner(t.Net, t.ContainerID, t.IfName))
		}
		// The node's last attachment takes the CIDRs an older layout left.
		_, ierr := t.DP.Maps.Masq().ReleaseInheritedClusterCIDRs(t.Ifindex)
		return errors.Join(err, ierr)
	})
}

// cidrOwner names an attachment as a user of cluster CIDRs.
func cidrOwner(n *Network, containerID, ifname string) uint64 {
	return maps.CIDROwner(n.StateDir, n.Name, containerID, ifname)
}

// ports is the node's masquerade configuration for this network: its
// keys, checked against the node's ip_local_port_range and
// ip_local_reserved_ports (and the range Install must reserve first).
func (m *masq) ports() (maps.MasqPorts, *[2]int, error) {
	n, err := ReadNodePorts()
	if err != nil {
		return maps.MasqPorts{}, nil, internal("ipMasq: read the node's ephemeral ports: %w", err)
	}
	return masqPorts(m.portRange, m.podLimit, n)
}

// coversFamilies refuses configured clusterCIDRs that lack a family the
// pod has an address of: every destination of that family would be
// outside the cluster, other nodes' pods included, and masqueraded.
func (m *masq) coversFamilies(a *Attachment) error {
	if len(m.clusterCIDRs) == 0 {
		return nil
	}
	var has4, has6 bool
	for _, p := range m.clusterCIDRs {
		has4 = has4 || p.Addr().Is4()
		has6 = has6 || p.Addr().Is6()
	}
	for _, ip := range a.PodIPs() {
		switch {
		case ip.To4() != nil && !has4:
			return ConfError("clusterCIDRs has no IPv4 prefix, and the pod has IPv4 address %s: its traffic to other nodes' pods would be masqueraded; list the cluster's IPv4 pod range (or 0.0.0.0/0 to masquerade no IPv4)", ip)
		case ip.To4() == nil && !has6:
			return ConfError("clusterCIDRs has no IPv6 prefix, and the pod has IPv6 address %s: ipMasq masquerades IPv6 too, and would masquerade its traffic to other nodes' pods; list the cluster's IPv6 pod range (or ::/0 to masquerade no IPv6)", ip)
		}
	}
	return nil
}

// warnOutside warns of each pod address outside every cluster CIDR of the
// node: the configured clusterCIDRs miss the pod's own range (a /48 given
// for /64s of another /48), so its traffic to other nodes' pods, whose
// ranges are as far out, is masqueraded. The CNI spec lets a network say
// so, hence a warning, not an error. Nothing to do by default (the pod's
// subnets are its cluster CIDRs); the node's other cluster CIDRs (the
// agent's, other networks') are read only for an address outside the
// configured ones.
func (m *masq) warnOutside(a *Attachment) {
	if len(m.clusterCIDRs) == 0 {
		return
	}
	var node []netip.Prefix
	read := false
	for _, ip := range a.PodIPs() {
		addr, ok := netip.AddrFromSlice(ip)
		if addr = addr.Unmap(); !ok || containsAddr(m.clusterCIDRs, addr) {
			continue
		}
		if !read {
			node, _ = a.DP.Maps.Masq().ClusterCIDRs()
			read = true
		}
		if containsAddr(node, addr) {
			continue
		}
		warnf("ipMasq: CNI_CONTAINERID %q, CNI_IFNAME %q: the pod's address %s is outside every cluster CIDR (clusterCIDRs %v; none of the node's at %s holds it either): its traffic to other nodes' pods will be masqueraded; list the cluster's pod range in clusterCIDRs",
			a.ID.ContainerID, a.ID.IfName, addr, m.clusterCIDRs, a.Net.PinDir)
	}
}

func containsAddr(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// cidrs are the configured clusterCIDRs, else the subnets of the pod's
// addresses as the IPAM result gives them.
func (m *masq) cidrs(a *Attachment) []netip.Prefix {
	if len(m.clusterCIDRs) > 0 {
		return m.clusterCIDRs
	}
	var out []netip.Prefix
	for _, ipc := range a.IPs {
		ones, _ := ipc.Address.Mask.Size()
		addr, ok := netip.AddrFromSlice(ipc.Address.IP)
		if !ok {
			continue
		}
		addr = addr.Unmap()
		if addr.Is4() && ones > 32 {
			ones -= 96
		}
		out = append(out, netip.PrefixFrom(addr, ones).Masked())
	}
	return out
}
