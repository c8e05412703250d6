package inspect

import (
	"fmt"
	"sort"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// EndpointRow is one pod IP as the endpoints map and the counters see it.
type EndpointRow struct {
	IP        string `json:"ip"`
	Ifindex   uint32 `json:"ifindex"`
	Interface string `json:"interface,omitempty"`
	PodMAC    string `json:"podMAC"`
	HostMAC   string `json:"hostMAC"`
	Container string `json:"containerID,omitempty"`
	Pod       string `json:"pod,omitempty"`
	// Attach is how the host veth's hooks are attached (datapath.State*):
	// tcx, tc, "tc, tcx pending" (the agent moves it when no verb runs).
	Attach string `json:"attach"`

	RxPackets uint64            `json:"rxPackets"` // into the pod
	RxBytes   uint64            `json:"rxBytes"`
	TxPackets uint64            `json:"txPackets"` // from the pod
	TxBytes   uint64            `json:"txBytes"`
	Drops     map[string]uint64 `json:"drops"`
}

// Endpoints is `dump endpoints`: pod IPs with interfaces, pods and counters.
type Endpoints []EndpointRow

// ReadEndpoints reads the endpoints and counters maps.
func ReadEndpoints(src Source) (Endpoints, error) {
	m, err := datapath.OpenMaps(src.PinDir)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	eps, err := m.Endpoints().List()
	if err != nil {
		return nil, fmt.Errorf("read endpoints: %w", err)
	}
	counters, err := m.Stats().All()
	if err != nil {
		return nil, fmt.Errorf("read counters: %w", err)
	}
	names := NewNames(src.StateDir)
	rows := make(Endpoints, 0, len(eps))
	for _, ep := range eps {
		idx := int(ep.Info.Ifindex)
		r := EndpointRow{
			IP: ep.IP.String(), Ifindex: ep.Info.Ifindex, Interface: names.Interface(idx),
			PodMAC: macString(ep.Info.Mac), HostMAC: macString(ep.Info.HostMac), Drops: map[string]uint64{},
		}
		r.Container, r.Pod = names.Pod(idx)
		r.Attach = names.Attach(src.PinDir, idx)
		for k, c := range counters[ep.Info.Ifindex] {
			switch {
			case k.Reason.IsDrop():
				r.Drops[k.Reason.String()] += c.Packets
			case k.Dir == maps.DirIngress:
				r.RxPackets += c.Packets
				r.RxBytes += c.Bytes
			default:
				r.TxPackets += c.Packets
				r.TxBytes += c.Bytes
			}
		}
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Ifindex != rows[j].Ifindex {
			return rows[i].Ifindex < rows[j].Ifindex
		}
		return rows[i].IP < rows[j].IP
	})
	return rows, nil
}

func (rows Endpoints) Tables() []Table {
	t := Table{Header: []string{"IP", "IFINDEX", "INTERFACE", "ATTACH", "POD MAC", "POD", "RX PKTS", "RX BYTES", "TX PKTS", "TX BYTES", "DROPS"}}
	for _, r := range rows {
		drops := "0"
		if len(r.Drops) > 0 {
			drops = counters(r.Drops, ",")
		}
		t.Rows = append(t.Rows, []string{r.IP, itoa(r.Ifindex), dash(r.Interface), r.Attach, r.PodMAC, podLabel(r.Pod, r.Container),
			itoa(r.RxPackets), itoa(r.RxBytes), itoa(r.TxPackets), itoa(r.TxBytes), drops})
	}
	return []Table{t}
}
