package inspect

import (
	"sort"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// StatsRow is one counter of one pod.
type StatsRow struct {
	Ifindex   uint32 `json:"ifindex"`
	Interface string `json:"interface,omitempty"`
	Container string `json:"containerID,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Direction string `json:"direction"`
	Reason    string `json:"reason"`
	Drop      bool   `json:"drop"`
	Packets   uint64 `json:"packets"`
	Bytes     uint64 `json:"bytes"`
}

// Stats is `dump stats`: every counter of cni_stats, summed over CPUs.
type Stats []StatsRow

// ReadStats reads cni_stats.
func ReadStats(src Source) (Stats, error) {
	m, err := datapath.OpenMaps(src.PinDir)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	all, err := m.Stats().All()
	if err != nil {
		return nil, err
	}
	names := NewNames(src.StateDir)
	var rows Stats
	for idx, cs := range all {
		container, pod := names.Pod(int(idx))
		for k, c := range cs {
			rows = append(rows, StatsRow{Ifindex: idx, Interface: names.Interface(int(idx)), Container: container, Pod: pod,
				Direction: k.Dir.String(), Reason: k.Reason.String(), Drop: k.Reason.IsDrop(), Packets: c.Packets, Bytes: c.Bytes})
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.Ifindex != b.Ifindex {
			return a.Ifindex < b.Ifindex
		}
		if a.Direction != b.Direction {
			return a.Direction < b.Direction
		}
		return a.Reason < b.Reason
	})
	return rows, nil
}

func (rows Stats) Tables() []Table {
	t := Table{Header: []string{"IFINDEX", "INTERFACE", "POD", "DIRECTION", "REASON", "PACKETS", "BYTES"}}
	for _, r := range rows {
		t.Rows = append(t.Rows, []string{itoa(r.Ifindex), dash(r.Interface), podLabel(r.Pod, r.Container), r.Direction, r.Reason,
			itoa(r.Packets), itoa(r.Bytes)})
	}
	return []Table{t}
}
