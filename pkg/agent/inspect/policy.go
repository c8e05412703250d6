package inspect

import (
	"fmt"
	"sort"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/netpol"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// PolicyRow is one pod interface's NetworkPolicy as the maps hold it: the
// mode of each direction, what it allows, the policies the agent compiled
// it from, and what the datapath dropped for it.
type PolicyRow struct {
	Ifindex   uint32 `json:"ifindex"`
	Interface string `json:"interface,omitempty"`
	Container string `json:"containerID,omitempty"`
	Pod       string `json:"pod,omitempty"`
	// Mode per direction: "open" (no policy isolates it), "isolated",
	// "pending" (not programmed yet: only the node's traffic passes).
	IngressMode string        `json:"ingressMode"`
	EgressMode  string        `json:"egressMode"`
	Policies    []string      `json:"policies,omitempty"` // from the agent's status (the maps hold no names)
	Ingress     *policy.Rules `json:"ingress,omitempty"`
	Egress      *policy.Rules `json:"egress,omitempty"`
	// Dropped counts "drop_policy" packets by direction, from the pod's view.
	Dropped      map[string]uint64 `json:"droppedPackets,omitempty"`
	ProgrammedAt string            `json:"programmedAt,omitempty"` // when the agent last wrote it
}

// Policy is `dump policy`.
type Policy []PolicyRow

// ReadPolicy reads every interface with a NetworkPolicy state from the
// maps, named by the attachment records and the agent's status (statusDir).
func ReadPolicy(src Source, statusDir string) (Policy, error) {
	m, err := datapath.OpenMaps(src.PinDir)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	states, err := m.Policy().States()
	if err != nil {
		return nil, err
	}
	sts, _ := netpol.ReadStatus(statusDir) // names only; the maps are the truth
	byIdx := map[uint32]netpol.Status{}
	for _, s := range sts {
		byIdx[s.Ifindex] = s
	}
	all, _ := m.Stats().All()
	names := NewNames(src.StateDir)
	rows := Policy{}
	for idx := range states {
		p, ok, err := m.Policy().Read(idx)
		if err != nil || !ok {
			continue // gone since the list
		}
		r := PolicyRow{Ifindex: uint32(idx), Interface: names.Interface(idx),
			IngressMode: p.Mode[policy.Ingress], EgressMode: p.Mode[policy.Egress], Ingress: &p.Ingress, Egress: &p.Egress}
		r.Container, r.Pod = names.Pod(idx)
		if s, ok := byIdx[uint32(idx)]; ok {
			r.Policies = s.Endpoint.Policies
			r.ProgrammedAt = s.Applied.Format("2006-01-02T15:04:05.000Z07:00")
		}
		for k, c := range all[uint32(idx)] {
			if k.Reason != maps.ReasonDropPolicy {
				continue
			}
			if r.Dropped == nil {
				r.Dropped = map[string]uint64{}
			}
			r.Dropped[k.Dir.String()] += c.Packets
		}
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Ifindex < rows[j].Ifindex })
	return rows, nil
}

func (rows Policy) Tables() []Table {
	t := Table{Header: []string{"IFINDEX", "INTERFACE", "POD", "POLICIES", "INGRESS", "EGRESS", "DROPPED IN", "DROPPED OUT"}}
	for _, r := range rows {
		t.Rows = append(t.Rows, []string{itoa(r.Ifindex), dash(r.Interface), podLabel(r.Pod, r.Container),
			dash(strings.Join(r.Policies, ",")), rulesText(r.IngressMode, r.Ingress), rulesText(r.EgressMode, r.Egress),
			itoa(r.Dropped["ingress"]), itoa(r.Dropped["egress"])})
	}
	t.Footer = "INGRESS/EGRESS: open (no policy isolates the direction), pending (not programmed yet: only the node's traffic), or the peer prefixes allowed (longest prefix wins) with their ports; replies of allowed flows pass either way."
	return []Table{t}
}

// rulesText is one direction in a line: its mode, or each prefix with its
// ports ("none" when isolated with nothing allowed).
func rulesText(mode string, r *policy.Rules) string {
	if mode != "isolated" || r == nil {
		return mode
	}
	var parts []string
	for _, a := range r.Allows {
		if a.AllPorts {
			parts = append(parts, a.Prefix.String())
			continue
		}
		var ps []string
		for _, p := range a.Ports {
			ps = append(ps, portText(p))
		}
		parts = append(parts, a.Prefix.String()+" "+dash(strings.Join(ps, ",")))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

func portText(p policy.PortRange) string {
	proto := map[uint8]string{policy.ProtoTCP: "tcp", policy.ProtoUDP: "udp", policy.ProtoSCTP: "sctp"}[p.Proto]
	if proto == "" {
		proto = fmt.Sprintf("proto%d", p.Proto)
	}
	if p.First == p.Last {
		return fmt.Sprintf("%s/%d", proto, p.First)
	}
	return fmt.Sprintf("%s/%d-%d", proto, p.First, p.Last)
}
