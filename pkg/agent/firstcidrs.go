package agent

import (
	"context"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/nodes"
)

// firstListWait bounds how long the agent's start waits for the first Node
// list before it upgrades the datapath without it.
const firstListWait = 10 * time.Second

// firstCIDRs returns what the follower's first view puts in the cluster
// CIDRs, for prepare to write into this build's maps before any link runs
// this build's programs (datapath.EnsureSeeded); nil when there is nothing
// to write or the API server did not answer in time. A peers file is read
// here for the same reason.
//
// This build's programs masquerade a pod's UDP datagram to any address
// outside the cluster CIDRs, replies included, and hold the nodes'
// addresses among them (follow.go, nodeClusterCIDRs). An older release's
// maps may not have those addresses: between the swap and the follower's
// first list, a pod's reply to another node's address (a NodePort client
// kube-proxy SNATed to that node) was masqueraded and lost (issue 27: 43
// NodePort UDP datagrams in the rollout from 41b58f6, sent from node2's
// swap to its agent's first list).
func firstCIDRs(ctx context.Context, o Options, kubeCfg *rest.Config) func(*maps.Maps) {
	f := &follower{o: o, logf: o.Logger.Printf, said: map[string]string{}}
	switch {
	case len(o.ClusterCIDRs) > 0:
		return func(m *maps.Maps) { f.m = m; f.clusterCIDRs(o.ClusterCIDRs) }
	case o.PeersFile != "":
		ps, err := LoadPeers(o.PeersFile)
		if err != nil {
			o.Logger.Printf("peer routes: %v (no cluster CIDRs from it before the upgrade)", err)
			return nil
		}
		return func(m *maps.Maps) { f.m = m; f.nodeClusterCIDRs(peersView(ps)) }
	case kubeCfg == nil:
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, firstListWait)
	defer cancel()
	t := time.Now()
	v, err := nodes.List(lctx, kubeCfg, o.Kube.NodeName, o.Logger.Printf)
	if err != nil {
		o.Logger.Printf("nodes: no list before the upgrade (%v, after %s): the node addresses join the cluster CIDRs at the first list; until then pods' UDP replies to other nodes' addresses are masqueraded", err, time.Since(t).Round(time.Millisecond))
		return nil
	}
	o.Logger.Printf("nodes: listed %d nodes before the upgrade in %s", len(v.Nodes), time.Since(t).Round(time.Millisecond))
	return func(m *maps.Maps) { f.m = m; f.nodeClusterCIDRs(v) }
}
