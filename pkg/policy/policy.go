// Package policy is the compiled form of Kubernetes NetworkPolicy for one pod
// interface: what the agent computes (pkg/policy/compile, from the API
// objects) and the datapath enforces (pkg/maps writes it into pinned maps).
// It imports nothing of Kubernetes, so the plugin may use it.
package policy

import "net/netip"

// Direction is seen from the pod, as NetworkPolicy's policyTypes name it.
type Direction uint8

const (
	Ingress Direction = iota // traffic entering the pod
	Egress                   // traffic the pod sends
)

func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// IP protocol numbers a rule's ports name.
const (
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// PortRange is one protocol's ports First..Last, inclusive (First == Last:
// one port; a rule's endPort makes a range).
type PortRange struct {
	Proto       uint8
	First, Last uint16
}

// Allow is what one prefix may use: every protocol and port (AllPorts), or
// the listed ranges (merged, sorted by protocol then First).
type Allow struct {
	Prefix   netip.Prefix // masked; a pod's address is a /32 or /128
	AllPorts bool
	Ports    []PortRange
}

// Rules is one direction of one pod interface, flattened for a longest-prefix
// match: traffic with peer address A is allowed when the entry with the
// longest Prefix containing A allows its protocol and port; no entry contains
// A: denied. The compiler resolves overlaps (a rule's CIDR, its except
// holes, pod addresses inside both) so each entry's value is already the union
// of every rule that covers exactly that entry's addresses. Replies of an
// allowed connection are allowed by the datapath's own flow state, never by an
// entry here.
type Rules struct {
	Isolated bool // false: no policy selects the pod in this direction: all allowed (Allows empty)
	Allows   []Allow
}

// Endpoint is the compiled policy of one pod interface.
type Endpoint struct {
	Ingress, Egress Rules
	// Policies names the policies selecting the pod ("namespace/name", sorted), for dumps.
	Policies []string
}

// Writer programs the datapath with compiled policy, keyed by the host veth's
// ifindex (the key of cni_links). The plugin's ADD leaves a new interface
// pending on a network with NetworkPolicy on (everything but the node's own
// traffic to the pod denied, both directions) until Apply; Remove forgets the
// interface (DEL does it too).
type Writer interface {
	Apply(ifindex uint32, ep Endpoint) error
	Remove(ifindex uint32) error
}
