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
	interval, politeWait           time.Duration
	hostPorts, networkPolicy       bool
	policyStatusDir                string
	// run: Node-following, the conflist, cluster CIDRs
	kubeconfig, nodeName, confTemplate, clusterCIDRs string
	// reconcile, upgrade
	dryRun, force bool
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
	{name: "dump ct", help: "translated hostPort flows, node sockets and stack flows (read-only)",
		run: dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadCT(s) })},
	{name: "dump nat", help: "masqueraded (ipMasq) flows, cluster CIDRs, counters (read-only)",
		run: dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadNAT(s) })},
	{name: "dump attachments", help: "the plugin's attachment records: container, interface, host veth, IPs (read-only)",
		run: dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadAttachments(s) })},
	{name: "dump policy", help: "per pod: the NetworkPolicies selecting it, what they allow per direction, policy drops (read-only)",
		flags: func(fs *flag.FlagSet, o *opts) {
			fs.StringVar(&o.policyStatusDir, "policy-status-dir", netpol.DefaultStatusDir, "where the agent records what it programmed (its run --policy-status-dir)")
		}, run: func(o *opts) error {
			return dump(func(s inspect.Source) (inspect.Report, error) { return inspect.ReadPolicy(s, o.policyStatusDir) })(o)
		}},
	{name: "peers", help: "install routes to other nodes' pod CIDRs via their node IPs once (run does it at every reconcile)",
		flags: func(fs *flag.FlagSet, o *opts) {
			fs.StringVar(&o.peersFile, "peers", "", "JSON file [{nodeIP, podCIDRs}] (required)")
		}, run: peers},
	{name: "reconcile", help: "remove state of pods that are gone (--dry-run lists it)",
		flags: func(fs *flag.FlagSet, o *opts) {
			fs.BoolVar(&o.dryRun, "dry-run", false, "only list what would be removed")
		}, run: reconcile},
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

func runFlags(fs *flag.FlagSet, o *opts) {
	fs.StringVar(&o.peersFile, "peers", "", "JSON file [{nodeIP, podCIDRs}] of the other nodes: routes to their pod CIDRs via their node IPs (host-gw)")
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
	fs.StringVar(&o.clusterCIDRs, "cluster-cidrs", "", "comma-separated CIDRs ipMasq never masquerades (default with --node-name: every node's pod CIDRs)")
	sizingFlags(fs, o)
}

func run(o *opts) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ao := o.agentOptions()
	ao.MetricsAddr, ao.ReconcileInterval, ao.Version = o.metrics, o.interval, Version
	ao.HostPorts, ao.CgroupRoot, ao.PeersFile = o.hostPorts, o.cgroupRoot, o.peersFile
	ao.ConfTemplate = o.confTemplate
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
	ao.Logger = log.New(os.Stderr, "ebpf-agent: ", log.LstdFlags)
	s, err := o.sizing()
	if err != nil {
		return err
	}
	ao.Sizing = s
	return agent.Run(ctx, ao)
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
	rs, err := agent.SyncPeerRoutes(ps)
	return report(o, rs, err)
}

func reconcile(o *opts) error {
	st, err := agent.ReconcileAll(o.agentOptions(), o.dryRun)
	return report(o, agent.Reconciled{Stale: st, DryRun: o.dryRun}, err)
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
