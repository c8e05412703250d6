// Package cni implements the CNI verbs of ebpf-cni (ADD, DEL, CHECK, GC,
// STATUS): it reads the configuration and the runtime's environment,
// delegates addresses to IPAM, and leaves each attachment to pkg/endpoint.
package cni

import (
	"encoding/json"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
)

// NetConf is the network configuration of the plugin: the standard keys,
// the plugin's own (endpoint.Network: mtu, pinDir, stateDir, attachMode,
// cgroupRoot), the capabilities' (ipMasq, clusterCIDRs) and what the
// runtime injects in runtimeConfig.
type NetConf struct {
	types.NetConf

	// IPMasq (as ptp and bridge name it): the pod's IPv4 and IPv6 traffic
	// to destinations outside ClusterCIDRs leaves with the node's address,
	// translated in BPF.
	IPMasq bool `json:"ipMasq,omitempty"`
	// ClusterCIDRs are never masqueraded; default: the subnets of the
	// pod's addresses as the IPAM result gives them. When set, they must
	// cover each family the pod has an address of.
	ClusterCIDRs []string `json:"clusterCIDRs,omitempty"`
	// IPMasqPortRange ("first-last") are the node ports masquerade uses;
	// default: 1024-65535 but the node's ip_local_port_range and 30000-32767,
	// or 61000-65535 (reserved from the node's ephemeral choice) when that
	// leaves fewer than 1024.
	IPMasqPortRange string `json:"ipMasqPortRange,omitempty"`
	// IPMasqPodPortLimit is the most ports one pod holds towards one
	// destination (address, port, protocol); default: an eighth of them.
	IPMasqPodPortLimit int `json:"ipMasqPodPortLimit,omitempty"`

	// NetworkPolicy: the pod's traffic is judged by the Kubernetes
	// NetworkPolicy the agent programs for it; a new pod is pending (only
	// the node's traffic passes) until the agent has.
	NetworkPolicy bool `json:"networkPolicy,omitempty"`

	// CNIConfDir is where the runtime reads conflists (default
	// /etc/cni/net.d): ADD reads this network's there to refuse plugins
	// chained after ebpf-cni that cannot work with it (chain.go).
	CNIConfDir string `json:"cniConfDir,omitempty"`

	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitempty"`

	net      *endpoint.Network
	features []endpoint.Feature
}

// RuntimeConfig is what the runtime injects for the capabilities the
// conflist declares ("capabilities": {"portMappings": true, "bandwidth": true, "mac": true}).
type RuntimeConfig struct {
	PortMappings []endpoint.PortMapping  `json:"portMappings,omitempty"`
	Bandwidth    *endpoint.BandwidthConf `json:"bandwidth,omitempty"`
	// Mac is the "mac" capability: the pod interface is created with it.
	Mac string `json:"mac,omitempty"`
}

// parseConf decodes and validates stdin. Every problem is a CNI error naming
// the field: 6 when it does not decode, 7 when a value is wrong.
func parseConf(stdin []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, endpoint.Errorf(endpoint.ErrDecode, "decode network config: %w", err)
	}
	n, err := endpoint.ParseNetwork(stdin)
	if err != nil {
		return nil, err
	}
	conf.net = n
	caps := endpoint.Capabilities{
		Bandwidth: conf.RuntimeConfig.Bandwidth, PortMappings: conf.RuntimeConfig.PortMappings,
		IPMasq: conf.IPMasq, ClusterCIDRs: conf.ClusterCIDRs, MaxHostPorts: n.Sizing().HostPortsPerPod,
		IPMasqPortRange: conf.IPMasqPortRange, IPMasqPodPortLimit: conf.IPMasqPodPortLimit,
		NetworkPolicy: conf.NetworkPolicy,
	}
	if conf.features, err = caps.Features(); err != nil {
		return nil, err
	}
	if err := version.ParsePrevResult(&conf.NetConf); err != nil {
		return nil, endpoint.Errorf(endpoint.ErrDecode, "decode prevResult: %w", err)
	}
	return conf, nil
}

// validateFeatures checks the capabilities the runtime passed. Only ADD and
// CHECK call it: DEL must clean up whatever it is given.
func (c *NetConf) validateFeatures() error {
	for _, f := range c.features {
		if err := f.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// ipamFields are the address fields common to IPAM plugins.
type ipamFields struct {
	Subnet  string `json:"subnet"`
	Gateway string `json:"gateway"`
	Ranges  [][]struct {
		Subnet     string `json:"subnet"`
		RangeStart string `json:"rangeStart"`
		RangeEnd   string `json:"rangeEnd"`
		Gateway    string `json:"gateway"`
	} `json:"ranges"`
	Routes []struct {
		Dst string `json:"dst"`
		GW  string `json:"gw"`
	} `json:"routes"`
}

// validateIPAM checks that an ipam block exists and that the address fields
// common to IPAM plugins parse, so a typo is error 7 naming the field rather
// than an opaque failure deep in the IPAM plugin. v4Only tells that the
// plugin (host-local) can give IPv4 addresses only.
func validateIPAM(stdin []byte, ipamType string, mtu int) (v4Only bool, err error) {
	if ipamType == "" {
		return false, endpoint.ConfError("ipam: missing (need an \"ipam\" object with a \"type\", e.g. host-local)")
	}
	var raw struct {
		IPAM ipamFields `json:"ipam"`
		// Decoded apart below: a malformed one is host-local's to refuse.
		RuntimeConfig json.RawMessage `json:"runtimeConfig"`
	}
	if err := json.Unmarshal(stdin, &raw); err != nil {
		return false, endpoint.ConfError("ipam: %w", err)
	}
	if err := raw.IPAM.check(mtu); err != nil {
		return false, err
	}
	return raw.IPAM.v4Only(ipamType, raw.RuntimeConfig), nil
}

// check parses every address field, naming the first that does not.
func (ip *ipamFields) check(mtu int) error {
	cidr := func(field, v string) error {
		if v == "" {
			return nil
		}
		ip, _, err := net.ParseCIDR(v)
		if err != nil {
			return endpoint.ConfError("%s: %q is not a CIDR", field, v)
		}
		if ip.To4() == nil && mtu != 0 && mtu < endpoint.MinMTU6 {
			return endpoint.ConfError("mtu %d is below %d, the least IPv6 works with, and %s %s is IPv6", mtu, endpoint.MinMTU6, field, v)
		}
		return nil
	}
	addr := func(field, v string) error {
		if v != "" && net.ParseIP(v) == nil {
			return endpoint.ConfError("%s: %q is not an IP address", field, v)
		}
		return nil
	}
	if err := cidr("ipam.subnet", ip.Subnet); err != nil {
		return err
	}
	if err := addr("ipam.gateway", ip.Gateway); err != nil {
		return err
	}
	for i, set := range ip.Ranges {
		for j, r := range set {
			f := fmt.Sprintf("ipam.ranges[%d][%d]", i, j)
			if r.Subnet == "" {
				return endpoint.ConfError("%s.subnet: missing", f)
			}
			if err := cidr(f+".subnet", r.Subnet); err != nil {
				return err
			}
			for name, v := range map[string]string{"rangeStart": r.RangeStart, "rangeEnd": r.RangeEnd, "gateway": r.Gateway} {
				if err := addr(f+"."+name, v); err != nil {
					return err
				}
			}
		}
	}
	for i, r := range ip.Routes {
		f := fmt.Sprintf("ipam.routes[%d]", i)
		if r.Dst == "" {
			return endpoint.ConfError("%s.dst: missing", f)
		}
		if err := cidr(f+".dst", r.Dst); err != nil {
			return err
		}
		if err := addr(f+".gw", r.GW); err != nil {
			return err
		}
	}
	return nil
}

// v4Only: host-local gives addresses of these subnets only: all IPv4, the
// pods' host veths need no IPv6 (see endpoint.Network.IPv4Only).
func (ip *ipamFields) v4Only(ipamType string, runtimeConfig json.RawMessage) bool {
	subnets := []string{ip.Subnet}
	for _, set := range ip.Ranges {
		for _, r := range set {
			subnets = append(subnets, r.Subnet)
		}
	}
	// Written as IPv4, not v4-mapped IPv6.
	isV4 := func(s string) bool { _, n, err := net.ParseCIDR(s); return err == nil && len(n.Mask) == net.IPv4len }
	v4Only := ipamType == "host-local"
	seen := false
	for _, s := range subnets {
		if s != "" {
			seen = true
			v4Only = v4Only && isV4(s)
		}
	}
	// host-local prepends the runtime's ranges (the "ipRanges" capability)
	// to the configured ones. Not validated here (host-local does): any
	// but IPv4 subnets, or a runtimeConfig that does not parse, may give IPv6.
	var rt struct {
		IPRanges [][]struct {
			Subnet string `json:"subnet"`
		} `json:"ipRanges"`
	}
	if len(runtimeConfig) > 0 && json.Unmarshal(runtimeConfig, &rt) != nil {
		return false
	}
	for _, set := range rt.IPRanges {
		for _, r := range set {
			v4Only = v4Only && isV4(r.Subnet)
		}
	}
	return v4Only && seen
}

// prevResult returns the previous result as the current result type.
func (c *NetConf) prevResult() (*current.Result, error) {
	if c.PrevResult == nil {
		return nil, endpoint.ConfError("prevResult: missing (CHECK needs the result of ADD)")
	}
	r, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return nil, endpoint.Errorf(endpoint.ErrDecode, "prevResult: %w", err)
	}
	return r, nil
}
