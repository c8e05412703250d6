// Package agent is the node agent: it owns the pinned datapath while running
// (upgrades programs in place, reconciles stale state, serves metrics) and
// answers the read-only inspection commands.
package agent

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/nodes"
	"github.com/ebpf-cni/ebpf-cni/pkg/safedir"
)

// Options configure `ebpf-agent run`.
type Options struct {
	PinRoot           string
	StateDir          string
	ConfDir           string // CNI configuration directory, for reconciling attachments
	CNIPath           string // where the IPAM plugins are, for releasing addresses
	MetricsAddr       string // "" disables the metrics listener
	ReconcileInterval time.Duration
	Version           string
	Logger            *log.Logger
	HostPorts         bool   // own the node hooks (uplinks, socket hooks, node addresses) hostPort and ipMasq need
	CgroupRoot        string // cgroup2 mount for the socket hooks; "" finds it
	// PeersFile lists the other nodes and their pod CIDRs (host-gw routes,
	// see SyncPeerRoutes), whose pod CIDRs and addresses are then the
	// cluster CIDRs (without ClusterCIDRs); re-read at every reconcile by
	// the follower (follower.peers). "" installs none.
	PeersFile string
	// Tunnel is how pods reach other nodes' pods: host-gw routes (off), or
	// a VXLAN/Geneve tunnel device (tunnel.go), for all of them or, hybrid,
	// for nodes off this node's subnets.
	Tunnel TunnelOptions
	// Kube follows the cluster's Node objects (follow.go): routes to other
	// nodes, this node's pod CIDRs in the conflist, cluster CIDRs. nil:
	// no Kubernetes. Exclusive with PeersFile.
	Kube *Kube
	// ConfTemplate is a conflist the agent writes into ConfDir (same base
	// name) and keeps current; its "__PODCIDR__" ranges become this node's
	// pod CIDRs, which needs Kube. "" writes none.
	ConfTemplate string
	// ClusterCIDRs are never masqueraded by ipMasq (cni_cluster_cidrs,
	// with the agent as their user, agentCIDROwner); none with Kube or
	// PeersFile: every node's pod CIDRs and addresses.
	ClusterCIDRs []netip.Prefix
	// Sizing is what the node's maps are sized for (see ResolveSizing).
	Sizing maps.Sizing
	// NetworkPolicy programs every local pod's NetworkPolicy (netpol/),
	// from the API server's pods, namespaces and NetworkPolicies; needs
	// Kube. PolicyStatusDir records what was programmed, for dumps
	// ("": netpol.DefaultStatusDir).
	NetworkPolicy   bool
	PolicyStatusDir string
	// Events are the datapath events the agent turns on (nil: drops, or
	// what the node has); EventsKeep how many it keeps for observe --last.
	Events     *maps.EventSettings
	EventsKeep int
	// PoliteWait is how long the background work waits for the CNI verbs
	// to pause before it does a step anyway (0: datapath.MaxPoliteWait).
	PoliteWait time.Duration
}

// controller is one of the agent's loops. Run returns nil when ctx ends,
// or an error when it cannot go on (the others keep running).
type controller interface {
	Run(ctx context.Context) error
}

// Run ensures bpffs and the pinned datapath, moves every attachment to this
// build's programs in place, then runs the controllers until ctx ends:
// background work the verbs leave (background.go), reconciliation of stale
// state (reconciler.go), routes to peers and cluster CIDRs (follow.go,
// from the Node objects or the peers file: peers.go), node hooks (nodehooks.go), NetworkPolicy (policy.go) and
// metrics, fed by one link watcher (links.go). Pins outlive it: stopping, killing or restarting the
// agent leaves pods alone, and the next agent finishes what it left.
func Run(ctx context.Context, o Options) error {
	lg := o.Logger
	if err := o.check(); err != nil {
		return err
	}
	var kubeCfg *rest.Config
	if o.Kube != nil {
		var err error
		if kubeCfg, err = nodes.Config(o.Kube.Kubeconfig); err != nil {
			return err
		}
	}
	dp, rep, err := prepare(o, firstCIDRs(ctx, o, kubeCfg))
	if err != nil {
		return err
	}
	defer dp.Close()
	// From here on the verbs leave their slow kernel work to this agent
	// (background.go): take the agent lock, then start the worker.
	// The lock is held until the process ends (its release is never called):
	// a verb must not see the node agentless while this agent winds down.
	if _, err := datapath.HoldAgent(ctx, o.PinRoot, func() { lg.Printf("another agent runs on %s; waiting for it to end", o.PinRoot) }); err != nil {
		return fmt.Errorf("agent lock: %w", err)
	}
	links := newLinkWatcher(ctx, lg)
	bg, err := newBackground(o.PinRoot, o.StateDir, o.PoliteWait, lg, links)
	if err != nil {
		return err
	}
	// The socket observe asks exists before the agent says it is ready.
	evln, err := events.Listen(events.SocketPath(o.StateDir))
	if err != nil {
		return err
	}
	defer evln.Close() // when Run fails before Serve owns it
	lg.Printf("datapath ready at %s (map layout v%d, sized for %s); %d links and %d tc filters, %d moved to this build's programs, %d old program pins removed, %d old map directories removed",
		o.PinRoot, maps.LayoutVersion, o.Sizing, rep.Links, rep.Filters, rep.Replaced+rep.FiltersSwap, len(rep.RemovedProgs), len(rep.RemovedMaps))

	col := newCollector(o.PinRoot, o.StateDir, o.Version)
	// Datapath events: read, kept, counted, and served to observe on a
	// socket in the state directory (pkg/events); runAll waits for both, so
	// the socket is gone when Run returns.
	evr := events.NewReader(events.Options{PinDir: o.PinRoot, StateDir: o.StateDir, Keep: o.EventsKeep, Settings: o.Events, Logger: lg})
	run := map[string]controller{
		"links":         links,
		"background":    bg,
		"reconcile":     newReconciler(o, dp.Maps, col, links),
		"nodes":         newFollower(o, dp, kubeCfg),
		"events":        evr,
		"events socket": controllerFunc(func(ctx context.Context) error { return events.Serve(ctx, evln, evr) }),
	}
	if o.MetricsAddr != "" {
		ms, err := newMetricsServer(o.MetricsAddr, col, evr)
		if err != nil {
			return err
		}
		lg.Printf("metrics on http://%s/metrics", ms.ln.Addr())
		run["metrics"] = ms
	}
	if o.Tunnel.Mode != "" && o.Tunnel.Mode != datapath.TunnelOff {
		run["tunnel path MTU"] = &pmtuWatch{m: dp.Maps, every: 2 * time.Second, lg: lg}
	}
	if o.NetworkPolicy {
		run["policy"] = newPolicy(o, dp, kubeCfg, links)
	}
	if o.HostPorts {
		run["node hooks"] = newNodeHooks(dp, o.CgroupRoot, time.Minute, lg, links)
	}
	runAll(ctx, lg, run)
	lg.Printf("stopping; the pinned datapath stays in place")
	return nil
}

// controllerFunc is a controller of one function.
type controllerFunc func(ctx context.Context) error

func (f controllerFunc) Run(ctx context.Context) error { return f(ctx) }

// runAll runs the controllers until ctx ends and they all returned; one
// that fails is logged and the others go on (as kube-router's do).
func runAll(ctx context.Context, lg *log.Logger, cs map[string]controller) {
	var wg sync.WaitGroup
	for name, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(ctx); err != nil && ctx.Err() == nil {
				lg.Printf("%s: stopped: %v", name, err)
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
}

// check refuses options that contradict each other.
func (o Options) check() error {
	if o.Kube != nil && o.PeersFile != "" {
		return fmt.Errorf("a peers file and Node-following both install routes to other nodes: use one")
	}
	if o.Kube != nil && o.Kube.NodeName == "" {
		return fmt.Errorf("Node-following needs this node's name (--node-name, $NODE_NAME)")
	}
	if o.NetworkPolicy && o.Kube == nil {
		return fmt.Errorf("NetworkPolicy needs the API server's pods, namespaces and policies (--node-name, in a cluster or with --kubeconfig)")
	}
	if o.ConfTemplate != "" && o.Kube == nil {
		raw, err := os.ReadFile(o.ConfTemplate)
		if err != nil {
			return fmt.Errorf("conflist template: %w", err)
		}
		if conflist.UsesPlaceholder(raw) {
			return fmt.Errorf("conflist template %s: its %s ranges need the node's pod CIDRs from its Node object (--node-name, in a cluster or with --kubeconfig)", o.ConfTemplate, conflist.Placeholder)
		}
	}
	return nil
}

// prepare ensures bpffs and the pinned datapath and moves every attachment
// to this build's programs; the datapath it returns is the one handle the
// controllers share.
func prepare(o Options, seed func(*maps.Maps)) (*datapath.Datapath, datapath.UpgradeReport, error) {
	var rep datapath.UpgradeReport
	if err := datapath.EnsureBPFFS(o.PinRoot); err != nil {
		return nil, rep, err
	}
	for _, d := range []string{o.PinRoot, o.StateDir} {
		if err := safedir.Check(d); err != nil {
			return nil, rep, err
		}
	}
	if _, err := datapath.Forced(); err != nil {
		return nil, rep, err
	}
	// Probed once, here, and said: what the datapath uses, what replaces
	// what the kernel lacks or what is forced off.
	o.Logger.Printf("%s", datapath.FallbackSummary())
	dp, err := datapath.EnsureSeeded(o.PinRoot, o.Sizing, seed)
	if err != nil {
		if miss := datapath.MissingRequired(); len(miss) > 0 {
			return nil, rep, fmt.Errorf("ensure datapath at %s: %w (the kernel lacks %s: docs/compat.md)", o.PinRoot, err, strings.Join(miss, ", "))
		}
		return nil, rep, fmt.Errorf("ensure datapath at %s: %w", o.PinRoot, err)
	}
	if o.HostPorts {
		// The node hooks first: this build's host veth programs leave the
		// masquerade to the uplink's egress program, which must be there
		// before they run. (Old host veth programs still masquerade
		// themselves meanwhile; where conntrack drops INVALID packets, the
		// first reply of a TCP flow they open in between is lost and resent.)
		if _, err := dp.EnsureNodeHooks(datapath.NodeHookOptions{CgroupRoot: o.CgroupRoot}); err != nil {
			o.Logger.Printf("node hooks before the upgrade: %v", err)
		}
	}
	rep, err = dp.Upgrade(false)
	if err != nil {
		o.Logger.Printf("upgrade: %v", err)
	}
	return dp, rep, nil
}
