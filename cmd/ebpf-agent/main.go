// Command ebpf-agent is the ebpf-cni node agent and inspection CLI.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

const usage = `usage: ebpf-agent COMMAND [flags]

  run                 own the pinned datapath: upgrade programs in place, reconcile, serve metrics
  status              datapath health, versions, attach points (read-only)
  dump endpoints      pod IPs with interfaces, pods and counters (read-only)
  dump bandwidth      per-pod rate limits with passed and dropped traffic (read-only)
  dump stats          every counter by pod, direction and reason (read-only)
  dump hostports      hostPort mappings with their pods (read-only)
  dump ct             translated hostPort flows and node sockets (read-only)
  dump nat            masqueraded (ipMasq) flows, cluster CIDRs, counters (read-only)
  dump attachments    the plugin's attachment records: container, interface, host veth, IPs (read-only)
  peers --peers FILE  install routes to other nodes' pod CIDRs via their node IPs once (run does it at every reconcile)
  reconcile           remove state of pods that are gone (--dry-run lists it)
  upgrade             swap every attachment to this build's programs in place (--force reloads them)

common flags: --pin-dir DIR --state-dir DIR; dumps and status: -o table|json
`

type common struct {
	pinDir, stateDir, confDir, binDir, format string
}

func flags(name string, args []string, extra func(fs *flag.FlagSet)) (*common, *flag.FlagSet) {
	c := &common{}
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	fs.StringVar(&c.pinDir, "pin-dir", datapath.DefaultPinRoot, "bpffs directory of the datapath")
	fs.StringVar(&c.stateDir, "state-dir", state.DefaultDir, "plugin state directory (attachment records)")
	fs.StringVar(&c.confDir, "cni-conf-dir", "/etc/cni/net.d", "CNI configuration directory (networks to reconcile)")
	fs.StringVar(&c.binDir, "cni-bin-dir", "/opt/cni/bin", "CNI plugin directory (IPAM plugins, to release addresses)")
	fs.StringVar(&c.format, "o", "table", "output format: table or json")
	if extra != nil {
		extra(fs)
	}
	fs.Parse(args)
	return c, fs
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	args := os.Args[2:]
	switch os.Args[1] {
	case "run":
		err = run(args)
	case "status":
		c, _ := flags("status", args, nil)
		r := agent.Status(c.pinDir, Version)
		err = agent.WriteStatus(os.Stdout, r, c.format)
		if err == nil && !r.Healthy {
			os.Exit(1)
		}
	case "dump":
		err = dump(args)
	case "peers":
		var file string
		c, _ := flags("peers", args, func(fs *flag.FlagSet) { fs.StringVar(&file, "peers", "", "JSON file [{nodeIP, podCIDRs}]") })
		err = syncPeers(c, file)
	case "reconcile":
		var dry bool
		c, _ := flags("reconcile", args, func(fs *flag.FlagSet) { fs.BoolVar(&dry, "dry-run", false, "only list what would be removed") })
		err = reconcile(c, dry)
	case "upgrade":
		var force bool
		c, _ := flags("upgrade", args, func(fs *flag.FlagSet) {
			fs.BoolVar(&force, "force", false, "reload this build's programs even if already pinned, and swap them in")
		})
		err = upgrade(c, force)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ebpf-agent:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var (
		metrics    string
		interval   time.Duration
		hostPorts  bool
		cgroupRoot string
		peersFile  string
	)
	c, _ := flags("run", args, func(fs *flag.FlagSet) {
		fs.StringVar(&peersFile, "peers", "", "JSON file [{nodeIP, podCIDRs}] of the other nodes: routes to their pod CIDRs via their node IPs (host-gw)")
		fs.StringVar(&metrics, "metrics-addr", "127.0.0.1:9964", "Prometheus metrics listener; empty disables it")
		fs.DurationVar(&interval, "reconcile-interval", time.Minute, "how often to look for stale state")
		fs.BoolVar(&hostPorts, "hostports", true, "own the node-level hostPort hooks (uplinks, cgroup socket hooks, node addresses)")
		fs.StringVar(&cgroupRoot, "cgroup-root", "", "cgroup2 directory for the node-wide socket hooks (default: the cgroup2 mount)")
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return agent.Run(ctx, agent.Options{
		PinRoot: c.pinDir, StateDir: c.stateDir, ConfDir: c.confDir, CNIPath: c.binDir,
		MetricsAddr: metrics, ReconcileInterval: interval, Version: Version,
		HostPorts: hostPorts, CgroupRoot: cgroupRoot, PeersFile: peersFile,
		Logger: log.New(os.Stderr, "ebpf-agent: ", log.LstdFlags),
	})
}

func dump(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("dump what? (endpoints, bandwidth, stats, hostports, ct, nat or attachments)")
	}
	c, _ := flags("dump", args[1:], nil)
	switch args[0] {
	case "endpoints":
		rows, err := agent.Endpoints(c.pinDir, c.stateDir)
		if err != nil {
			return err
		}
		return agent.WriteEndpoints(os.Stdout, rows, c.format)
	case "bandwidth":
		rows, err := agent.Bandwidth(c.pinDir, c.stateDir)
		if err != nil {
			return err
		}
		return agent.WriteBandwidth(os.Stdout, rows, c.format)
	case "stats":
		rows, err := agent.Stats(c.pinDir, c.stateDir)
		if err != nil {
			return err
		}
		return agent.WriteStats(os.Stdout, rows, c.format)
	case "hostports":
		rows, err := agent.HostPorts(c.pinDir, c.stateDir)
		if err != nil {
			return err
		}
		return agent.WriteHostPorts(os.Stdout, rows, c.format)
	case "ct":
		d, err := agent.CT(c.pinDir)
		if err != nil {
			return err
		}
		return agent.WriteCT(os.Stdout, d, c.format)
	case "nat":
		d, err := agent.NAT(c.pinDir)
		if err != nil {
			return err
		}
		return agent.WriteNAT(os.Stdout, d, c.format)
	case "attachments":
		rows, err := agent.Attachments(c.stateDir)
		if err != nil {
			return err
		}
		return agent.WriteAttachments(os.Stdout, rows, c.format)
	}
	return fmt.Errorf("unknown dump %q (want endpoints, bandwidth, stats, hostports, ct, nat or attachments)", args[0])
}

func reconcile(c *common, dry bool) error {
	st, err := agent.ReconcileAll(agent.Options{PinRoot: c.pinDir, StateDir: c.stateDir, ConfDir: c.confDir, CNIPath: c.binDir}, dry)
	if c.format == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if e := enc.Encode(st); e != nil {
			return e
		}
	} else {
		verb := "removed"
		if dry {
			verb = "would remove"
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "KIND\t%s\n", map[bool]string{true: "WOULD REMOVE", false: "REMOVED"}[dry])
		for _, s := range st {
			fmt.Fprintf(tw, "%s\t%s\n", s.Kind, s.What)
		}
		tw.Flush()
		fmt.Printf("%s %d items\n", verb, len(st))
	}
	return err
}

func upgrade(c *common, force bool) error {
	dp, err := datapath.Ensure(c.pinDir)
	if err != nil {
		return err
	}
	defer dp.Close()
	rep, err := dp.Upgrade(force)
	if c.format == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if e := enc.Encode(rep); e != nil {
			return e
		}
	} else {
		fmt.Printf("links: %d, swapped in place: %d, defunct: %d, old program pins removed: %d\n",
			rep.Links, rep.Replaced, len(rep.Defunct), len(rep.RemovedProgs))
	}
	return err
}

func syncPeers(c *common, file string) error {
	if file == "" {
		return fmt.Errorf("peers: --peers FILE is required")
	}
	ps, err := agent.LoadPeers(file)
	if err != nil {
		return err
	}
	rs, err := agent.SyncPeerRoutes(ps)
	if c.format == "json" {
		if rs == nil {
			rs = []agent.PeerRoute{}
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if e := enc.Encode(rs); e != nil {
			return e
		}
	} else {
		for _, r := range rs {
			fmt.Printf("%s via %s\n", r.Dst, r.Via)
		}
	}
	return err
}
