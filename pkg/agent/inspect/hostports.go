package inspect

import (
	"fmt"
	"sort"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// HostPortRow is one entry of cni_hostports.
type HostPortRow struct {
	HostIP        string `json:"hostIP"` // "" = every node address
	Family        string `json:"family"` // ipv4 or ipv6
	Protocol      string `json:"protocol"`
	HostPort      uint16 `json:"hostPort"`
	PodIP         string `json:"podIP"`
	ContainerPort uint16 `json:"containerPort"`
	Ifindex       int    `json:"ifindex"`
	Interface     string `json:"interface,omitempty"`
	Container     string `json:"containerID,omitempty"`
	Pod           string `json:"pod,omitempty"`
}

// HostPorts is `dump hostports`: the node's mappings with their pods.
type HostPorts []HostPortRow

// ReadHostPorts reads cni_hostports.
func ReadHostPorts(src Source) (HostPorts, error) {
	m, err := datapath.OpenMaps(src.PinDir)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	hps, err := m.HostPorts().List()
	if err != nil {
		return nil, fmt.Errorf("read hostports: %w", err)
	}
	names := NewNames(src.StateDir)
	rows := make(HostPorts, 0, len(hps))
	for _, h := range hps {
		r := HostPortRow{
			Family: family(h.IPv6), Protocol: maps.ProtoName(h.Proto), HostPort: h.HostPort,
			PodIP: h.PodIP.String(), ContainerPort: h.PodPort, Ifindex: h.Ifindex, Interface: names.Interface(h.Ifindex),
		}
		if h.HostIP != nil {
			r.HostIP = h.HostIP.String()
		}
		r.Container, r.Pod = names.Pod(h.Ifindex)
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.HostPort != b.HostPort {
			return a.HostPort < b.HostPort
		}
		if a.Protocol != b.Protocol {
			return a.Protocol < b.Protocol
		}
		if a.Family != b.Family {
			return a.Family < b.Family
		}
		return a.HostIP < b.HostIP
	})
	return rows, nil
}

func (rows HostPorts) Tables() []Table {
	t := Table{Header: []string{"HOST IP", "HOST PORT", "PROTO", "POD IP", "POD PORT", "IFINDEX", "INTERFACE", "POD"}}
	for _, r := range rows {
		host := r.HostIP
		if host == "" {
			host = "*"
			if r.Family == "ipv6" {
				host = "[*]"
			}
		}
		t.Rows = append(t.Rows, []string{host, itoa(r.HostPort), r.Protocol, r.PodIP, itoa(r.ContainerPort), itoa(r.Ifindex),
			dash(r.Interface), podLabel(r.Pod, r.Container)})
	}
	return []Table{t}
}
