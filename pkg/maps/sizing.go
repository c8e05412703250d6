package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Sizing is what the node's maps are sized for. It is fixed when the
// datapath is first pinned (by the first ADD or by the agent, whichever
// comes first) and read back from the pinned maps afterwards (SizingOf):
// the maps carry their size, there is no second record of it that could
// disagree. The network configuration (maxPods, maxHostPortsPerPod) and
// the agent's flags (--max-pods, --max-hostports-per-pod) must name the
// same values: an ADD or an agent start that finds the datapath pinned
// with other sizes is refused, naming both (see datapath.Ensure).
type Sizing struct {
	// MaxPods is the most pods the node runs (Kubernetes' kubelet
	// maxPods; 110 by default there and here).
	MaxPods int `json:"maxPods"`
	// HostPortsPerPod is the most portMappings entries one pod may have;
	// an ADD asking for more is refused (code 7).
	HostPortsPerPod int `json:"maxHostPortsPerPod"`
}

// Defaults and bounds of Sizing.
const (
	DefaultMaxPods         = 110
	DefaultHostPortsPerPod = 32
	// MaxMaxPods bounds maxPods: beyond it the flow tables alone pass
	// hundreds of MiB.
	MaxMaxPods = 8192
	// MaxHostPortsPerPod bounds maxHostPortsPerPod.
	MaxHostPortsPerPod = 1024
	// MaxClusterCIDRsPerNetwork bounds a network's clusterCIDRs, so that
	// cni_cidr_refs (one entry per CIDR and attachment) holds every
	// attachment's; cni_cluster_cidrs holds MAX_CLUSTER_CIDRS node-wide.
	MaxClusterCIDRsPerNetwork = 32
	// MaxClusterCIDRs is MAX_CLUSTER_CIDRS of bpf/lib/maps.h: what
	// cni_cluster_cidrs holds node-wide.
	MaxClusterCIDRs = 256
)

// DefaultSizing is the sizing of a node that configures none.
var DefaultSizing = Sizing{MaxPods: DefaultMaxPods, HostPortsPerPod: DefaultHostPortsPerPod}

// The per-pod factors the sizes are derived from. An attachment is one pod
// interface: two per pod leaves room for a second interface (Multus) or a
// pod's old sandbox still being torn down beside its new one.
const (
	attachmentsPerPod  = 2
	addrsPerAttachment = 2   // IPv4 and IPv6
	flowsPerPod        = 256 // translated flows (hostPort, Services, masquerade) per pod, on average
	// eventFlowsPerPod: flows (per direction) each pod has in cni_ev_flows
	// on average while flow events are on; past that the LRU evicts, and an
	// evicted flow is announced again at its next packet.
	eventFlowsPerPod = 32
	sockFlowsPerPod  = 64 // node sockets reaching a pod through a hostPort
	// NetworkPolicy: peer prefixes (rule entries) and port prefixes per
	// pod. The tries are not preallocated: only what the policies hold
	// costs memory. (The flows a policy allowed and its fragmented
	// datagrams are in tables of each interface's own, bpf/lib/maps.h.)
	policyAddrsPerPod = 512
	policyPortsPerPod = 128
	// minCT is cni_ct's least size: a hostPort pod taking 8000 short
	// connections a second keeps tens of thousands of closing flows there
	// until they time out, and at maxPods x flowsPerPod (28160 at the
	// defaults) an idle long-lived flow of the node is the one the LRU
	// evicts (TestHostPortFlowLifeCycle); 49152 keeps it and keeps every map
	// full within 32 MiB on 64 CPUs (TestFootprint).
	minCT = 49152
)

// Validate checks the bounds; field names are the network configuration's.
func (s Sizing) Validate() error {
	if s.MaxPods < 1 || s.MaxPods > MaxMaxPods {
		return fmt.Errorf("maxPods %d is out of range (1-%d)", s.MaxPods, MaxMaxPods)
	}
	if s.HostPortsPerPod < 0 || s.HostPortsPerPod > MaxHostPortsPerPod {
		return fmt.Errorf("maxHostPortsPerPod %d is out of range (0-%d)", s.HostPortsPerPod, MaxHostPortsPerPod)
	}
	return nil
}

// String is how messages name a sizing.
func (s Sizing) String() string {
	return fmt.Sprintf("maxPods %d, maxHostPortsPerPod %d", s.MaxPods, s.HostPortsPerPod)
}

// entries is the max_entries of every map the sizing decides (SIZED in
// bpf/lib/maps.h). The others keep the size maps.h gives them.
func (s Sizing) entries() map[string]uint32 {
	att := s.MaxPods * attachmentsPerPod
	hp := s.MaxPods * s.HostPortsPerPod * 2 // a mapping has an entry per family
	if hp < 1 {
		hp = 1 // no hostPorts at all: the map must still exist
	}
	return map[string]uint32{
		nameEndpoints:      uint32(att * addrsPerAttachment),
		nameLinks:          uint32(att),
		nameStats:          uint32(att * numDirs * numReasons), // every (direction, reason) of every interface
		nameBandwidth:      uint32(att * numDirs),
		nameNetns:          uint32(att + 1), // the pods' and the node's
		nameHostPorts:      uint32(hp),
		nameCT:             uint32(max(s.MaxPods*flowsPerPod, minCT)),
		nameSockRNAT:       uint32(s.MaxPods * sockFlowsPerPod),
		nameSNAT:           uint32(s.MaxPods * flowsPerPod * 2), // two entries per flow
		nameMasqShare:      uint32(s.MaxPods * flowsPerPod),     // a (pod, destination) has a flow at least
		nameMasqPods:       uint32(att*2 + 1),                   // an attachment's, one left by a DEL that failed, and the total
		nameStackFlows:     uint32(s.MaxPods * flowsPerPod),
		nameStackFlowParts: uint32(att), // a table per attachment
		nameSFPool:         uint32(att), // a table per attachment
		nameSFSlots:        uint32(att),
		nameClusterRefs:    uint32(att * MaxClusterCIDRsPerNetwork),
		nameEvPods:         uint32(att),
		nameEvFlows:        uint32(s.MaxPods * eventFlowsPerPod),
		namePolState:       uint32(att),
		namePolAddrs:       uint32(s.MaxPods * policyAddrsPerPod),
		namePolPorts:       uint32(s.MaxPods * policyPortsPerPod),
		namePolCTParts:     uint32(att * 2), // two tables per attachment
		namePolFragParts:   uint32(att),     // a table per attachment
	}
}

// sized returns the embedded specs with the sizing applied.
func sized(s Sizing) (map[string]*ebpf.MapSpec, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	ss, err := specs()
	if err != nil {
		return nil, err
	}
	n := s.entries()
	for name, max := range n {
		spec, ok := ss[name]
		if !ok {
			return nil, fmt.Errorf("embedded object lacks map %s", name)
		}
		spec = spec.Copy()
		spec.MaxEntries = max
		ss[name] = spec
	}
	for name, spec := range ss {
		if _, ok := n[name]; !ok && spec.MaxEntries == sizedPlaceholder {
			return nil, fmt.Errorf("map %s is SIZED in bpf/lib/maps.h but pkg/maps/sizing.go has no size for it", name)
		}
	}
	return ss, nil
}

// sizedPlaceholder is SIZED of bpf/lib/maps.h.
const sizedPlaceholder = 0

// SizingOf reads the sizing back from pinned maps: maxPods from
// cni_links, maxHostPortsPerPod from cni_hostports.
func SizingOf(m *Maps) Sizing {
	pods := int(m.get(nameLinks).MaxEntries()) / attachmentsPerPod
	s := Sizing{MaxPods: pods}
	if pods > 0 {
		s.HostPortsPerPod = int(m.get(nameHostPorts).MaxEntries()) / (pods * 2)
	}
	return s
}

// SizingError is returned when pinned maps were sized otherwise than asked.
type SizingError struct {
	Dir           string
	Pinned, Asked Sizing
	Detail        string // the first map whose size differs
}

func (e *SizingError) Error() string {
	return fmt.Sprintf("the datapath pinned at %s was sized for %s, this configuration asks for %s (%s): "+
		"every network's maxPods and maxHostPortsPerPod and the agent's --max-pods and --max-hostports-per-pod must agree "+
		"(sizes are fixed when the maps are first pinned; to change them, drain the node and remove the pin directory)",
		e.Dir, e.Pinned, e.Asked, e.Detail)
}

// CheckSizing returns a *SizingError when the pinned maps differ from s.
func (m *Maps) CheckSizing(s Sizing) error {
	if err := s.Validate(); err != nil {
		return err
	}
	return m.checkSized(s)
}

// IsSizingError tells whether err is a *SizingError.
func IsSizingError(err error) bool {
	var se *SizingError
	return errors.As(err, &se)
}
