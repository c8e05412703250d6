package endpoint

// Feature is one capability of an attachment beyond the core endpoint
// (veth, addresses, routes, neighbours, endpoint entries): bandwidth limits,
// hostPorts, masquerade. Each is one file here, one header in bpf/lib (its
// packet path) and rows in bpf/lib/types.h and maps.h (its maps); the
// plugin's configuration (pkg/cni) builds the list.
//
// The endpoint calls a feature at fixed points of an attachment's life, so
// ordering stays the endpoint's: Install runs after the veth exists and the
// addresses are known, before the endpoint entries are published (the
// flags a feature sets there make the programs use its maps); Teardown's
// steps run around the veth's deletion (see Teardown).
type Feature interface {
	// Validate checks the feature's configuration for this attachment
	// (ADD and CHECK; never DEL, which must clean up whatever it is given).
	Validate() error
	// Install makes the feature's part of a new attachment: map entries,
	// endpoint flags (a.Flags), its part of the record. What it makes it
	// undoes through a.OnUndo if the ADD fails later.
	Install(a *Attachment) error
	// Check verifies the feature's part of an attachment (CHECK).
	Check(a *Attachment) error
	// Teardown registers the steps that remove the feature's part of an
	// attachment, from its record when there is one (DEL, GC, the agent).
	Teardown(t *Teardown)
}

// nodeHooksUser is a Feature that needs the node hooks (the uplink
// programs, the socket hooks): the endpoint sets them up, or refreshes the
// node addresses, in parallel with the veth and IPAM.
type nodeHooksUser interface {
	NeedsNodeHooks() bool
}

// vethStarter is a feature with work that needs only the host veth (its
// ifindex) and the datapath: CreateVeth starts it as soon as the veth
// exists, to run while IPAM does; the feature's Install waits for it.
type vethStarter interface {
	startWithVeth(a *Attachment)
}

// Capabilities is how an attachment is configured beyond the core: the
// network's keys (ipMasq, clusterCIDRs) and what the runtime passed in
// runtimeConfig. The zero value configures nothing, which is what teardown
// uses: it works from the record, whatever the configuration says.
type Capabilities struct {
	Bandwidth    *BandwidthConf // runtimeConfig.bandwidth
	PortMappings []PortMapping  // runtimeConfig.portMappings
	IPMasq       bool           // ipMasq
	ClusterCIDRs []string       // clusterCIDRs
	// MaxHostPorts is the network's maxHostPortsPerPod (Network.Sizing).
	MaxHostPorts int
	// IPMasqPortRange ("first-last") and IPMasqPodPortLimit: the node ports
	// masquerade uses, the most one pod holds per destination.
	IPMasqPortRange    string
	IPMasqPodPortLimit int
	// NetworkPolicy: the pod's traffic is judged by the policy the agent
	// programs; pending (only the node's traffic) until then.
	NetworkPolicy bool
}

// Features is the table of capabilities, in the order ADD installs them.
// An error (7, naming the field) is a network key that does not parse; the
// runtime's part is checked by Validate.
func (c Capabilities) Features() ([]Feature, error) {
	m, err := newMasq(c.IPMasq, c.ClusterCIDRs, c.IPMasqPortRange, c.IPMasqPodPortLimit)
	if err != nil {
		return nil, err
	}
	return []Feature{
		&bandwidth{conf: c.Bandwidth},
		&hostPorts{conf: c.PortMappings, limit: c.MaxHostPorts},
		m,
		&netPolicy{on: c.NetworkPolicy},
	}, nil
}

// AllFeatures are the features for teardown (DEL, GC, the agent).
func AllFeatures() []Feature {
	f, _ := Capabilities{}.Features()
	return f
}
