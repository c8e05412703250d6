package agent

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// BandwidthRow is one direction's limit of one pod, with what passed and what
// was dropped for exceeding it.
type BandwidthRow struct {
	Ifindex   uint32 `json:"ifindex"`
	Interface string `json:"interface,omitempty"`
	Container string `json:"containerID,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Direction string `json:"direction"` // ingress: into the pod
	RateBps   uint64 `json:"rateBitsPerSecond"`
	BurstBits uint64 `json:"burstBits"`
	// Queue is "htb" when an ingress queue drains the bucket, "" when the
	// bucket polices alone; QueueNs its capacity, MarkNs the backlog over
	// which ECN-capable packets entering it are marked CE.
	Queue       string `json:"queue,omitempty"`
	QueueNs     uint64 `json:"queueNs,omitempty"`
	MarkNs      uint64 `json:"markNs,omitempty"`
	Packets     uint64 `json:"packets"`
	Bytes       uint64 `json:"bytes"`
	DropPackets uint64 `json:"dropPackets"`
	DropBytes   uint64 `json:"dropBytes"`
}

// Bandwidth reads the cni_bandwidth buckets and their counters under pinRoot.
func Bandwidth(pinRoot, stateDir string) ([]BandwidthRow, error) {
	m, err := maps.Open(pinRoot)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	lims, err := m.ListLimits()
	if err != nil {
		return nil, fmt.Errorf("read limits: %w", err)
	}
	recs := records(stateDir)
	rows := make([]BandwidthRow, 0, len(lims))
	for _, l := range lims {
		r := BandwidthRow{Ifindex: l.Ifindex, Direction: l.Dir.String(), RateBps: l.Limit.RateBps, BurstBits: l.Limit.BurstBits,
			QueueNs: l.Limit.QueueNs, MarkNs: l.Limit.MarkNs}
		if r.QueueNs != 0 {
			r.Queue = "htb"
		}
		r.Interface = ifName(int(l.Ifindex))
		rec := recs[l.Ifindex]
		r.Container, r.Pod = rec.ContainerID, rec.name()
		cs, err := m.Counters(int(l.Ifindex))
		if err != nil {
			return nil, err
		}
		for k, c := range cs {
			if k.Dir != l.Dir {
				continue
			}
			if k.Reason == maps.ReasonDropBandwidth {
				r.DropPackets += c.Packets
				r.DropBytes += c.Bytes
			} else if !k.Reason.IsDrop() {
				r.Packets += c.Packets
				r.Bytes += c.Bytes
			}
		}
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Ifindex != rows[j].Ifindex {
			return rows[i].Ifindex < rows[j].Ifindex
		}
		return rows[i].Direction < rows[j].Direction
	})
	return rows, nil
}

// WriteBandwidth prints rows as an aligned table or JSON.
func WriteBandwidth(w io.Writer, rows []BandwidthRow, format string) error {
	switch format {
	case "json":
		return writeJSON(w, rows)
	case "", "table":
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "IFINDEX\tINTERFACE\tPOD\tDIRECTION\tRATE\tBURST\tQUEUE\tPACKETS\tBYTES\tDROPPED PKTS\tDROPPED BYTES")
		for _, r := range rows {
			queue := "-"
			if r.Queue != "" {
				queue = fmt.Sprintf("%s %s, CE over %s", r.Queue, time.Duration(r.QueueNs), time.Duration(r.MarkNs))
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", r.Ifindex, dash(r.Interface), podLabel(r.Pod, r.Container), r.Direction,
				humanBits(r.RateBps, "bit/s"), humanBits(r.BurstBits, "bit"), queue, r.Packets, r.Bytes, r.DropPackets, r.DropBytes)
		}
		return tw.Flush()
	}
	return fmt.Errorf("unknown output format %q (want table or json)", format)
}

func humanBits(v uint64, unit string) string {
	switch {
	case v >= 1e9 && v%1e6 == 0:
		return fmt.Sprintf("%gG%s", float64(v)/1e9, unit)
	case v >= 1e6 && v%1e3 == 0:
		return fmt.Sprintf("%gM%s", float64(v)/1e6, unit)
	case v >= 1e3:
		return fmt.Sprintf("%gk%s", float64(v)/1e3, unit)
	}
	return fmt.Sprintf("%d%s", v, unit)
}
