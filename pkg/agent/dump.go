package agent

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/ebpf-cni/ebpf-cni/pkg/cni"
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

	RxPackets uint64            `json:"rxPackets"` // into the pod
	RxBytes   uint64            `json:"rxBytes"`
	TxPackets uint64            `json:"txPackets"` // from the pod
	TxBytes   uint64            `json:"txBytes"`
	Drops     map[string]uint64 `json:"drops"`
}

// podRecord is the part of the plugin's state record the dump shows.
type podRecord struct {
	ContainerID  string `json:"containerID"`
	HostIfindex  int    `json:"hostIfindex"`
	PodNamespace string `json:"podNamespace"`
	PodName      string `json:"podName"`
}

// name is "namespace/name" when the runtime passed K8S_POD_*, else "".
func (r podRecord) name() string {
	if r.PodName == "" {
		return ""
	}
	return r.PodNamespace + "/" + r.PodName
}

// podLabel is what the tables show for a pod: its name, else the start of
// its container ID, else "-".
func podLabel(pod, container string) string {
	if pod != "" {
		return pod
	}
	return dash(short(container))
}

// records reads the plugin's per-attachment records of every network, keyed
// by host ifindex. A missing or unreadable directory just means no names.
func records(stateDir string) map[uint32]podRecord {
	out := make(map[uint32]podRecord)
	recs, _ := cni.ListAllRecords(stateDir)
	for _, r := range recs {
		if r.HostIfindex > 0 {
			out[uint32(r.HostIfindex)] = podRecord{ContainerID: r.ContainerID, HostIfindex: r.HostIfindex,
				PodNamespace: r.PodNamespace, PodName: r.PodName}
		}
	}
	return out
}

// Endpoints reads the endpoints and counters maps under pinRoot.
func Endpoints(pinRoot, stateDir string) ([]EndpointRow, error) {
	m, err := maps.Open(pinRoot)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	eps, err := m.ListEndpoints()
	if err != nil {
		return nil, fmt.Errorf("read endpoints: %w", err)
	}
	counters, err := m.AllCounters()
	if err != nil {
		return nil, fmt.Errorf("read counters: %w", err)
	}
	recs := records(stateDir)
	rows := make([]EndpointRow, 0, len(eps))
	for _, ep := range eps {
		r := EndpointRow{
			IP:      ep.IP.String(),
			Ifindex: ep.Info.Ifindex,
			PodMAC:  macString(ep.Info.Mac),
			HostMAC: macString(ep.Info.HostMac),
			Drops:   map[string]uint64{},
		}
		r.Interface = ifName(int(ep.Info.Ifindex))
		rec := recs[ep.Info.Ifindex]
		r.Container, r.Pod = rec.ContainerID, rec.name()
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

func macString(b [6]uint8) string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
}

// WriteEndpoints prints rows as an aligned table or, with format "json", JSON.
func WriteEndpoints(w io.Writer, rows []EndpointRow, format string) error {
	switch format {
	case "json":
		return writeJSON(w, rows)
	case "", "table":
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "IP\tIFINDEX\tINTERFACE\tPOD MAC\tPOD\tRX PKTS\tRX BYTES\tTX PKTS\tTX BYTES\tDROPS")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", r.IP, r.Ifindex, dash(r.Interface), r.PodMAC,
				podLabel(r.Pod, r.Container), r.RxPackets, r.RxBytes, r.TxPackets, r.TxBytes, drops(r.Drops))
		}
		return tw.Flush()
	}
	return fmt.Errorf("unknown output format %q (want table or json)", format)
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func drops(d map[string]uint64) string {
	if len(d) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, d[k]))
	}
	return strings.Join(parts, ",")
}
