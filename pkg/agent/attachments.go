package agent

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// AttachmentRow is one attachment as the plugin's state record has it.
type AttachmentRow struct {
	Network     string   `json:"network"`
	ContainerID string   `json:"containerID"`
	IfName      string   `json:"ifname"`
	HostIf      string   `json:"hostIf"`
	HostIfindex int      `json:"hostIfindex,omitempty"`
	IPs         []string `json:"ips"`
	Pod         string   `json:"pod,omitempty"`
	// Provisional: an ADD is making it, or died part way (DEL, GC or
	// reconcile removes it then).
	Provisional bool   `json:"provisional,omitempty"`
	Created     string `json:"created,omitempty"`
}

// Attachments lists the records of every network under stateDir.
func Attachments(stateDir string) ([]AttachmentRow, error) {
	nets, err := state.Networks(stateDir)
	if err != nil {
		return nil, err
	}
	rows := []AttachmentRow{}
	for _, n := range nets {
		recs, err := state.Store{Root: stateDir, Network: n}.List()
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			row := AttachmentRow{Network: n, ContainerID: r.ContainerID, IfName: r.IfName, HostIf: r.HostIf,
				HostIfindex: r.HostIfindex, IPs: r.IPs, Pod: r.PodLabel(), Provisional: r.Provisional}
			if row.IPs == nil {
				row.IPs = []string{}
			}
			if !r.Created.IsZero() {
				row.Created = r.Created.Format(time.RFC3339)
			}
			rows = append(rows, row)
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.Network != b.Network {
			return a.Network < b.Network
		}
		if a.ContainerID != b.ContainerID {
			return a.ContainerID < b.ContainerID
		}
		return a.IfName < b.IfName
	})
	return rows, nil
}

// WriteAttachments prints rows as an aligned table or JSON.
func WriteAttachments(w io.Writer, rows []AttachmentRow, format string) error {
	switch format {
	case "json":
		return writeJSON(w, rows)
	case "", "table":
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NETWORK\tCONTAINER\tIFNAME\tHOST VETH\tIFINDEX\tIPS\tPOD\tSTATE")
		for _, r := range rows {
			st := "complete"
			if r.Provisional {
				st = "provisional"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.Network, short(r.ContainerID), r.IfName, r.HostIf,
				r.HostIfindex, dash(strings.Join(r.IPs, ",")), dash(r.Pod), st)
		}
		return tw.Flush()
	}
	return fmt.Errorf("unknown output format %q (want table or json)", format)
}
