// Command ebpf-agent is the ebpf-cni node agent and inspection CLI.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent/netpol"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

// opts are the flags of every command, and the extra ones a command adds.
type opts struct {
	pinDir, stateDir, confDir, binDir, format string

	// run, peers
	metrics, cgroupRoot, peersFile string
	tunnel                         string
	tunnelHybrid                   bool
	tunnelMACCheck                 bool
	interval, politeWait           time.Duration
	hostPorts, networkPolicy       bool
	policyStatusDir                string
	// run: Node-following, the conflist, cluster CIDRs
	kubeconfig, nodeName, confTemplate, clusterCIDRs string
	// run: the file saying whether to uninstall the node when stopped
	uninstallOnStop string
	// reconcile, upgrade
	dryRun, force bool
	// run: datapath events
	dropEvents            bool
	flowEvents            string
	eventRate, eventBurst uint
	eventsKeep            int
	// run, upgrade: the node's map sizing (0 and -1: from the CNI config)
	maxPods, hostPortsPerPod int
}

// sizingFlags are the flags of the commands that may create the maps.
func sizingFlags(fs *flag.FlagSet, o *opts) {
	fs.IntVar(&o.maxPods, "max-pods", 0, "pods the node's maps are sized for (default: the ebpf-cni networks' maxPods in --cni-conf-dir, else 110); must agree with them")
	fs.IntVar(&o.hostPortsPerPod, "max-hostports-per-pod", -1, "portMappings a pod may have (default: the networks' maxHostPortsPerPod, else 32); must agree with them")
}

// sizing resolves the flags against the CNI configuration.
func (o *opts) sizing() (maps.Sizing, error) {
	return agent.ResolveSizing(o.confDir, o.confTemplate, o.pinDir, o.maxPods, o.hostPortsPerPod)
}

func (o *opts) source() inspect.Source { return inspect.Source{PinDir: o.pinDir, StateDir: o.stateDir} }

func (o *opts) agentOptions() agent.Options {
	return agent.Options{PinRoot: o.pinDir, StateDir: o.stateDir, ConfDir: o.confDir, CNIPath: o.binDir}
}

// command is one row of the table: its name (one or two words), its help
// line, the flags it adds, and what it does.
type command struct {
	name  string
	help  string
	flags func(*flag.FlagSet, *opts)
	run   func(*opts) error
}

var commands = []command{
	{name: "run", help: "own the pinned datapath: upgrade programs in place, reconcile, serve metrics",
		flags: runFlags, run: run},
	{name: "status", help: "datapath health, versions, attach points (read-only; exit 1 when unhealthy)",
		run: status},
	{name: "dump endpoints", help: "pod IPs with interfaces, pods and counters (read-only)",
		run: dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadEndpoints(s) })},
	{name: "dump bandwidth", help: "per-pod rate limits with passed and dropped traffic (read-only)",
		run: dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadBandwidth(s) })},
	{name: "dump stats", help: "every counter by pod, direction and reason (read-only)",
		run: dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadStats(s) })},
	{name: "dump hostports", help: "hostPort mappings with their pods (read-only)",
		run: dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadHostPorts(s) })},
	{name: "dump ct", help: "translated hostPort flows, node sockets, stack flows and policy-allowed flows (read-only)",
		run: dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadCT(s) })},
	{name: "dump nat", help: "masqueraded (ipMasq) flows, cluster CIDRs and users, counters, uplink sources (read-only)",
		run: dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadNAT(s) })},
	{name: "dump attachments", help: "the plugin's attachment records: container, interface, host veth, IPs (read-only)",
		run: dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadAttachments(s) })},
	{name: "observe", help: "follow datapath events (drops, flows) with pods named; --last N from the agent's memory",
		flags: observeFlags, run: observe},
	{name: "events", help: "show or set what the datapath sends as events (drops, flows per node or pod, rate limit) and the losses",
		flags: eventsFlags, run: eventsCmd},
	{name: "dump policy", help: "per pod: the NetworkPolicies selecting it, what they allow per direction, policy drops (read-only)",
		flags: func(fs *flag.FlagSet, o *opts) {
			fs.StringVar(&o.policyStatusDir, "policy-status-dir", netpol.DefaultStatusDir, "where the agent records what it programmed (its run --policy-status-dir)")
		}, run: func(o *opts) error {
			return dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadPolicy(s, o.policyStatusDir) })(o)
		}},
	{name: "peers", help: "install routes to other nodes' pod CIDRs via their node IPs once (run does it at every reconcile)",
		flags: func(fs *flag.FlagSet, o *opts) {
			fs.StringVar(&o.peersFile, "peers", "", "JSON file [{nodeIP, podCIDRs}] (required)")
			tunnelFlags(fs, o)
			sizingFlags(fs, o)
		}, run: peers},
	{name: "reconcile", help: "remove state of pods that are gone (--dry-run lists it)",
		flags: func(fs *flag.FlagSet, o *opts) {
			fs.BoolVar(&o.dryRun, "dry-run", false, "only list what would be removed")
		}, run: reconcile},
	{name: "connectivity", help: "deploy probe pods into a cluster and check every path: pod to pod, Services, DNS, hostPort, NodePort, egress, NetworkPolicy",
		flags: connectivityFlags, run: runConnectivity},
	{name: "uninstall", help: "remove every trace of ebpf-cni from the node (refused while pods use it, unless --force)",
		flags: func(fs *flag.FlagSet, o *opts) {
			fs.BoolVar(&o.force, "force", false, "tear down the pods' interfaces too (they lose their network), with a warning")
			fs.StringVar(&o.cgroupRoot, "cgroup-root", "", "cgroup2 directory of the socket hooks (default: the networks' cgroupRoot, else the cgroup2 mount)")
			fs.StringVar(&o.confTemplate, "cni-conf-template", "", "the template run rendered: its conflist in --cni-conf-dir is removed too")
		}, run: uninstall},
	{name: "upgrade", help: "swap every attachment to this build's programs in place (--force reloads them)",
		flags: func(fs *flag.FlagSet, o *opts) {
			fs.BoolVar(&o.force, "force", false, "reload this build's programs even if already pinned, and swap them in")
			sizingFlags(fs, o)
		}, run: upgrade},
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: ebpf-agent COMMAND [flags]")
	fmt.Fprintln(w)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-18s  %s\n", c.name, c.help)
	}
	fmt.Fprintln(w, "\ncommon flags: --pin-dir DIR --state-dir DIR --cni-conf-dir DIR --cni-bin-dir DIR; dumps, status and reports: -o table|json")
	fmt.Fprintln(w, "ebpf-agent COMMAND -h lists a command's flags")
}

// find matches the arguments to a command: its name is one or two words.
func find(args []string) (*command, []string) {
	for i := range commands {
		words := strings.Fields(commands[i].name)
		if len(args) >= len(words) && strings.Join(args[:len(words)], " ") == commands[i].name {
			return &commands[i], args[len(words):]
		}
	}
	return nil, nil
}

func main() {
	args := os.Args[1:]
	if len(args) == 0 {
		usage(os.Stderr)
		os.Exit(2)
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(os.Stdout)
		return
	}
	c, rest := find(args)
	if c == nil {
		fmt.Fprintf(os.Stderr, "ebpf-agent: unknown command %q\n\n", strings.Join(args, " "))
		usage(os.Stderr)
		os.Exit(2)
	}
	o := &opts{}
	fs := flag.NewFlagSet(c.name, flag.ExitOnError)
	fs.StringVar(&o.pinDir, "pin-dir", datapath.DefaultPinRoot, "bpffs directory of the datapath")
	fs.StringVar(&o.stateDir, "state-dir", state.DefaultDir, "plugin state directory (attachment records)")
	fs.StringVar(&o.confDir, "cni-conf-dir", "/etc/cni/net.d", "CNI configuration directory (networks to reconcile)")
	fs.StringVar(&o.binDir, "cni-bin-dir", "/opt/cni/bin", "CNI plugin directory (IPAM plugins, to release addresses)")
	fs.StringVar(&o.format, "o", "table", "output format: table or json")
	if c.flags != nil {
		c.flags(fs, o)
	}
	fs.Parse(rest)
	if err := c.run(o); err != nil {
		var unhealthy errUnhealthy
		if !errors.As(err, &unhealthy) {
			fmt.Fprintln(os.Stderr, "ebpf-agent:", err)
		}
		os.Exit(1)
	}
}

// errUnhealthy: status printed an unhealthy report; the exit status says so.
type errUnhealthy struct{}

func (errUnhealthy) Error() string { return "datapath unhealthy" }

// tunnelFlags are the cluster's tunnel mode (docs/tunnel.md).
func tunnelFlags(fs *flag.FlagSet, o *opts) {
	fs.StringVar(&o.tunnel, "tunnel", "off", "how pods reach other nodes' pods: off (host-gw routes: every node on one subnet), vxlan or geneve (a tunnel device, "+datapath.TunnelDevice+")")
	fs.BoolVar(&o.tunnelHybrid, "tunnel-hybrid", false, "with --tunnel: direct host-gw routes to nodes on a subnet of this node, the tunnel to the others")
	fs.BoolVar(&o.tunnelMACCheck, "tunnel-mac-check", true, "with --tunnel: drop a tunnel datagram claiming a node's address unless it comes from the MAC of the next hop toward that node; false for ECMP or VRRP underlays where genuine datagrams come from another MAC (weaker: docs/tunnel.md)")
}

func (o *opts) tunnelOptions() (agent.TunnelOptions, error) {
	m, err := datapath.ParseTunnelMode(o.tunnel)
	if err != nil {
		return agent.TunnelOptions{}, fmt.Errorf("--tunnel: %w", err)
	}
	if o.tunnelHybrid && m == datapath.TunnelOff {
		return agent.TunnelOptions{}, errors.New("--tunnel-hybrid needs --tunnel vxlan or geneve")
	}
	if !o.tunnelMACCheck && m == datapath.TunnelOff {
		return agent.TunnelOptions{}, errors.New("--tunnel-mac-check=false needs --tunnel vxlan or geneve")
	}
	return agent.TunnelOptions{Mode: m, Hybrid: o.tunnelHybrid, NoMACCheck: !o.tunnelMACCheck}, nil
}

func runFlags(fs *flag.FlagSet, o *opts) {
	tunnelFlags(fs, o)
	fs.StringVar(&o.peersFile, "peers", "", "JSON file [{nodeIP, nodeIPs, podCIDRs}] of the nodes: routes to their pod CIDRs via their node IPs (host-gw), their pod CIDRs and addresses held as cluster CIDRs")
	fs.StringVar(&o.metrics, "metrics-addr", "127.0.0.1:9964", "Prometheus metrics listener; empty disables it")
	fs.DurationVar(&o.interval, "reconcile-interval", time.Minute, "how often to look for stale state")
	fs.BoolVar(&o.hostPorts, "hostports", true, "own the node hooks hostPort and ipMasq need (uplinks, cgroup socket hooks, node addresses)")
	fs.DurationVar(&o.politeWait, "polite-wait", datapath.MaxPoliteWait, "longest the background work (moving pods to tcx, deleting handed-off veths) waits for CNI verbs to pause before doing a step anyway")
	fs.StringVar(&o.cgroupRoot, "cgroup-root", "", "cgroup2 directory for the node-wide socket hooks (default: the cgroup2 mount)")
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's Node object: follow the cluster's Nodes (routes to other nodes' pod CIDRs, this node's pod CIDRs in the conflist, cluster CIDRs); empty: no Kubernetes")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for Node-following (default: the pod's in-cluster service account)")
	fs.StringVar(&o.confTemplate, "cni-conf-template", "", "conflist to write into --cni-conf-dir and keep current; its \"__PODCIDR__\" ranges become this node's spec.podCIDRs")
	fs.BoolVar(&o.networkPolicy, "network-policy", false, "program every local pod's NetworkPolicy from the API server's pods, namespaces and policies (needs --node-name); networks with \"networkPolicy\": true keep new pods closed until then")
	fs.StringVar(&o.policyStatusDir, "policy-status-dir", netpol.DefaultStatusDir, "where the agent records what it programmed per pod interface (dump policy reads it)")
	fs.StringVar(&o.clusterCIDRs, "cluster-cidrs", "", "comma-separated CIDRs ipMasq never masquerades (default with --node-name or --peers: every node's pod CIDRs and addresses)")
	fs.StringVar(&o.uninstallOnStop, "uninstall-on-stop", "", "file read when the agent stops: \"true\" uninstalls the node as `uninstall` does (refused while pods use it), \"force\" as `uninstall --force`; anything else, or no file, leaves the datapath in place")
	fs.BoolVar(&o.dropEvents, "drop-events", true, "an event per dropped packet (ebpf-agent observe)")
	fs.StringVar(&o.flowEvents, "flow-events", "off", "flow events: off, node (every pod) or pods (those turned on with `ebpf-agent events --flows-pod`)")
	fs.UintVar(&o.eventRate, "event-rate", maps.DefaultEventRate, "events a second each CPU may send; more are counted as lost")
	fs.UintVar(&o.eventBurst, "event-burst", maps.DefaultEventBurst, "events a CPU may send at once")
	fs.IntVar(&o.eventsKeep, "events-keep", 4096, "events kept in memory for `observe --last`")
	sizingFlags(fs, o)
}

// uninstallMode reads --uninstall-on-stop's file: "", "true" or "force".
func uninstallMode(path string) string {
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	switch m := strings.TrimSpace(string(b)); m {
	case "true", "force":
		return m
	}
	return ""
}

// watchUninstallMode logs what the stop would do each time the file
// changes (a ConfigMap key reaches a mounted volume a minute or two after
// the edit): the log line is how an operator knows the mode arrived.
func watchUninstallMode(ctx context.Context, path string, lg *log.Logger) {
	last := "unset"
	for {
		if m := uninstallMode(path); m != last {
			last = m
			switch m {
			case "":
				lg.Printf("uninstall-on-stop: off (stopping leaves the datapath in place)")
			default:
				lg.Printf("uninstall-on-stop: %s (stopping this agent uninstalls ebpf-cni from the node)", m)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

func run(o *opts) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ao := o.agentOptions()
	ao.MetricsAddr, ao.ReconcileInterval, ao.Version = o.metrics, o.interval, Version
	ao.HostPorts, ao.CgroupRoot, ao.PeersFile = o.hostPorts, o.cgroupRoot, o.peersFile
	ao.ConfTemplate = o.confTemplate
	t, err := o.tunnelOptions()
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	ao.Tunnel = t
	ao.NetworkPolicy, ao.PolicyStatusDir = o.networkPolicy, o.policyStatusDir
	if o.nodeName != "" {
		ao.Kube = &agent.Kube{Kubeconfig: o.kubeconfig, NodeName: o.nodeName}
	} else if o.kubeconfig != "" {
		return errors.New("run: --kubeconfig needs --node-name (or $NODE_NAME)")
	}
	for _, c := range strings.Split(o.clusterCIDRs, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("run: --cluster-cidrs: %q is not a CIDR", c)
		}
		ao.ClusterCIDRs = append(ao.ClusterCIDRs, p.Masked())
	}
	ao.PoliteWait = o.politeWait
	switch maps.FlowEvents(o.flowEvents) {
	case maps.FlowsOff, maps.FlowsNode, maps.FlowsPods:
	default:
		return fmt.Errorf("run: --flow-events %q: want off, node or pods", o.flowEvents)
	}
	ao.Events = &maps.EventSettings{Drops: o.dropEvents, Flows: maps.FlowEvents(o.flowEvents), Rate: uint32(o.eventRate), Burst: uint32(o.eventBurst)}
	ao.EventsKeep = o.eventsKeep
	ao.Logger = log.New(os.Stderr, "ebpf-agent: ", log.LstdFlags|log.Lmicroseconds) // microseconds: a loss under traffic is placed among the agent's steps
	s, err := o.sizing()
	if err != nil {
		return err
	}
	ao.Sizing = s
	if o.uninstallOnStop != "" {
		go watchUninstallMode(ctx, o.uninstallOnStop, ao.Logger)
	}
	if err := agent.Run(ctx, ao); err != nil {
		return err
	}
	// Only a stop (SIGTERM: the DaemonSet deleted, or the pod replaced)
	// gets here; the file says whether this stop is an uninstall.
	mode := uninstallMode(o.uninstallOnStop)
	if mode == "" {
		return nil
	}
	ao.Logger.Printf("stopped; %s says %q: uninstalling the node", o.uninstallOnStop, mode)
	o.force = mode == "force"
	return uninstallWith(o, true)
}

func status(o *opts) error {
	r := inspect.Status(o.source(), Version)
	if err := inspect.Write(os.Stdout, r, o.format); err != nil {
		return err
	}
	if !r.Healthy {
		return errUnhealthy{}
	}
	return nil
}

// dump is a read-only command printing one report.
func dump(read func(inspect.Source) (inspect.Report, error)) func(*opts) error {
	return func(o *opts) error {
		r, err := read(o.source())
		if err != nil {
			return err
		}
		return inspect.Write(os.Stdout, r, o.format)
	}
}

// report prints r even when err is set (what was done before the failure),
// then returns err.
func report(o *opts, r inspect.Report, err error) error {
	if werr := inspect.Write(os.Stdout, r, o.format); werr != nil {
		return werr
	}
	return err
}

func peers(o *opts) error {
	if o.peersFile == "" {
		return errors.New("peers: --peers FILE is required")
	}
	ps, err := agent.LoadPeers(o.peersFile)
	if err != nil {
		return err
	}
	t, err := o.tunnelOptions()
	if err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	if t.Mode == datapath.TunnelOff {
		// A node that had a tunnel keeps its maps: off must take the
		// tunnel's state out of them too (its device, HP_CFG_TUNNEL, the
		// peers marked encapsulated, whose pods' packets in the clear the
		// uplinks would drop) and its table 199 rules and next hops. A
		// node never set up has none of that.
		dp, err := datapath.OpenMapsLean(o.pinDir)
		if errors.Is(err, os.ErrNotExist) {
			rs, err := agent.SyncPeerRoutes(ps)
			return report(o, rs, err)
		}
		if err != nil {
			return fmt.Errorf("peers: datapath at %s: %w", o.pinDir, err)
		}
		defer dp.Close()
		var rs agent.PeerRoutes
		err = maps.Guard(func() (err error) { rs, err = agent.SyncTunnelPeers(dp, t, ps); return err }) // lean: maps opened at first use
		return report(o, rs, err)
	}
	// The tunnel's device and maps: the datapath, set up if no ADD or
	// agent did yet.
	s, err := o.sizing()
	if err != nil {
		return err
	}
	dp, err := datapath.Ensure(o.pinDir, s)
	if err != nil {
		return fmt.Errorf("peers: datapath at %s: %w", o.pinDir, err)
	}
	defer dp.Close()
	rs, err := agent.SyncTunnelPeers(dp, t, ps)
	return report(o, rs, err)
}

func reconcile(o *opts) error {
	st, err := agent.ReconcileAll(o.agentOptions(), o.dryRun)
	return report(o, agent.Reconciled{Stale: st, DryRun: o.dryRun}, err)
}

func uninstall(o *opts) error { return uninstallWith(o, false) }

// uninstallWith is uninstall, from the stopped agent's process too.
func uninstallWith(o *opts, agentStopped bool) error {
	uo := agent.UninstallOptions{Options: o.agentOptions(), Force: o.force, AgentStopped: agentStopped,
		Warn: func(s string) { fmt.Fprintln(os.Stderr, "ebpf-agent: warning:", s) }}
	uo.CgroupRoot = o.cgroupRoot
	if o.confTemplate != "" {
		uo.ConfFiles = []string{filepath.Join(o.confDir, filepath.Base(o.confTemplate))}
	}
	u, err := agent.Uninstall(uo)
	var pe *agent.PodsPresentError
	if errors.As(err, &pe) || err != nil && len(u.Removed) == 0 {
		return err // nothing was done: no report (its "nothing found" would mislead)
	}
	return report(o, u, err)
}

// upgraded is upgrade's report.
type upgraded struct{ datapath.UpgradeReport }

func (u upgraded) Tables() []inspect.Table {
	return []inspect.Table{{Lines: []string{fmt.Sprintf("links: %d, swapped in place: %d, defunct: %d, old program pins removed: %d, old map directories removed: %d; tc filters: %d, swapped in place: %d",
		u.Links, u.Replaced, len(u.Defunct), len(u.RemovedProgs), len(u.RemovedMaps), u.Filters, u.FiltersSwap)}}}
}

func upgrade(o *opts) error {
	s, err := o.sizing()
	if err != nil {
		return err
	}
	dp, err := datapath.Ensure(o.pinDir, s)
	if err != nil {
		return err
	}
	defer dp.Close()
	rep, err := dp.Upgrade(o.force)
	return report(o, upgraded{rep}, err)
}
