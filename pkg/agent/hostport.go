package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vishvananda/netlink"

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

func ifName(idx int) string {
	if l, err := netlink.LinkByIndex(idx); err == nil {
		return l.Attrs().Name
	}
	return ""
}

func family(v6 bool) string {
	if v6 {
		return "ipv6"
	}
	return "ipv4"
}

// HostPorts reads the hostPort mappings of the node under pinRoot.
func HostPorts(pinRoot, stateDir string) ([]HostPortRow, error) {
	m, err := datapath.OpenMaps(pinRoot)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	hps, err := m.ListHostPorts()
	if err != nil {
		return nil, fmt.Errorf("read hostports: %w", err)
	}
	recs := records(stateDir)
	rows := make([]HostPortRow, 0, len(hps))
	for _, h := range hps {
		r := HostPortRow{
			Family: family(h.IPv6), Protocol: maps.ProtoName(h.Proto), HostPort: h.HostPort,
			PodIP: h.PodIP.String(), ContainerPort: h.PodPort, Ifindex: h.Ifindex, Interface: ifName(h.Ifindex),
		}
		if h.HostIP != nil {
			r.HostIP = h.HostIP.String()
		}
		rec := recs[uint32(h.Ifindex)]
		r.Container, r.Pod = rec.ContainerID, rec.PodLabel()
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

// WriteHostPorts prints rows as an aligned table or JSON.
func WriteHostPorts(w io.Writer, rows []HostPortRow, format string) error {
	switch format {
	case "json":
		return writeJSON(w, rows)
	case "", "table":
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "HOST IP\tHOST PORT\tPROTO\tPOD IP\tPOD PORT\tIFINDEX\tINTERFACE\tPOD")
		for _, r := range rows {
			host := r.HostIP
			if host == "" {
				host = "*"
				if r.Family == "ipv6" {
					host = "[*]"
				}
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\n", host, r.HostPort, r.Protocol, r.PodIP,
				r.ContainerPort, r.Ifindex, dash(r.Interface), podLabel(r.Pod, r.Container))
		}
		return tw.Flush()
	}
	return fmt.Errorf("unknown output format %q (want table or json)", format)
}

// CTRow is one translated flow (cni_ct), node socket (cni_sock_rnat), or
// flow the kernel stack delivered to a pod (cni_stack_flows).
type CTRow struct {
	// "nat": packets translated; "socket": a node socket's destination
	// rewritten; "stack/pod", "stack/node", "stack/inbound": replies go
	// back through the stack (the peer is a pod of the node, a node
	// address, or a host that reached a masquerading pod directly).
	Kind      string  `json:"kind"`
	Protocol  string  `json:"protocol,omitempty"`
	Client    string  `json:"client,omitempty"` // who connected (nat)
	Cookie    uint64  `json:"socketCookie,omitempty"`
	Dialled   string  `json:"dialled"`           // what the client asked for
	Pod       string  `json:"pod"`               // where it goes
	PodSees   string  `json:"podSees,omitempty"` // the peer the pod sees (nat)
	SNAT      bool    `json:"snat,omitempty"`
	Ifindex   int     `json:"ifindex"`
	Interface string  `json:"interface,omitempty"`
	AgeSecs   float64 `json:"ageSeconds,omitempty"`
	IdleSecs  float64 `json:"idleSeconds,omitempty"` // stack flows: since the stack last delivered a packet
}

// CTDump is what `dump ct` shows: flows, node sockets and counters.
type CTDump struct {
	Flows    []CTRow           `json:"flows"`
	Counters map[string]uint64 `json:"counters"`
}

// CT reads the hostPort flow table, socket table, stack flows and counters under pinRoot.
func CT(pinRoot string) (*CTDump, error) {
	m, err := datapath.OpenMaps(pinRoot)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	flows, err := m.ListCT()
	if err != nil {
		return nil, fmt.Errorf("read ct: %w", err)
	}
	socks, err := m.ListSockRNAT()
	if err != nil {
		return nil, fmt.Errorf("read socket table: %w", err)
	}
	d := &CTDump{Flows: []CTRow{}}
	if d.Counters, err = m.HostPortStats(); err != nil {
		return nil, err
	}
	names := map[int]string{}
	name := func(idx int) string {
		if n, ok := names[idx]; ok {
			return n
		}
		names[idx] = ifName(idx)
		return names[idx]
	}
	for _, f := range flows {
		d.Flows = append(d.Flows, CTRow{
			Kind: "nat", Protocol: maps.ProtoName(f.Proto), Client: f.Client.String(), Dialled: f.Dialled.String(),
			Pod: f.Pod.String(), PodSees: f.Peer.String(), SNAT: f.SNAT, Ifindex: f.Ifindex, Interface: name(f.Ifindex),
			AgeSecs: f.Age.Round(time.Millisecond).Seconds(),
		})
	}
	sflows, err := m.ListStackFlows()
	if err != nil {
		return nil, err
	}
	for _, f := range sflows {
		d.Flows = append(d.Flows, CTRow{
			Kind: "stack/" + f.Kind(), Protocol: maps.ProtoName(f.Proto), Client: f.Peer.String(), Pod: f.Pod.String(),
			PodSees: f.Peer.String(), Ifindex: f.Ifindex, Interface: name(f.Ifindex),
			IdleSecs: f.Idle.Round(time.Millisecond).Seconds(),
		})
	}
	for _, s := range socks {
		d.Flows = append(d.Flows, CTRow{
			Kind: "socket", Cookie: s.Cookie, Dialled: s.Dialled.String(), Pod: s.Pod.String(),
			Ifindex: s.Ifindex, Interface: name(s.Ifindex),
		})
	}
	sort.SliceStable(d.Flows, func(i, j int) bool {
		a, b := d.Flows[i], d.Flows[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Pod != b.Pod {
			return a.Pod < b.Pod
		}
		return a.Client < b.Client
	})
	return d, nil
}

// WriteCT prints the dump as aligned tables or JSON.
func WriteCT(w io.Writer, d *CTDump, format string) error {
	switch format {
	case "json":
		return writeJSON(w, d)
	case "", "table":
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KIND\tPROTO\tCLIENT\tDIALLED\tPOD\tPOD SEES\tIFINDEX\tINTERFACE\tAGE")
		for _, r := range d.Flows {
			client, proto, sees, age := r.Client, r.Protocol, r.PodSees, "-"
			if r.Kind == "socket" {
				client = fmt.Sprintf("socket %d", r.Cookie)
			}
			if r.SNAT {
				sees += " (snat)"
			}
			if r.AgeSecs > 0 {
				age = (time.Duration(r.AgeSecs * float64(time.Second))).Round(time.Second).String()
			}
			if strings.HasPrefix(r.Kind, "stack/") {
				age = "idle " + (time.Duration(r.IdleSecs * float64(time.Second))).Round(time.Second).String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Kind, dash(proto), client, r.Dialled, r.Pod,
				dash(sees), r.Ifindex, dash(r.Interface), age)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		keys := make([]string, 0, len(d.Counters))
		for k := range d.Counters {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s=%d", k, d.Counters[k]))
		}
		_, err := fmt.Fprintf(w, "\n%d entries; counters: %s\n", len(d.Flows), strings.Join(parts, " "))
		return err
	}
	return fmt.Errorf("unknown output format %q (want table or json)", format)
}

// writeJSON is the -o json form of every dump.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
