package endpoint

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// masq is the Feature of ipMasq (bpf/lib/masq.h): the pod's IPv4 traffic
// to destinations outside the cluster CIDRs leaves with the node's address,
// translated on the uplink's egress; replies are translated back on its
// ingress.
type masq struct {
	on           bool
	clusterCIDRs []netip.Prefix // configured; none: the pod's subnets
}

// newMasq validates the network's ipMasq keys (every verb: they are the
// network's, not the attachment's).
func newMasq(on bool, clusterCIDRs []string) (*masq, error) {
	m := &masq{on: on}
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
	if uplinks, err := a.NodeHooks(); err != nil && !uplinks {
		return types.NewError(ErrPluginNotAvailable, fmt.Sprintf("ipMasq uplink hooks at %s: %v", a.Net.PinDir, err), "")
	}
	// The attachment is a user of its cluster CIDRs: they stay while any
	// user does, and go with the last (Teardown).
	owner := cidrOwner(a.Net, a.ID.ContainerID, a.ID.IfName)
	if err := a.DP.Maps.AcquireClusterCIDRs(owner, m.cidrs(a)); err != nil {
		return mapError(err)
	}
	a.OnUndo(func() error { _, err := a.DP.Maps.ReleaseClusterCIDRs(owner); return err })
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
		if e, err := a.DP.Maps.LookupEndpoint(ip); err == nil && e.Flags&maps.EndpointFlagMasq == 0 {
			return checkError("map cni_endpoints entry of %s lacks the ipMasq flag", ip)
		}
	}
	have, err := a.DP.Maps.ClusterCIDRs()
	if err != nil {
		return checkError("read map cni_cluster_cidrs: %v", err)
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
	mine, err := a.DP.Maps.ClusterCIDRsOf(cidrOwner(a.Net, a.ID.ContainerID, a.ID.IfName))
	if err != nil {
		return checkError("read map cni_cidr_refs: %v", err)
	}
	// An attachment of an older layout's build holds its CIDRs through
	// what that layout left (owner 0).
	inherited, err := a.DP.Maps.ClusterCIDRsOf(0)
	if err != nil {
		return checkError("read map cni_cidr_refs: %v", err)
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
			_, err := t.DP.Maps.DeleteSNATOf(t.Ifindex)
			return err
		})
	}
	t.BeforeEndpoints(func() error {
		var err error
		if masq {
			// The attachment no longer uses its cluster CIDRs; those no
			// other attachment uses go (by its identity: the veth may be
			// long gone).
			_, err = t.DP.Maps.ReleaseClusterCIDRs(cidrOwner(t.Net, t.ContainerID, t.IfName))
		}
		// The node's last attachment takes the CIDRs an older layout left.
		_, ierr := t.DP.Maps.ReleaseInheritedClusterCIDRs(t.Ifindex)
		return errors.Join(err, ierr)
	})
}

// cidrOwner names an attachment as a user of cluster CIDRs.
func cidrOwner(n *Network, containerID, ifname string) uint64 {
	return maps.CIDROwner(n.StateDir, n.Name, containerID, ifname)
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
