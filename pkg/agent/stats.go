package agent

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

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

// Stats reads every counter of cni_stats, summed over CPUs.
func Stats(pinRoot, stateDir string) ([]StatsRow, error) {
	m, err := datapath.OpenMaps(pinRoot)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	all, err := m.AllCounters()
	if err != nil {
		return nil, err
	}
	recs := records(stateDir)
	var rows []StatsRow
	for idx, cs := range all {
		name, rec := ifName(int(idx)), recs[idx]
		pod := rec.PodLabel()
		for k, c := range cs {
			rows = append(rows, StatsRow{Ifindex: idx, Interface: name, Container: rec.ContainerID, Pod: pod,
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

// WriteStats prints rows as a table or JSON.
func WriteStats(w io.Writer, rows []StatsRow, format string) error {
	switch format {
	case "json":
		return writeJSON(w, rows)
	case "", "table":
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "IFINDEX\tINTERFACE\tPOD\tDIRECTION\tREASON\tPACKETS\tBYTES")
		for _, r := range rows {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\n", r.Ifindex, dash(r.Interface), podLabel(r.Pod, r.Container), r.Direction, r.Reason, r.Packets, r.Bytes)
		}
		return tw.Flush()
	}
	return fmt.Errorf("unknown output format %q (want table or json)", format)
}
