package inspect

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// CTRow is one translated flow (cni_ct), node socket (cni_sock_rnat),
// flow the kernel stack delivered to a pod (cni_stack_flows), or flow a
// pod's NetworkPolicy allowed (cni_pol_ct_parts).
type CTRow struct {
	// "nat": packets translated; "socket": a node socket's destination
	// rewritten; "stack/pod", "stack/node", "stack/inbound": replies go
	// back through the stack (the peer is a pod of the node or a node
	// address; "inbound" rows come from programs before issue 28 only);
	// "policy/egress", "policy/ingress": the pod opened the flow, or the
	// peer did, and its policy allowed it, so its packets pass until the
	// entry expires even if the policy changed ("/deferred": judged after
	// the stack's translation, only replies pass by it; "/pending": not
	// confirmed by that judgement yet, nothing enters by it).
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
	IdleSecs  float64 `json:"idleSeconds,omitempty"` // nat: since the last packet; stack flows: since the stack last delivered one
	// State (nat): syn-sent, syn-recv, established, fin-wait, closing
	// (TCP); unreplied, replied, stream (UDP). ExpiresSecs: the idle time
	// left before the flow is deleted.
	State       string  `json:"state,omitempty"`
	ExpiresSecs float64 `json:"expiresSeconds,omitempty"`
}

// CTDump is `dump ct`: flows, node sockets and the hostPort counters.
type CTDump struct {
	Flows    []CTRow           `json:"flows"`
	Counters map[string]uint64 `json:"counters"`
}

// ReadCT reads the hostPort flow table, socket table, stack flows and counters.
func ReadCT(src Source) (*CTDump, error) {
	m, err := datapath.OpenMaps(src.PinDir)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	flows, err := m.HostPorts().ListCT()
	if err != nil {
		return nil, fmt.Errorf("read ct: %w", err)
	}
	socks, err := m.HostPorts().ListSockRNAT()
	if err != nil {
		return nil, fmt.Errorf("read socket table: %w", err)
	}
	sflows, err := m.StackFlows().List()
	if err != nil {
		return nil, err
	}
	d := &CTDump{Flows: []CTRow{}}
	if d.Counters, err = m.HostPorts().Stats(); err != nil {
		return nil, err
	}
	names := NewNames(src.StateDir)
	for _, f := range flows {
		left := max(0, maps.FlowTimeout(f.Proto, f.Flags)-f.Idle)
		d.Flows = append(d.Flows, CTRow{
			Kind: "nat", Protocol: maps.ProtoName(f.Proto), Client: f.Client.String(), Dialled: f.Dialled.String(),
			Pod: f.Pod.String(), PodSees: f.Peer.String(), SNAT: f.SNAT, Ifindex: f.Ifindex, Interface: names.Interface(f.Ifindex),
			AgeSecs: f.Age.Round(time.Millisecond).Seconds(), IdleSecs: f.Idle.Round(time.Millisecond).Seconds(),
			State: f.State, ExpiresSecs: left.Round(time.Millisecond).Seconds(),
		})
	}
	for _, f := range sflows {
		d.Flows = append(d.Flows, CTRow{
			Kind: "stack/" + f.Kind(), Protocol: maps.ProtoName(f.Proto), Client: f.Peer.String(), Pod: f.Pod.String(),
			PodSees: f.Peer.String(), Ifindex: f.Ifindex, Interface: names.Interface(f.Ifindex),
			IdleSecs: f.Idle.Round(time.Millisecond).Seconds(),
		})
	}
	pflows, err := m.Policy().ListFlows()
	if err != nil {
		return nil, err
	}
	for _, f := range pflows {
		d.Flows = append(d.Flows, policyFlowRow(f, names))
	}
	for _, s := range socks {
		d.Flows = append(d.Flows, CTRow{
			Kind: "socket", Cookie: s.Cookie, Dialled: s.Dialled.String(), Pod: s.Pod.String(),
			Ifindex: s.Ifindex, Interface: names.Interface(s.Ifindex),
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

// policyFlowRow is a policy flow as a row; SNAT: the peer reached the pod
// masqueraded, so its packets are judged each time (PodSees is the node).
func policyFlowRow(f maps.PolicyFlow, names *Names) CTRow {
	r := CTRow{Kind: "policy/ingress", Protocol: maps.ProtoName(f.Proto), Client: f.Peer.String(), Dialled: f.Pod.String(),
		Pod: f.Pod.String(), PodSees: f.Peer.String(), SNAT: f.Flags&maps.PolicyCTSnat != 0,
		Ifindex: f.Ifindex, Interface: names.Interface(f.Ifindex)}
	if f.Egress {
		r.Kind, r.Client, r.Dialled = "policy/egress", f.Pod.String(), f.Peer.String()
	}
	if f.Defer {
		r.Kind += "/deferred"
	}
	if f.Flags&maps.PolicyCTPending != 0 {
		r.Kind += "/pending"
	}
	return r
}

func (d *CTDump) Tables() []Table {
	t := Table{Header: []string{"KIND", "PROTO", "CLIENT", "DIALLED", "POD", "POD SEES", "IFINDEX", "INTERFACE", "STATE", "AGE"}}
	for _, r := range d.Flows {
		client, sees, age, state := r.Client, r.PodSees, "-", dash(r.State)
		if r.Kind == "socket" {
			client = fmt.Sprintf("socket %d", r.Cookie)
		}
		if r.SNAT {
			sees += " (snat)"
		}
		if r.AgeSecs > 0 {
			age = secs(r.AgeSecs)
		}
		if strings.HasPrefix(r.Kind, "stack/") {
			age = "idle " + secs(r.IdleSecs)
		}
		if r.State != "" {
			state += fmt.Sprintf(" (idle %s, expires in %s)", secs(r.IdleSecs), secs(r.ExpiresSecs))
		}
		t.Rows = append(t.Rows, []string{r.Kind, dash(r.Protocol), client, r.Dialled, r.Pod, dash(sees), itoa(r.Ifindex), dash(r.Interface), state, age})
	}
	t.Footer = fmt.Sprintf("%d entries; counters: %s", len(d.Flows), counters(d.Counters, " "))
	return []Table{t}
}
