package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/nodes"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Kube is Node-following (Options.Kube): the agent lists and watches the
// cluster's Node objects and derives from them what a peers file and an
// install-time conflist would otherwise fix once:
//
//   - this node's .spec.podCIDRs become the IPAM ranges of the conflist it
//     writes from Options.ConfTemplate (its "__PODCIDR__" ranges);
//   - every other node's pod CIDRs become host-gw routes via its InternalIP
//     of the same family (RouteProtocol), added, changed and removed as
//     nodes come, change and go;
//   - without Options.ClusterCIDRs, every node's pod CIDRs and addresses
//     are the cluster CIDRs ipMasq never masquerades (as every listed
//     node's are with Options.PeersFile: peers.go).
//
// Nothing is done before the first complete list, and nothing is undone
// while the API server is unreachable: routes, conflist and cluster CIDRs
// stay as they are until a new list or watch event says otherwise.
type Kube struct {
	Kubeconfig string // "": the pod's in-cluster service account
	NodeName   string // this node's Node object
}

// follower applies views of the cluster (or, without Kubernetes, the static
// configuration) to the node: at every new view and every
// Options.ReconcileInterval. Only its Run's goroutine calls its methods.
type follower struct {
	o       Options
	m       *maps.Maps
	dp      *datapath.Datapath // nil in tests that follow without a datapath
	kubeCfg *rest.Config       // nil: no Kubernetes (static)
	logf    func(string, ...any)

	view *nodes.View // the last complete view; nil before the first (or without Kubernetes)
	said map[string]string
}

func newFollower(o Options, dp *datapath.Datapath, kubeCfg *rest.Config) *follower {
	return &follower{o: o, m: dp.Maps, dp: dp, kubeCfg: kubeCfg, logf: o.Logger.Printf, said: map[string]string{}}
}

// Run returns when ctx ends.
func (f *follower) Run(ctx context.Context) error {
	views := make(chan nodes.View, 1)
	if f.kubeCfg != nil {
		f.logf("nodes: following Node objects as %s; routes, the conflist and cluster CIDRs wait for the first complete list", f.o.Kube.NodeName)
		go func() {
			err := nodes.Follow(ctx, f.kubeCfg, f.o.Kube.NodeName, 200*time.Millisecond, func(v nodes.View) {
				select { // the newest view replaces one not yet applied
				case <-views:
				default:
				}
				views <- v
			}, f.logf)
			if err != nil && ctx.Err() == nil {
				f.logf("nodes: %v", err)
			}
		}()
	} else {
		f.static()
	}
	tick := time.NewTicker(f.o.ReconcileInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case v := <-views:
			f.apply(v)
		case <-tick.C:
			if f.kubeCfg != nil {
				f.reapply()
			} else {
				f.static()
			}
		}
	}
}

// once logs msg under key unless the last message under key was the same:
// the periodic re-apply repeats itself only when something changed.
func (f *follower) once(key, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if f.said[key] != msg {
		f.said[key] = msg
		f.logf("%s", msg)
	}
}

// static is the configuration without Kubernetes: the peers file (peers),
// else the cluster CIDRs given (none: the agent releases those an earlier
// run of it held), and a template without placeholder. Run calls it at
// start and on every tick.
func (f *follower) static() {
	if f.o.PeersFile != "" {
		f.peers()
	} else {
		f.clusterCIDRs(f.o.ClusterCIDRs)
	}
	if f.o.ConfTemplate != "" {
		f.conflist(nil)
	}
}

// apply makes the node follow a view: cluster CIDRs first (so no pod
// reaching a new node's pods is masqueraded), then routes, then the
// conflist (new pods get addresses only once their range is routed).
func (f *follower) apply(v nodes.View) {
	f.view = &v
	if want := f.o.ClusterCIDRs; len(want) > 0 {
		f.clusterCIDRs(want)
	} else {
		f.nodeClusterCIDRs(v)
	}

	var peers []Peer
	for _, n := range v.Nodes {
		if n.Name == f.o.Kube.NodeName || len(n.PodCIDRs) == 0 {
			continue
		}
		if len(n.InternalIPs) == 0 {
			f.once("noip/"+n.Name, "nodes: %s has pod CIDRs %v but no InternalIP: no route to them", n.Name, n.PodCIDRs)
			continue
		}
		p := Peer{}
		for _, a := range n.InternalIPs {
			p.NodeIPs = append(p.NodeIPs, a.String())
		}
		for _, c := range n.PodCIDRs {
			p.PodCIDRs = append(p.PodCIDRs, c.String())
		}
		peers = append(peers, p)
	}
	rt := Routing{Mode: datapath.TunnelOff}
	var err error
	if f.dp != nil {
		rt, err = f.o.Tunnel.ensure(f.dp, f.o.Logger)
	}
	if v.Self != nil {
		for _, a := range v.Self.InternalIPs {
			rt.Self = append(rt.Self, a.AsSlice())
		}
		rt.SelfPodCIDRs = append(rt.SelfPodCIDRs, v.Self.PodCIDRs...)
	}
	var rs PeerRoutes
	if err == nil {
		rs, err = SyncPeerRoutesWith(peers, rt)
	}
	f.once("routes", "nodes: %d nodes; routes to other nodes' pod CIDRs (tunnel %s): %s%s", len(v.Nodes), rt.Mode, routeList(rs), errSuffix(err))

	switch {
	case f.o.ConfTemplate == "":
	case v.Self == nil:
		f.once("self", "nodes: no Node object %q (yet): the conflist is not written (an existing one is kept)", f.o.Kube.NodeName)
	case len(v.Self.PodCIDRs) == 0:
		f.once("self", "nodes: Node %s has no spec.podCIDRs yet (does the controller manager allocate node CIDRs?): the conflist is not written (an existing one is kept)", v.Self.Name)
	default:
		f.conflist(v.Self.PodCIDRs)
	}
}

// reapply repeats the last view (routes someone deleted come back, the
// template's changes reach the conflist).
func (f *follower) reapply() {
	if f.view != nil {
		f.apply(*f.view)
	}
}

// agentCIDROwner is the agent as a user of cluster CIDRs (cni_cidr_refs),
// beside the attachments whose configuration holds theirs: a CIDR both
// want stays until both let go. One per map directory, as the agent is:
// not named after the node, so that a run under another name still
// releases what an earlier run held.
var agentCIDROwner = datapath.AgentCIDROwner

// clusterCIDRs makes the agent a user of exactly want.
func (f *follower) clusterCIDRs(want []netip.Prefix) {
	if f.m == nil {
		return
	}
	gained, dropped, err := f.m.Masq().SetClusterCIDRs(agentCIDROwner, want)
	if len(gained) > 0 || len(dropped) > 0 || err != nil {
		f.logf("cluster CIDRs (never masqueraded) the agent holds: added %v, released %v%s", gained, dropped, errSuffix(err))
	}
}

// nodeClusterCIDRs makes every node's pod CIDRs and its addresses the
// cluster CIDRs. A node reaches other nodes' pods over the routes to them
// with its own address as the source: kube-proxy's SNAT of a NodePort (or
// a hostPort's) client whose endpoint is on another node, a hostNetwork
// pod, the kubelet. The pod's reply must go back to that address
// untranslated, or the node's conntrack never sees it: a UDP reply (any
// datagram opens a masqueraded flow) to a node address outside the
// cluster CIDRs is masqueraded, and a NodePort UDP flow to a pod on
// another node is lost. Should the node addresses not fit beside the pod
// CIDRs (more than the agent's share of cni_cluster_cidrs), the pod CIDRs
// alone are kept, and that is said.
func (f *follower) nodeClusterCIDRs(v nodes.View) {
	if f.m == nil {
		return
	}
	var pods, addrs []netip.Prefix
	for _, n := range v.Nodes {
		pods = append(pods, n.PodCIDRs...)
		for _, a := range n.InternalIPs {
			addrs = append(addrs, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	want := append(append([]netip.Prefix{}, pods...), addrs...)
	gained, dropped, err := f.m.Masq().SetClusterCIDRs(agentCIDROwner, want)
	if errors.Is(err, maps.ErrFull) && len(addrs) > 0 {
		f.once("cidr-full", "cluster CIDRs: the %d node addresses do not fit beside the %d pod CIDRs (%v): pods' UDP replies to other nodes' addresses are masqueraded", len(addrs), len(pods), err)
		gained, dropped, err = f.m.Masq().SetClusterCIDRs(agentCIDROwner, pods)
	} else if err == nil {
		f.said["cidr-full"] = ""
	}
	if len(gained) > 0 || len(dropped) > 0 || err != nil {
		f.logf("cluster CIDRs (never masqueraded) the agent holds: added %v, released %v%s", gained, dropped, errSuffix(err))
	}
}

// conflist writes the template into the CNI configuration directory, its
// placeholder ranges replaced by cidrs, when that changes the file.
func (f *follower) conflist(cidrs []netip.Prefix) {
	raw, err := os.ReadFile(f.o.ConfTemplate)
	if err != nil {
		f.once("conf", "conflist: template: %v", err)
		return
	}
	var ss []string
	for _, c := range cidrs {
		ss = append(ss, c.String())
	}
	out, err := conflist.Render(raw, ss)
	if err == nil {
		// The pods' MTU, when the template leaves it to the agent: the
		// uplink's less the tunnel's overhead.
		out, err = conflist.WithMTU(out, f.o.Tunnel.PodMTU())
	}
	if err != nil {
		f.once("conf", "conflist: %s: %v", f.o.ConfTemplate, err)
		return
	}
	dst := filepath.Join(f.o.ConfDir, filepath.Base(f.o.ConfTemplate))
	changed, err := conflist.WriteAtomic(dst, out, 0o644)
	if err != nil {
		f.once("conf", "conflist: write %s: %v", dst, err)
		return
	}
	if changed {
		f.logf("conflist: wrote %s (pod CIDRs %s)", dst, strings.Join(ss, ","))
		f.said["conf"] = ""
		if len(cidrs) > 0 {
			f.stranded(raw, cidrs)
		}
	}
}

// stranded names the pods whose addresses are outside the node's pod CIDRs
// once the conflist changed to them (a Node object deleted and registered again with
// another range). They keep their addresses and same-node traffic, but the
// other nodes now route only the new ranges here: such a pod needs
// recreating to be reachable from other nodes again.
func (f *follower) stranded(template []byte, cidrs []netip.Prefix) {
	name := networkName(template)
	if name == "" {
		return
	}
	recs, err := state.Store{Root: f.o.StateDir, Network: name}.List()
	if err != nil {
		f.logf("pod CIDRs changed; cannot list attachments: %v", err)
		return
	}
	for _, r := range recs {
		for _, s := range r.IPs {
			ip, err := netip.ParseAddr(strings.Split(s, "/")[0])
			if err != nil {
				continue
			}
			inside := false
			for _, c := range cidrs {
				inside = inside || c.Contains(ip)
			}
			if !inside {
				who := r.PodLabel()
				if who == "" {
					who = "container " + r.ContainerID
				}
				f.logf("pod CIDRs changed to %v: %s keeps %s, outside them: other nodes no longer route it here; recreate the pod", cidrs, who, ip)
			}
		}
	}
}

func networkName(conf []byte) string {
	var c struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(conf, &c) != nil {
		return ""
	}
	return c.Name
}

func routeList(rs PeerRoutes) string {
	if len(rs) == 0 {
		return "none"
	}
	var s []string
	for _, r := range rs {
		if r.Tunnel != "" {
			s = append(s, r.Dst+" via "+r.Via+" to "+r.Tunnel)
			continue
		}
		s = append(s, r.Dst+" via "+r.Via)
	}
	return strings.Join(s, ", ")
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return "; errors: " + strings.ReplaceAll(err.Error(), "\n", "; ")
}
