package inspect

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// NATRow is one masqueraded flow (cni_snat).
type NATRow struct {
	Protocol  string  `json:"protocol"`
	Pod       string  `json:"pod"`  // the pod's address:port (ICMP: echo id)
	Node      string  `json:"node"` // what the peer sees
	Peer      string  `json:"peer"`
	Ifindex   int     `json:"ifindex"`
	Interface string  `json:"interface,omitempty"`
	AgeSecs   float64 `json:"ageSeconds"`
	IdleSecs  float64 `json:"idleSeconds"`
	// ReverseOnly: the forward entry was evicted or deleted.
	ReverseOnly bool `json:"reverseOnly,omitempty"`
	// Closing: a TCP RST, or a FIN each way, was seen; the entry expires 10 s after the last packet.
	Closing bool `json:"closing,omitempty"`
	// State: syn-sent, syn-recv, established, fin-wait, closing (TCP);
	// unreplied, replied, stream (UDP, ICMP). ExpiresSecs: the idle time
	// left before the flow is deleted.
	State       string  `json:"state"`
	ExpiresSecs float64 `json:"expiresSeconds"`
}

// ShareRow is how many ports one pod holds towards one destination.
type ShareRow struct {
	Protocol    string `json:"protocol"`
	Destination string `json:"destination"`
	Ifindex     int    `json:"ifindex"`
	Interface   string `json:"interface,omitempty"`
	Ports       int    `json:"ports"`
}

// UplinkSourceRow is the source masquerade takes on one uplink when the
// kernel lacks BPF_FIB_LOOKUP_SRC (cni_node_ips' uplink entries).
type UplinkSourceRow struct {
	Ifindex   int      `json:"ifindex"`
	Interface string   `json:"interface,omitempty"`
	Sources   []string `json:"sources"` // one per family
}

// NATDump is `dump nat`: masqueraded flows, the cluster CIDRs (never
// masqueraded) with their users, the ports and the pod limit, each pod's
// ports per destination, the masquerade counters and the uplinks' sources.
type NATDump struct {
	Flows        []NATRow `json:"flows"`
	ClusterCIDRs []string `json:"clusterCIDRs"`
	// ClusterCIDRUsers: the attachments and agent holding each cluster
	// CIDR (cni_cidr_refs); a CIDR goes with its last user. 0: only an
	// older build's pins hold it, kept while any of their interfaces is.
	ClusterCIDRUsers map[string]int    `json:"clusterCIDRUsers"`
	UplinkSources    []UplinkSourceRow `json:"uplinkSources"`
	Ports            string            `json:"ports"`    // ranges; "" until an ipMasq ADD configured them
	PodLimit         uint32            `json:"podLimit"` // most ports a pod holds per destination
	Shares           []ShareRow        `json:"shares"`
	Counters         map[string]uint64 `json:"counters"`
	Quota            QuotaDump         `json:"quota"`
}

// QuotaDump is the pods' quota of cni_snat (zero: none, pins of an older
// build) and the flows each pod holds against it.
type QuotaDump struct {
	Reserve uint32     `json:"reserve"` // flows each pod may always open
	Pool    uint32     `json:"pool"`    // node total past which only pods under their reserve open flows
	PodMax  uint32     `json:"podMax"`  // most flows one pod holds
	Total   int        `json:"total"`   // flows the node holds
	Pods    []QuotaRow `json:"pods"`
}

// QuotaRow is one pod's flows against its quota.
type QuotaRow struct {
	Ifindex   int    `json:"ifindex"`
	Interface string `json:"interface,omitempty"`
	Flows     int    `json:"flows"`
	Refused   int    `json:"refused"` // new flows refused for the quota
}

// ReadNAT reads the masquerade table, cluster CIDRs and counters.
func ReadNAT(src Source) (*NATDump, error) {
	m, err := datapath.OpenMaps(src.PinDir)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	flows, err := m.Masq().ListSNAT()
	if err != nil {
		return nil, fmt.Errorf("read snat: %w", err)
	}
	d := &NATDump{Flows: []NATRow{}, ClusterCIDRs: []string{}}
	if d.Counters, err = m.Masq().Stats(); err != nil {
		return nil, err
	}
	if d.ClusterCIDRs, d.ClusterCIDRUsers, err = readClusterCIDRs(m); err != nil {
		return nil, err
	}
	names := NewNames(src.StateDir)
	if d.UplinkSources, err = readUplinkSources(m, names); err != nil {
		return nil, err
	}
	cfg, err := m.Masq().Config()
	if err != nil {
		return nil, err
	}
	d.Ports, d.PodLimit = cfg.String(), cfg.PodLimit
	for _, f := range flows {
		left := max(0, maps.NATFlowTimeout(f.Proto, f.Flags)-f.Idle)
		d.Flows = append(d.Flows, NATRow{
			Protocol: maps.ProtoName(f.Proto), Pod: f.Pod.String(), Node: f.Node.String(), Peer: f.Peer.String(),
			Ifindex: f.Ifindex, Interface: names.Interface(f.Ifindex), AgeSecs: f.Age.Round(time.Millisecond).Seconds(),
			IdleSecs: f.Idle.Round(time.Millisecond).Seconds(), ReverseOnly: f.Reverse, Closing: f.Closing,
			State: f.State, ExpiresSecs: left.Round(time.Millisecond).Seconds(),
		})
	}
	shares, err := m.Masq().ListShares()
	if err != nil {
		return nil, err
	}
	d.Shares = []ShareRow{}
	for _, sh := range shares {
		d.Shares = append(d.Shares, ShareRow{Protocol: maps.ProtoName(sh.Proto), Destination: sh.Destination.String(),
			Ifindex: sh.Ifindex, Interface: names.Interface(sh.Ifindex), Ports: sh.Ports})
	}
	sort.Slice(d.Shares, func(i, j int) bool { return d.Shares[i].Ports > d.Shares[j].Ports })
	q, err := m.Masq().Quota()
	if err != nil {
		return nil, err
	}
	d.Quota = QuotaDump{Reserve: q.Reserve, Pool: q.Pool, PodMax: q.PodMax, Pods: []QuotaRow{}}
	pods, err := m.Masq().ListPods()
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		if p.Ifindex == 0 {
			d.Quota.Total = p.Flows
			continue
		}
		d.Quota.Pods = append(d.Quota.Pods, QuotaRow{Ifindex: p.Ifindex, Interface: names.Interface(p.Ifindex), Flows: p.Flows, Refused: p.Drops})
	}
	sort.Slice(d.Quota.Pods, func(i, j int) bool { return d.Quota.Pods[i].Flows > d.Quota.Pods[j].Flows })
	sort.SliceStable(d.Flows, func(i, j int) bool {
		a, b := d.Flows[i], d.Flows[j]
		if a.Pod != b.Pod {
			return a.Pod < b.Pod
		}
		return a.Peer < b.Peer
	})
	return d, nil
}

// readClusterCIDRs lists the cluster CIDRs, sorted, and each one's users.
func readClusterCIDRs(m *maps.Maps) ([]string, map[string]int, error) {
	cidrs, err := m.Masq().ClusterCIDRs()
	if err != nil {
		return nil, nil, err
	}
	users, err := m.Masq().ClusterCIDRUsers()
	if err != nil {
		return nil, nil, err
	}
	list, byCIDR := []string{}, map[string]int{}
	for _, c := range cidrs {
		list = append(list, c.String())
		byCIDR[c.String()] = users[c]
	}
	sort.Strings(list)
	return list, byCIDR, nil
}

// readUplinkSources lists the source kept per uplink, by ifindex.
func readUplinkSources(m *maps.Maps, names *Names) ([]UplinkSourceRow, error) {
	srcs, err := m.Node().UplinkSources()
	if err != nil {
		return nil, fmt.Errorf("read uplink sources: %w", err)
	}
	out := []UplinkSourceRow{}
	for idx, ips := range srcs {
		r := UplinkSourceRow{Ifindex: idx, Interface: names.Interface(idx), Sources: []string{}}
		for _, ip := range ips {
			r.Sources = append(r.Sources, ip.String())
		}
		sort.Strings(r.Sources)
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ifindex < out[j].Ifindex })
	return out, nil
}

func (d *NATDump) Tables() []Table {
	t := Table{Header: []string{"PROTO", "POD", "NODE (PEER SEES)", "PEER", "IFINDEX", "INTERFACE", "STATE", "AGE", "IDLE", "EXPIRES"}}
	for _, r := range d.Flows {
		node := r.Node
		if r.ReverseOnly {
			node += " (reverse only)"
		}
		t.Rows = append(t.Rows, []string{r.Protocol, r.Pod, node, r.Peer, itoa(r.Ifindex), dash(r.Interface), r.State,
			secs(r.AgeSecs), secs(r.IdleSecs), secs(r.ExpiresSecs)})
	}
	cidrs := make([]string, 0, len(d.ClusterCIDRs))
	for _, c := range d.ClusterCIDRs {
		cidrs = append(cidrs, fmt.Sprintf("%s (%d users)", c, d.ClusterCIDRUsers[c]))
	}
	t.Footer = fmt.Sprintf("%d flows; cluster CIDRs (not masqueraded): %s; ports %s, at most %d per pod and destination; counters: %s",
		len(d.Flows), dash(strings.Join(cidrs, ",")), dash(d.Ports), d.PodLimit, counters(d.Counters, " "))
	s := Table{Header: []string{"PROTO", "DESTINATION", "IFINDEX", "INTERFACE", "PORTS HELD"}}
	for _, r := range d.Shares {
		s.Rows = append(s.Rows, []string{r.Protocol, r.Destination, itoa(r.Ifindex), dash(r.Interface), itoa(r.Ports)})
	}
	s.Footer = fmt.Sprintf("%d pods and destinations", len(d.Shares))
	q := Table{Header: []string{"IFINDEX", "INTERFACE", "FLOWS", "REFUSED (QUOTA)"}}
	for _, r := range d.Quota.Pods {
		q.Rows = append(q.Rows, []string{itoa(r.Ifindex), dash(r.Interface), itoa(r.Flows), itoa(r.Refused)})
	}
	q.Footer = fmt.Sprintf("%d flows held; quota: %d flows a pod always may open, at most %d a pod, %d in all past which only pods under %d open more",
		d.Quota.Total, d.Quota.Reserve, d.Quota.PodMax, d.Quota.Pool, d.Quota.Reserve)
	u := Table{Header: []string{"UPLINK IFINDEX", "UPLINK", "SOURCES"}}
	for _, r := range d.UplinkSources {
		u.Rows = append(u.Rows, []string{itoa(r.Ifindex), dash(r.Interface), dash(strings.Join(r.Sources, ","))})
	}
	u.Footer = "the source masquerade takes per uplink on kernels without BPF_FIB_LOOKUP_SRC (status: fallbacks); with it, the FIB's"
	return []Table{t, s, q, u}
}
