package inspect

import (
	"sort"
	"strings"
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

// Attachments is `dump attachments`: the plugin's records, one per
// attachment, complete or provisional.
type Attachments []AttachmentRow

// ReadAttachments lists the records of every network under the state directory.
func ReadAttachments(src Source) (Attachments, error) {
	nets, err := state.Networks(src.StateDir)
	if err != nil {
		return nil, err
	}
	rows := Attachments{}
	for _, n := range nets {
		recs, err := state.Store{Root: src.StateDir, Network: n}.List()
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

func (rows Attachments) Tables() []Table {
	t := Table{Header: []string{"NETWORK", "CONTAINER", "IFNAME", "HOST VETH", "IFINDEX", "IPS", "POD", "STATE"}}
	for _, r := range rows {
		st := "complete"
		if r.Provisional {
			st = "provisional"
		}
		t.Rows = append(t.Rows, []string{r.Network, short(r.ContainerID), r.IfName, r.HostIf, itoa(r.HostIfindex),
			dash(strings.Join(r.IPs, ",")), dash(r.Pod), st})
	}
	return []Table{t}
}
