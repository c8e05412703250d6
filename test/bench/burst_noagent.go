package main

// The burst part's agent-less configuration (issue 30): 100 ADDs at once
// on a node where no ebpf-agent runs yet (bare containerd, the first pods
// before the DaemonSet is ready), beside ptp and the agent-present ebpf-cni
// in the same rounds. Its own node and pin directory, so that the agent of
// the other configuration never sees it.

import "github.com/containernetworking/plugins/pkg/ns"

const (
	burstNoAgentKey = "burst-ebpf-noagent"
	// targetBurstNoAgent: issue 30's goal for the agent-less burst.
	targetBurstNoAgent = 1.2
)

// burstNoAgentConfig is the agent-less ebpf-cni of the burst part, or nil
// when the whole run is without the agent (burst-ebpf is that already).
func (b *bench) burstNoAgentConfig(node ns.NetNS) *config {
	if !b.opts.agent {
		return nil
	}
	net := mustCIDR("10.241.0.0/16")
	pin := b.newPinDir("burst-noagent")
	return &config{key: burstNoAgentKey, label: "ebpf-cni, no agent", netName: "bench-burst-ebpf-na", subnet: net,
		pinDir: pin, node: node, list: map[string]any{"plugins": []any{b.ebpfPlugin(net, pin, b.stateFor(pin))}}}
}
