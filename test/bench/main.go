// Command bench measures ebpf-cni next to the reference plugins
// (containernetworking/plugins ptp, portmap, bandwidth, loopback at the
// versions go.mod pins), driving every plugin through cnitool exactly as a
// runtime would, inside throwaway node network namespaces:
//
//   - latency: ADD and DEL of one pod, ebpf-cni with hostPort + bandwidth
//     beside ptp+portmap+bandwidth, plain ebpf-cni beside ptp, a loopback floor;
//     ebpf-cni on nodes whose agent runs the VXLAN tunnel (and hybrid) beside
//     one whose agent runs it off (tunstart.go, -tunnel-start);
//
//   - scale: ADD and DEL with 1, 200 pods of the same configuration present;
//
//   - hostport: ADD/DEL with 1, 200, 1000 pods holding hostPorts, and new TCP
//     connections/s through a hostPort beside a raw veth pair and plain
//     routing through a node (hostport.go); new connections/s from a pod
//     through masquerade at 1, 200, 1000 pods (masqconn.go);
//
//   - throughput: iperf3, 1 and 4 streams, pod to pod and remote to hostPort,
//     beside ptp(+portmap), as ratios to a raw veth pair (throughput.go);
//
//   - memory: plugin peak RSS per ADD, agent RSS, BPF map memory per pod
//     (memory.go);
//
//   - burst: 100 pods ADDed at the same instant, then DELed, beside ptp;
//     coldstart: the first ADD on a node with and without the agent
//     having loaded the datapath (burst.go);
//
//   - bandwidth: how accurately pod rate limits hold, and latency under
//     load, beside ptp + bandwidth (test/bench/bandwidth);
//
//   - events: pod-to-pod throughput and request/response latency with
//     datapath events off and flow events on, and the agent's CPU while
//     observing a 10k packets/s drop flood (test/bench/events);
//
//   - packet: the per-packet budget, ns per program run (BPF_PROG_TEST_RUN)
//     on each path, beside the reference commit -packet-ref (packet.go).
//
//   - netpol: pod-to-pod throughput and request/response latency with 0, 1
//     and 100 NetworkPolicies selecting the pods, new connections/s through
//     an allowed policy, policy change to enforcement and memory at 1000
//     pods x 500 policies (test/bench/netpol).
//
//   - tunnel: cross-node pod-to-pod throughput and 1-byte request/response,
//     the VXLAN tunnel against host-gw, in the integration tests' tunnel lab
//     (runs TestTunnelBench, tag tunnelbench; make bench-tunnel alone).
//
// Every part's figures also go to one combined table, bench-<date>.md and
// .json, each with its spread and its ratio to the reference measured in
// the same run (make bench: all parts, full under 15 minutes on 2 cores).
//
// Run from the repository root, as root:
//
//	go run ./test/bench              # everything: n=20, scale 1,200, hostPort 1,200,1000 (ptp+portmap at 1,200), throughput 10 s runs (3 rounds 1 stream, 1 round 4 streams), memory at 200 pods
//	go run ./test/bench -quick       # n=10, scale 1,50, hostPort 1,100, throughput 1 round of 5 s runs, memory at 50 pods
//	go run ./test/bench -attach-tc   # also ebpf-cni with attachMode tc in the latency rounds
//	go run ./test/bench -parts throughput,memory       # some parts only
//	go run ./test/bench -parts bandwidth -bw-rates 10  # bandwidth accuracy at 10 Mbit/s
//	go run ./test/bench -hostport-only                 # = -parts hostport
//	go run ./test/bench -hostport-scale ""             # skip the hostPort part
//
// The process re-executes itself in a private mount namespace where a temp
// directory is bind-mounted over /var/lib/cni: cnitool has no way to move
// libcni's result cache, and the host's /var/lib/cni must stay untouched.
// Network namespaces are bind-mounted under the temp directory, so they too
// are invisible to the host and vanish with the process. The only host-visible
// objects are the temp directory and the bpffs pin directories
// /sys/fs/bpf/ebpfbench-<rand>[-<part>]; all are removed, and every iperf3
// and ebpf-agent process killed, on exit, on failure and on SIGINT/SIGTERM.
// /etc/cni, /opt/cni, /var/lib/cni and the host's iptables are never touched
// (portmap's rules live in the node namespaces).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/test/bench/bandwidth"
	"github.com/ebpf-cni/ebpf-cni/test/bench/events"
	"github.com/ebpf-cni/ebpf-cni/test/bench/netpol"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

type options struct {
	n        int
	scale    []int
	quick    bool
	outDir   string
	phases   bool
	attachTC bool
	// tunnelNodeCPUs: the tunnel part's lab with a CPU per node.
	tunnelNodeCPUs bool
	// scaleReps is how many ADD+DEL are timed at each scale point.
	scaleReps int

	// hostPort benchmark (hostport.go)
	hpScale []int
	// hpRefScale: the points at which ptp+portmap is measured too.
	hpRefScale []int
	// masqScale: pods present at which new connections/s through
	// masquerade are measured (masqconn.go, inside the hostport part).
	masqScale []int
	// nodeCT: every node netns of the hostport part tracks connections
	// (conntrack), as a node running kube-proxy does; off, each has only
	// what its own plugin's rules turn on (hostport.go).
	nodeCT bool
	// bpfStats: kernel.bpf_stats_enabled during the run, and the
	// programs' run counts and times logged at each ebpf-cni hostPort and masquerade point.
	bpfStats bool
	// routedVeths: at each ebpf-cni hostPort point, the routed floor's
	// node gets as many host veths (and pod routes) as ebpf-cni's node
	// has pods, so the floor carries the lab's per-pod devices too
	// (hostport.go growRoutedVeths).
	routedVeths bool
	// masqHold: a file; while it exists, each ebpf-cni masquerade point
	// waits before its measurement, its namespaces logged (experiments by
	// hand on the bench's own topology, docs/performance.md round 15).
	masqHold string
	connSecs float64
	workers  int

	// throughput benchmark (throughput.go)
	tputSecs        int
	tputRounds      int
	tputRoundsMulti int
	tputReruns      int

	// memory benchmark (memory.go)
	memPods   int
	agentSecs float64

	// agent: ebpf-agent run on the ebpf-cni nodes of the latency, scale
	// and burst parts (agent.go)
	agent bool
	// tunnelStart: the latency rounds also time ADD and DEL on nodes
	// whose agent runs with the tunnel off, vxlan and hybrid (tunstart.go).
	tunnelStart bool

	// burst and coldstart (burst.go)
	burstPods   int
	burstRounds int
	coldRounds  int

	// bandwidth part (test/bench/bandwidth)
	bw *bandwidth.Options
	// events part (test/bench/events)
	ev *events.Options
	// packet part (packet.go): the reference commit ("" for none) and
	// how many runs of each build alternate.
	packetRef  string
	packetRuns int
	// netpol part (test/bench/netpol)
	np *netpol.Options

	parts map[string]bool
}

// The parts of the benchmark; throughput runs first (bench.run).
const (
	partLatency    = "latency"
	partScale      = "scale"
	partHostPort   = "hostport"
	partThroughput = "throughput"
	partMemory     = "memory"
	partBurst      = "burst"
	partColdStart  = "coldstart"
	partBandwidth  = "bandwidth"
	partEvents     = "events"
	partPacket     = "packet"
	partNetpol     = "netpol"
	partTunnel     = "tunnel"
)

var allParts = []string{partPacket, partLatency, partScale, partHostPort, partThroughput, partMemory, partBurst, partColdStart, partBandwidth, partEvents, partNetpol, partTunnel}

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	n := fs.Int("n", 20, "timed ADD/DEL repetitions per configuration")
	scale := fs.String("scale", "1,200,1000", "comma-separated numbers of pods present for the at-scale runs (\"\" or \"0\" to skip)")
	quick := fs.Bool("quick", false, "quick run: n=10, scale 1,50, hostPort 1,100, conn 2 s, throughput 1 round of 5 s, memory at 50 pods (explicit flags still win)")
	out := fs.String("out", "results", "directory for bench-<date>.md and .json")
	parts := fs.String("parts", strings.Join(allParts, ","), "comma-separated parts to run: "+strings.Join(allParts, ", "))
	tputSecs := fs.Int("tput-seconds", 10, "seconds per iperf3 run of the throughput benchmark")
	tputRounds := fs.Int("tput-rounds", 3, "rounds of the throughput benchmark, each measuring every path with 1 stream")
	tputReruns := fs.Int("tput-reruns", 3, "throughput runs measured again when other work competed for the CPUs during them (at most this many)")
	tputRoundsMulti := fs.Int("tput-rounds-4", 1, "how many of those rounds also measure every path with 4 streams")
	memPods := fs.Int("mem-pods", 110, "pods present for the memory benchmark's map memory and agent RSS (the default maxPods the maps are sized for; more than twice it does not fit)")
	agentSecs := fs.Float64("agent-seconds", 4, "seconds the agent runs (after loading the datapath) before its RSS is read")
	attachTC := fs.Bool("attach-tc", false, "also measure ebpf-cni with attachMode tc (clsact + cls_bpf instead of tcx links), without the at-scale runs")
	hpScale := fs.String("hostport-scale", "1,200,1000", "pods with hostPorts at which to measure ADD latency and connections/s through a hostPort, ebpf-cni beside ptp+portmap (\"\" to skip)")
	hpRefScale := fs.String("hostport-ref-scale", "1,200", "the -hostport-scale points at which ptp+portmap is measured too (portmap's ADD and DEL rewrite the whole iptables ruleset: 1000 of them take minutes)")
	masqScale := fs.String("masq-scale", "1,200,1000", "hostport part: pods present at which to measure new connections/s from a pod to a server outside the node through masquerade, ebpf-cni ipMasq beside ptp ipMasq and plain routing (\"\" to skip)")
	nodeCT := fs.Bool("node-conntrack", false, "hostport part: give every node netns of the part (the routed floor's, ebpf-cni's, the reference plugins') kube-proxy's FORWARD rule dropping INVALID, so conntrack is on in all of them, as on a node running kube-proxy (default: off in all but what a plugin's own rules turn on)")
	masqHold := fs.String("masq-hold", "", "hostport part: a file; while it exists each ebpf-cni masquerade point logs its namespaces and waits before its measurement (for experiments by hand on the bench's topology; the lock stays held meanwhile)")
	bpfStats := fs.Bool("bpf-stats", false, "hostport part: set kernel.bpf_stats_enabled for the run and log each program's runs and ns per run at ebpf-cni's hostPort and masquerade points (costs every BPF program of the machine a little)")
	routedVeths := fs.Bool("routed-veths", false, "hostport part: at each ebpf-cni hostPort point, give the routed floor's node as many more host veths, each with a pod route (peers in a netns of their own), as ebpf-cni's node has pods, so the floor at 1000 pods has 1000 veths too (default: the floor's node has its one pod veth at every point)")
	hpOnly := fs.Bool("hostport-only", false, "run only the hostPort benchmark")
	connSecs := fs.Float64("conn-seconds", 3, "seconds of connections per measurement of the hostPort benchmark")
	workers := fs.Int("conn-workers", 4, "parallel client connections of the hostPort benchmark")
	burstPods := fs.Int("burst-pods", 100, "pods ADDed (then DELed) at the same instant in the burst part")
	burstRounds := fs.Int("burst-rounds", 20, "rounds of the burst part (each configuration once per round)")
	coldRounds := fs.Int("cold-rounds", 5, "rounds of the coldstart part (each a first ADD without and one with the agent)")
	bwRates := fs.String("bw-rates", "", "bandwidth part: comma-separated rates in Mbit/s (default 10,100,1000; -quick 10,100)")
	bwSecs := fs.Int("bw-seconds", 0, "bandwidth part: seconds per iperf3 run (default 10; -quick 5)")
	tunnelStart := fs.Bool("tunnel-start", true, "latency part, with -agent: also ebpf-cni on nodes whose agent runs --tunnel off, vxlan and vxlan --tunnel-hybrid with a peers file (a node on another subnet), the pods at the mode's MTU: pod start with the tunnel against without (issue 24)")
	withAgent := fs.Bool("agent", true, "run ebpf-agent on the ebpf-cni nodes of the latency, scale and burst parts, as a node would have it (ADD then attaches cls_bpf and DEL hands the veth off; the agent's background work is timed apart)")
	packetRef := fs.String("packet-ref", "41b58f6", "packet part: the commit whose programs each path is compared with (\"\" for none)")
	packetRuns := fs.Int("packet-runs", 3, "packet part: runs of each build, alternating (each 15 rounds of 400 runs per path)")
	tunNodeCPUs := fs.Bool("tunnel-node-cpus", true, "tunnel part: after the lab whose nodes share both CPUs, also the one that gives each lab node's receive and its pod's iperf3 a CPU of its own (TUNNEL_BENCH_NODE_CPUS=1, docs/performance.md round 13)")
	phases := fs.Bool("phases", true, "set EBPF_CNI_TRACE=1 for ebpf-cni and report its own phase timings (costs a few time.Now calls and one stderr line)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./test/bench [flags]   (as root, from the repository root)\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o := &options{n: *n, quick: *quick, outDir: *out, phases: *phases, attachTC: *attachTC, scaleReps: 10,
		connSecs: *connSecs, workers: *workers, tputSecs: *tputSecs, tputRounds: *tputRounds, tputRoundsMulti: *tputRoundsMulti, tputReruns: *tputReruns,
		memPods: *memPods, agentSecs: *agentSecs, burstPods: *burstPods, burstRounds: *burstRounds, coldRounds: *coldRounds, agent: *withAgent, tunnelStart: *tunnelStart,
		packetRef: *packetRef, packetRuns: *packetRuns, parts: map[string]bool{}, tunnelNodeCPUs: *tunNodeCPUs}
	if o.quick {
		if !set["packet-runs"] {
			o.packetRuns = 1
		}
		if !set["n"] {
			o.n = 10
		}
		if !set["scale"] {
			*scale = "1,50"
		}
		if !set["hostport-scale"] {
			*hpScale = "1,100"
		}
		if !set["hostport-ref-scale"] {
			*hpRefScale = "1,100"
		}
		if !set["masq-scale"] {
			*masqScale = "1,100"
		}
		if !set["conn-seconds"] {
			o.connSecs = 2
		}
		if !set["tput-seconds"] {
			o.tputSecs = 5
		}
		if !set["tput-rounds"] {
			o.tputRounds = 1
		}
		if !set["tput-reruns"] {
			o.tputReruns = 1
		}
		if !set["mem-pods"] {
			o.memPods = 50
		}
		if !set["agent-seconds"] {
			o.agentSecs = 3
		}
		if !set["burst-rounds"] {
			o.burstRounds = 3
		}
		if !set["cold-rounds"] {
			o.coldRounds = 2
		}
	}
	if o.tputSecs < 2 || o.tputSecs > 120 || o.tputRounds < 1 || o.tputRoundsMulti < 0 || o.tputRoundsMulti > o.tputRounds {
		return nil, fmt.Errorf("-tput-seconds must be 2-120, -tput-rounds at least 1, -tput-rounds-4 between 0 and -tput-rounds")
	}
	if o.burstPods < 1 || o.burstPods > 1000 || o.burstRounds < 1 || o.coldRounds < 1 {
		return nil, fmt.Errorf("-burst-pods must be 1-1000, -burst-rounds and -cold-rounds at least 1")
	}
	if o.packetRuns < 1 {
		return nil, fmt.Errorf("-packet-runs must be at least 1")
	}
	if o.memPods < 1 || o.memPods > 10000 || o.agentSecs <= 0 {
		return nil, fmt.Errorf("-mem-pods must be 1-10000 and -agent-seconds positive")
	}
	for _, p := range strings.Split(*parts, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !slices.Contains(allParts, p) {
			return nil, fmt.Errorf("-parts: unknown part %q (have %s)", p, strings.Join(allParts, ", "))
		}
		o.parts[p] = true
	}
	if *hpOnly {
		o.parts = map[string]bool{partHostPort: true}
	}
	if o.connSecs <= 0 || o.workers < 1 {
		return nil, fmt.Errorf("-conn-seconds and -conn-workers must be positive")
	}
	var err error
	if o.hpScale, err = parseScale(*hpScale, "-hostport-scale"); err != nil {
		return nil, err
	}
	if *hpOnly && len(o.hpScale) == 0 {
		return nil, fmt.Errorf("-hostport-only with an empty -hostport-scale measures nothing")
	}
	if len(o.hpScale) == 0 {
		delete(o.parts, partHostPort)
	}
	if o.masqScale, err = parseScale(*masqScale, "-masq-scale"); err != nil {
		return nil, err
	}
	o.nodeCT, o.bpfStats, o.masqHold, o.routedVeths = *nodeCT, *bpfStats, *masqHold, *routedVeths
	ref, err := parseScale(*hpRefScale, "-hostport-ref-scale")
	if err != nil {
		return nil, err
	}
	for _, p := range ref {
		if slices.Contains(o.hpScale, p) {
			o.hpRefScale = append(o.hpRefScale, p)
		}
	}
	if o.n < 1 {
		return nil, fmt.Errorf("-n must be at least 1")
	}
	if o.scale, err = parseScale(*scale, "-scale"); err != nil {
		return nil, err
	}
	if len(o.scale) == 0 {
		delete(o.parts, partScale)
	}
	if len(o.parts) == 0 {
		return nil, errors.New("nothing to measure")
	}
	if o.parts[partEvents] {
		o.ev = events.NewOptions(o.quick, o.outDir)
	}
	if o.parts[partNetpol] {
		o.np = netpol.NewOptions(o.quick, o.outDir)
	}
	if o.parts[partBandwidth] {
		if o.bw, err = bandwidth.NewOptions(o.quick, o.outDir, *bwRates, *bwSecs); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// parseScale reads a comma-separated list of pod counts, sorted, without duplicates.
func parseScale(s, flagName string) ([]int, error) {
	var out []int
	seen := map[int]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := strconv.Atoi(f)
		if err != nil || p < 0 || p > 60000 {
			return nil, fmt.Errorf("%s: %q is not a pod count (0-60000)", flagName, f)
		}
		if p > 0 && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Ints(out)
	return out, nil
}

func main() {
	opts, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: must run as root (network namespaces, BPF, mounts)")
		os.Exit(1)
	}
	if os.Getenv(testenv.InnerEnv) == "" {
		os.Exit(testenv.Outer("bench", testenv.InnerEnv, testenv.CmdlineEnv))
	}
	os.Exit(inner(opts))
}

// inner runs the parts; every exit path goes through the cleanup. The
// plugin parts (bench.run) go first, then bandwidth, each cleaned up before
// the next starts; then the combined table.
func inner(opts *options) int {
	var (
		b  *bench
		bw *bandwidth.Bench
		ev *events.Bench
		np *netpol.Bench
	)
	cleanup := func() {
		if np != nil {
			np.Cleanup()
			np = nil
		}
		if ev != nil {
			ev.Cleanup()
			ev = nil
		}
		if b != nil {
			b.cleanup()
			b = nil
		}
		if bw != nil {
			bw.Cleanup()
			bw = nil
		}
	}
	return testenv.Inner("bench", logf, func(ctx context.Context) error {
		c := newCombined(opts)
		if opts.parts[partPacket] {
			// First: a CPU-bound measurement, on the quietest machine.
			dir, err := os.MkdirTemp("", "ebpfbench-packet-")
			if err != nil {
				return err
			}
			rows, err := runPacket(ctx, opts, dir)
			os.RemoveAll(dir)
			if err != nil {
				return err
			}
			c.add(rows)
		}
		if opts.cniParts() {
			var err error
			if b, err = newBench(ctx, opts); err != nil {
				return err
			}
			if err := b.run(ctx); err != nil {
				return err
			}
			c.add(b.res.Rows)
			cleanup()
		}
		if opts.parts[partBandwidth] {
			var err error
			if bw, err = bandwidth.New(ctx, opts.bw); err != nil {
				return err
			}
			if err := bw.Run(ctx); err != nil {
				return err
			}
			c.add(bw.Rows())
			cleanup()
		}
		if opts.parts[partEvents] {
			var err error
			if ev, err = events.New(ctx, opts.ev); err != nil {
				return err
			}
			if err := ev.Run(ctx); err != nil {
				return err
			}
			c.add(ev.Rows())
			cleanup()
		}
		if opts.parts[partNetpol] {
			var err error
			if np, err = netpol.New(ctx, opts.np); err != nil {
				return err
			}
			if err := np.Run(ctx); err != nil {
				return err
			}
			c.add(np.Rows())
			cleanup()
		}
		if opts.parts[partTunnel] {
			// Last, and it may fail alone (a test of its own): the
			// other parts' table is written first.
			rows, err := runTunnel(ctx, opts)
			if err != nil {
				return errors.Join(err, c.write(opts.outDir))
			}
			c.add(rows)
		}
		return c.write(opts.outDir)
	}, cleanup)
}

// cniParts tells whether a part measured by bench.run was asked for.
func (o *options) cniParts() bool {
	for p := range o.parts {
		if p != partBandwidth && p != partEvents && p != partPacket && p != partNetpol && p != partTunnel {
			return true
		}
	}
	return false
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...)
}
