package endpoint

import (
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
	if err := a.DP.Maps.AddClusterCIDRs(m.cidrs(a)); err != nil {
		return mapError(err)
	}
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
	return nil
}

// Teardown purges the pod's masqueraded flows while its veth goes (a
// record without ipMasq has none; with no complete record, a scan).
func (m *masq) Teardown(t *Teardown) {
	if t.Complete == nil || t.Complete.Masq {
		t.WithVeth(func() error {
			_, err := t.DP.Maps.DeleteSNATOf(t.Ifindex)
			return err
		})
	}
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
