package inspect

import (
	"fmt"
	"sort"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
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

// Bandwidth is `dump bandwidth`: per-pod rate limits with passed and
// dropped traffic.
type Bandwidth []BandwidthRow

// ReadBandwidth reads the cni_bandwidth buckets and their counters.
func ReadBandwidth(src Source) (Bandwidth, error) {
	m, err := datapath.OpenMaps(src.PinDir)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	lims, err := m.Bandwidth().ListLimits()
	if err != nil {
		return nil, fmt.Errorf("read limits: %w", err)
	}
	names := NewNames(src.StateDir)
	rows := make(Bandwidth, 0, len(lims))
	for _, l := range lims {
		idx := int(l.Ifindex)
		r := BandwidthRow{Ifindex: l.Ifindex, Interface: names.Interface(idx), Direction: l.Dir.String(),
			RateBps: l.Limit.RateBps, BurstBits: l.Limit.BurstBits, QueueNs: l.Limit.QueueNs, MarkNs: l.Limit.MarkNs}
		if r.QueueNs != 0 {
			r.Queue = "htb"
		}
		r.Container, r.Pod = names.Pod(idx)
		cs, err := m.Stats().Counters(idx)
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

func (rows Bandwidth) Tables() []Table {
	t := Table{Header: []string{"IFINDEX", "INTERFACE", "POD", "DIRECTION", "RATE", "BURST", "QUEUE", "PACKETS", "BYTES", "DROPPED PKTS", "DROPPED BYTES"}}
	for _, r := range rows {
		queue := "-"
		if r.Queue != "" {
			queue = fmt.Sprintf("%s %s, CE over %s", r.Queue, time.Duration(r.QueueNs), time.Duration(r.MarkNs))
		}
		t.Rows = append(t.Rows, []string{itoa(r.Ifindex), dash(r.Interface), podLabel(r.Pod, r.Container), r.Direction,
			humanBits(r.RateBps, "bit/s"), humanBits(r.BurstBits, "bit"), queue, itoa(r.Packets), itoa(r.Bytes), itoa(r.DropPackets), itoa(r.DropBytes)})
	}
	return []Table{t}
}
