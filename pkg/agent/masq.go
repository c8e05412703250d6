package agent

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
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

// NATDump is what `dump nat` shows.
type NATDump struct {
	Flows        []NATRow          `json:"flows"`
	ClusterCIDRs []string          `json:"clusterCIDRs"`
	Counters     map[string]uint64 `json:"counters"`
}

// NAT reads the masquerade table, cluster CIDRs and counters under pinRoot.
func NAT(pinRoot string) (*NATDump, error) {
	m, err := datapath.OpenMaps(pinRoot)
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
	names := map[int]string{}
	for _, f := range flows {
		if _, ok := names[f.Ifindex]; !ok {
			names[f.Ifindex] = ifName(f.Ifindex)
		}
		d.Flows = append(d.Flows, NATRow{
			Protocol: maps.ProtoName(f.Proto), Pod: f.Pod.String(), Node: f.Node.String(), Peer: f.Peer.String(),
			Ifindex: f.Ifindex, Interface: names[f.Ifindex], AgeSecs: f.Age.Round(time.Millisecond).Seconds(),
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

// WriteNAT prints the dump as an aligned table or JSON.
func WriteNAT(w io.Writer, d *NATDump, format string) error {
	switch format {
	case "json":
		return writeJSON(w, d)
	case "", "table":
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PROTO\tPOD\tNODE (PEER SEES)\tPEER\tIFINDEX\tINTERFACE\tAGE\tIDLE")
		for _, r := range d.Flows {
			node := r.Node
			if r.ReverseOnly {
				node += " (reverse only)"
			}
			if r.Closing {
				node += " (closing)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.Protocol, r.Pod, node, r.Peer, r.Ifindex, dash(r.Interface),
				secs(r.AgeSecs), secs(r.IdleSecs))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		keys := make([]string, 0, len(d.Counters))
		for k := range d.Counters {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s=%d", k, d.Counters[k]))
		}
		_, err := fmt.Fprintf(w, "\n%d flows; cluster CIDRs (not masqueraded): %s; counters: %s\n", len(d.Flows),
			dash(strings.Join(d.ClusterCIDRs, ",")), strings.Join(parts, " "))
		return err
	}
	return fmt.Errorf("unknown output format %q (want table or json)", format)
}

func secs(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
}
