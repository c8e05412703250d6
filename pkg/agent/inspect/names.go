package inspect

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Names resolves what the maps know by a host veth's ifindex: the veth's
// name in this netns and the pod of the attachment's record.
type Names struct {
	recs    map[int]netRecord
	ifs     map[int]string
	attachs map[int]string
}

// netRecord is an attachment's record and its network (the alias a host
// veth carries names the network).
type netRecord struct {
	*state.Record
	network string
}

// recordsByHostIfindex reads the records of every network under stateDir,
// indexed by their host veth's ifindex (as state.ByHostIfindex); a missing
// or unreadable directory, or network, just means fewer records.
func recordsByHostIfindex(stateDir string) map[int]netRecord {
	out := map[int]netRecord{}
	nets, _ := state.Networks(stateDir)
	for _, n := range nets {
		rs, _ := state.Store{Root: stateDir, Network: n}.List()
		for idx, r := range state.ByHostIfindex(rs) {
			out[idx] = netRecord{r, n}
		}
	}
	return out
}

// NewNames reads the records of every network under stateDir; a missing or
// unreadable directory just means no pod names.
func NewNames(stateDir string) *Names {
	return &Names{recs: recordsByHostIfindex(stateDir), ifs: map[int]string{}, attachs: map[int]string{}}
}

// Attach is how the hooks of the host veth with that ifindex are attached
// (datapath.AttachmentOf): the link pins of the veth a record names
// (endpoint.RecordedHostVeth) are under the record's host veth name,
// whatever the link's name now (an operator may have renamed it); any
// other link's, under its own name.
func (n *Names) Attach(pinDir string, idx int) string {
	if a, ok := n.attachs[idx]; ok {
		return a
	}
	name := n.Interface(idx)
	if r, ok := n.recs[idx]; ok {
		if l, err := netlink.LinkByIndex(idx); err == nil && endpoint.RecordedHostVeth(l, r.Record, r.network) {
			name = state.HostIfName(r.ContainerID, r.IfName)
		}
	}
	a := datapath.AttachmentOf(pinDir, idx, name)
	n.attachs[idx] = a
	return a
}

// Interface is the name of the link with that ifindex, "" when there is none.
func (n *Names) Interface(idx int) string {
	if name, ok := n.ifs[idx]; ok {
		return name
	}
	name := ""
	if l, err := netlink.LinkByIndex(idx); err == nil {
		name = l.Attrs().Name
	}
	n.ifs[idx] = name
	return name
}

// Pod is the container ID and "namespace/name" (when the runtime passed
// K8S_POD_*) of the attachment behind a host veth.
func (n *Names) Pod(idx int) (container, pod string) {
	if r, ok := n.recs[idx]; ok {
		return r.ContainerID, r.PodLabel()
	}
	return "", ""
}

// podLabel is what the tables show for a pod: its name, else the start of
// its container ID, else "-".
func podLabel(pod, container string) string {
	if pod != "" {
		return pod
	}
	return dash(short(container))
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

// counters renders named counts as "a=1 b=2", sorted.
func counters(c map[string]uint64, sep string) string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, c[k]))
	}
	return strings.Join(parts, sep)
}

func macString(b [6]uint8) string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
}

func family(v6 bool) string {
	if v6 {
		return "ipv6"
	}
	return "ipv4"
}

func humanBits(v uint64, unit string) string {
	switch {
	case v >= 1e9 && v%1e6 == 0:
		return fmt.Sprintf("%gG%s", float64(v)/1e9, unit)
	case v >= 1e6 && v%1e3 == 0:
		return fmt.Sprintf("%gM%s", float64(v)/1e6, unit)
	case v >= 1e3:
		return fmt.Sprintf("%gk%s", float64(v)/1e3, unit)
	}
	return fmt.Sprintf("%d%s", v, unit)
}

func secs(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
}

func itoa[T ~int | ~uint16 | ~uint32 | ~uint64](v T) string { return fmt.Sprint(v) }
