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
}

// NATDump is `dump nat`: masqueraded flows, the cluster CIDRs (never
// masqueraded) and the masquerade counters.
type NATDump struct {
	Flows        []NATRow          `json:"flows"`
	ClusterCIDRs []string          `json:"clusterCIDRs"`
	Counters     map[string]uint64 `json:"counters"`
}

// ReadNAT reads the masquerade table, cluster CIDRs and counters.
func ReadNAT(src Source) (*NATDump, error) {
	m, err := datapath.OpenMaps(src.PinDir)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	flows, err := m.ListSNAT()
	if err != nil {
		return nil, fmt.Errorf("read snat: %w", err)
	}
	d := &NATDump{Flows: []NATRow{}, ClusterCIDRs: []string{}}
	if d.Counters, err = m.MasqStats(); err != nil {
		return nil, err
	}
	cidrs, err := m.ClusterCIDRs()
	if err != nil {
		return nil, err
	}
	for _, c := range cidrs {
		d.ClusterCIDRs = append(d.ClusterCIDRs, c.String())
	}
	sort.Strings(d.ClusterCIDRs)
	names := NewNames(src.StateDir)
	for _, f := range flows {
		d.Flows = append(d.Flows, NATRow{
			Protocol: maps.ProtoName(f.Proto), Pod: f.Pod.String(), Node: f.Node.String(), Peer: f.Peer.String(),
			Ifindex: f.Ifindex, Interface: names.Interface(f.Ifindex), AgeSecs: f.Age.Round(time.Millisecond).Seconds(),
			IdleSecs: f.Idle.Round(time.Millisecond).Seconds(), ReverseOnly: f.Reverse, Closing: f.Closing,
		})
	}
	sort.SliceStable(d.Flows, func(i, j int) bool {
		a, b := d.Flows[i], d.Flows[j]
		if a.Pod != b.Pod {
			return a.Pod < b.Pod
		}
		return a.Peer < b.Peer
	})
	return d, nil
}

func (d *NATDump) Tables() []Table {
	t := Table{Header: []string{"PROTO", "POD", "NODE (PEER SEES)", "PEER", "IFINDEX", "INTERFACE", "AGE", "IDLE"}}
	for _, r := range d.Flows {
		node := r.Node
		if r.ReverseOnly {
			node += " (reverse only)"
		}
		if r.Closing {
			node += " (closing)"
		}
		t.Rows = append(t.Rows, []string{r.Protocol, r.Pod, node, r.Peer, itoa(r.Ifindex), dash(r.Interface), secs(r.AgeSecs), secs(r.IdleSecs)})
	}
	t.Footer = fmt.Sprintf("%d flows; cluster CIDRs (not masqueraded): %s; counters: %s", len(d.Flows),
		dash(strings.Join(d.ClusterCIDRs, ",")), counters(d.Counters, " "))
	return []Table{t}
}
