// Package agent is the node agent: it owns the pinned datapath while running
// (upgrades programs in place, reconciles stale state, serves metrics) and
// answers the read-only inspection commands.
package agent

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/client-go/rest"

	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/nodes"
	"github.com/ebpf-cni/ebpf-cni/pkg/safedir"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
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
	// see SyncPeerRoutes); re-read at every reconcile. "" installs none.
	PeersFile string
	// Kube follows the cluster's Node objects (follow.go): routes to other
	// nodes, this node's pod CIDRs in the conflist, cluster CIDRs. nil:
	// no Kubernetes. Exclusive with PeersFile.
	Kube *Kube
	// ConfTemplate is a conflist the agent writes into ConfDir (same base
	// name) and keeps current; its "__PODCIDR__" ranges become this node's
	// pod CIDRs, which needs Kube. "" writes none.
	ConfTemplate string
	// ClusterCIDRs are never masqueraded by ipMasq (cni_cluster_cidrs,
	// with the agent as their user, agentCIDROwner); none with Kube: every
	// node's pod CIDRs.
	ClusterCIDRs []netip.Prefix
	// Sizing is what the node's maps are sized for (see ResolveSizing).
	Sizing maps.Sizing
	// PoliteWait is how long the background work waits for the CNI verbs
	// to pause before it does a step anyway (0: datapath.MaxPoliteWait).
	PoliteWait time.Duration
}

// Run ensures bpffs and the pinned datapath, moves every attachment to this
// build's programs in place, takes on the verbs' background work (moving
// pods to tcx, deleting handed-off veths: background.go), reconciles stale
// state now, periodically and when a pod's veth disappears, and serves
// metrics until ctx ends. Pins outlive it: stopping, killing or restarting
// the agent leaves pods alone, and the next agent finishes what it left.
func Run(ctx context.Context, o Options) error {
	lg := o.Logger
	if o.Kube != nil && o.PeersFile != "" {
		return fmt.Errorf("a peers file and Node-following both install routes to other nodes: use one")
	}
	if o.Kube != nil && o.Kube.NodeName == "" {
		return fmt.Errorf("Node-following needs this node's name (--node-name, $NODE_NAME)")
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
	var kubeCfg *rest.Config
	if o.Kube != nil {
		var err error
		if kubeCfg, err = nodes.Config(o.Kube.Kubeconfig); err != nil {
			return err
		}
	}
	if err := datapath.EnsureBPFFS(o.PinRoot); err != nil {
		return err
	}
	for _, d := range []string{o.PinRoot, o.StateDir} {
		if err := safedir.Check(d); err != nil {
			return err
		}
	}
	if _, err := datapath.Forced(); err != nil {
		return err
	}
	// Probed once, here, and said: what the datapath uses, what replaces
	// what the kernel lacks or what is forced off.
	lg.Printf("%s", datapath.FallbackSummary())
	dp, err := datapath.Ensure(o.PinRoot, o.Sizing)
	if err != nil {
		if miss := datapath.MissingRequired(); len(miss) > 0 {
			return fmt.Errorf("ensure datapath at %s: %w (the kernel lacks %s: docs/compat.md)", o.PinRoot, err, strings.Join(miss, ", "))
		}
		return fmt.Errorf("ensure datapath at %s: %w", o.PinRoot, err)
	}
	if o.HostPorts {
		// The node hooks first: this build's host veth programs leave the
		// masquerade to the uplink's egress program, which must be there
		// before they run. (Old host veth programs still masquerade
		// themselves meanwhile; where conntrack drops INVALID packets, the
		// first reply of a TCP flow they open in between is lost and resent.)
		if _, err := dp.EnsureNodeHooks(datapath.NodeHookOptions{CgroupRoot: o.CgroupRoot}); err != nil {
			lg.Printf("node hooks before the upgrade: %v", err)
		}
	}
	rep, err := dp.Upgrade(false)
	dp.Close()
	if err != nil {
		lg.Printf("upgrade: %v", err)
	}
	// From here on the verbs leave their slow kernel work to this agent
	// (background.go): take the agent lock, then start the worker.
	if err := datapath.HoldAgent(ctx, o.PinRoot, func() { lg.Printf("another agent runs on %s; waiting for it to end", o.PinRoot) }); err != nil {
		return fmt.Errorf("agent lock: %w", err)
	}
	bg, err := newBackground(ctx, o.PinRoot, o.PoliteWait, lg)
	if err != nil {
		return err
	}
	go bg.run(ctx)
	lg.Printf("datapath ready at %s (map layout v%d, sized for %s); %d links and %d tc filters, %d moved to this build's programs, %d old program pins removed, %d old map directories removed",
		o.PinRoot, maps.LayoutVersion, o.Sizing, rep.Links, rep.Filters, rep.Replaced+rep.FiltersSwap, len(rep.RemovedProgs), len(rep.RemovedMaps))

	col := newCollector(o.PinRoot, o.StateDir, o.Version)
	if o.MetricsAddr != "" {
		ln, err := net.Listen("tcp", o.MetricsAddr)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", metricsHandler(col))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		lg.Printf("metrics on http://%s/metrics", ln.Addr())
	}

	reconcile := func(why string) {
		removed, err := ReconcileAll(o, false)
		col.addRemoved(removed)
		if len(removed) > 0 || err != nil {
			counts := map[string]int{}
			for _, s := range removed {
				counts[s.Kind]++
			}
			lg.Printf("reconcile (%s): removed %v; errors: %v", why, counts, err)
		}
	}
	reconcile("start")

	peers := func() {
		if o.PeersFile == "" {
			return
		}
		ps, err := LoadPeers(o.PeersFile)
		if err == nil {
			var rs []PeerRoute
			rs, err = SyncPeerRoutes(ps)
			if err == nil {
				lg.Printf("peer routes: %d", len(rs))
			}
		}
		if err != nil {
			lg.Printf("peer routes: %v", err)
		}
	}
	peers()

	fdp, err := datapath.Open(o.PinRoot)
	if err != nil {
		return err
	}
	defer fdp.Close()
	fol := newFollower(o, fdp.Maps)
	views := make(chan nodes.View, 1)
	if o.Kube != nil {
		lg.Printf("nodes: following Node objects as %s; routes, the conflist and cluster CIDRs wait for the first complete list", o.Kube.NodeName)
		go func() {
			err := nodes.Follow(ctx, kubeCfg, o.Kube.NodeName, 200*time.Millisecond, func(v nodes.View) {
				select { // the newest view replaces one not yet applied
				case <-views:
				default:
				}
				views <- v
			}, lg.Printf)
			if err != nil && ctx.Err() == nil {
				lg.Printf("nodes: %v", err)
			}
		}()
	} else {
		fol.static()
	}

	if o.HostPorts {
		hdp, err := datapath.Open(o.PinRoot)
		if err != nil {
			return err
		}
		defer hdp.Close()
		go runNodeHooks(ctx, hdp, o.CgroupRoot, time.Minute, lg)
	}

	// A deleted host veth is the usual sign of a pod gone without DEL.
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribe(updates, done); err != nil {
		lg.Printf("no link events (%v); reconciling on the timer only", err)
	}
	tick := time.NewTicker(o.ReconcileInterval)
	defer tick.Stop()
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			lg.Printf("stopping; the pinned datapath stays in place")
			return nil
		case u := <-updates:
			if u.Header.Type == syscall.RTM_DELLINK && strings.HasPrefix(u.Attrs().Name, state.HostIfPrefix) && debounce == nil {
				debounce = time.After(2 * time.Second) // let a DEL in flight finish first
			}
		case <-debounce:
			debounce = nil
			reconcile("link deleted")
		case v := <-views:
			fol.apply(v)
		case <-tick.C:
			reconcile("timer")
			peers()
			if o.Kube != nil {
				fol.reapply()
			} else {
				fol.static()
			}
		}
	}
}

// runNodeHooks is Run's node hook loop (Options.HostPorts): it sets the
// hooks up at start (as an ADD with portMappings or ipMasq would), follows
// the node's addresses and links (cni_node_ips, uplinks), and every prune
// interval drops the hostPort mappings and flows of pods whose host veth
// is gone; every 10 s it deletes the hostPort flows idle past their timeout
// that no timer deleted. It returns when ctx ends.
func runNodeHooks(ctx context.Context, dp *datapath.Datapath, cgroupRoot string, prune time.Duration, logger *log.Logger) {
	opts := datapath.NodeHookOptions{CgroupRoot: cgroupRoot, MustRefresh: true}
	sync := func(why string) {
		h, err := dp.EnsureNodeHooks(opts)
		if h == nil {
			logger.Printf("node hooks (%s): %v", why, err)
			return
		}
		if err != nil { // uplinks set up; the socket hooks could not be
			logger.Printf("node hooks (%s): %v", why, err)
		}
		logger.Printf("node hooks (%s): cgroup %s, uplinks %v, %d node addresses", why, h.CgroupRoot, h.Uplinks, len(h.NodeIPs))
	}
	sync("start")

	addrs := make(chan netlink.AddrUpdate, 64)
	links := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.AddrSubscribe(addrs, done); err != nil {
		logger.Printf("hostPort: no address notifications (%v); relying on ADDs and the periodic sync", err)
	}
	if err := netlink.LinkSubscribe(links, done); err != nil {
		logger.Printf("hostPort: no link notifications (%v); relying on ADDs and the periodic sync", err)
	}
	tick := time.NewTicker(prune)
	defer tick.Stop()
	// Backstop for flow timers the kernel could not allocate (maps.ExpireCT).
	sweep := time.NewTicker(maps.FlowTimeoutClosing)
	defer sweep.Stop()
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case u := <-addrs:
			if !u.LinkAddress.IP.IsLinkLocalUnicast() {
				debounce = time.After(200 * time.Millisecond)
			}
		case u := <-links:
			// Host veths ("ebpf" + hash) come and go with pods; only other links matter.
			if u.Link == nil || !strings.HasPrefix(u.Link.Attrs().Name, state.HostIfPrefix) {
				debounce = time.After(200 * time.Millisecond)
			}
		case <-debounce:
			debounce = nil
			sync("addresses or links changed")
		case <-sweep.C:
			if _, err := dp.Maps.ExpireCT(); err != nil {
				logger.Printf("hostPort: expire flows: %v", err)
			}
		case <-tick.C:
			n, err := endpoint.PruneHostPorts(dp.Maps)
			if err != nil {
				logger.Printf("hostPort: prune: %v", err)
			} else if n > 0 {
				logger.Printf("hostPort: pruned %d entries of pods whose host veth is gone", n)
			}
			sync("periodic")
		}
	}
}
