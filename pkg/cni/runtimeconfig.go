package cni

import "encoding/json"

// RuntimeConfig is what the runtime injects for the capabilities the
// conflist declares ("capabilities": {"portMappings": true, "bandwidth": true}).
type RuntimeConfig struct {
	PortMappings []PortMapping  `json:"portMappings,omitempty"`
	Bandwidth    *BandwidthConf `json:"bandwidth,omitempty"`
	// Mac is the "mac" capability: the pod interface is created with it.
	Mac string `json:"mac,omitempty"`
}

// PortMapping is one entry of the portMappings capability.
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// BandwidthConf is the bandwidth capability, in bits per second and bits, as
// the reference bandwidth plugin defines it (ingress = into the pod). Kept
// as raw JSON so that decoding never fails (DEL must clean up whatever it is
// given) and validation names a bad field exactly: a string, even "1000", is
// not a number (the reference plugin refuses it too).
type BandwidthConf struct {
	IngressRate  json.RawMessage `json:"ingressRate,omitempty"`
	IngressBurst json.RawMessage `json:"ingressBurst,omitempty"`
	EgressRate   json.RawMessage `json:"egressRate,omitempty"`
	EgressBurst  json.RawMessage `json:"egressBurst,omitempty"`
}
