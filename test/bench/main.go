// Command bench measures CNI ADD and DEL latency of ebpf-cni next to the
// reference plugins (ptp, ptp+portmap+bandwidth, loopback), driving every
// plugin through cnitool exactly as a runtime would, inside a throwaway node
// network namespace.
//
// Run from the repository root, as root:
//
//	go run ./test/bench              # n=20, scale 1,200, then hostPort at 1,200,1000 pods (about 8 minutes on 2 cores)
//	go run ./test/bench -quick       # n=10, scale 1,50, hostPort at 1,100 (about 2 minutes)
//	go run ./test/bench -attach-tc   # also ebpf-cni with attachMode tc
//	go run ./test/bench -hostport-only                 # only the hostPort benchmark
//	go run ./test/bench -hostport-scale ""             # skip it
//
// The process re-executes itself in a private mount namespace where a temp
// directory is bind-mounted over /var/lib/cni: cnitool has no way to move
// libcni's result cache, and the host's /var/lib/cni must stay untouched.
// Network namespaces are bind-mounted under the temp directory, so they too
// are invisible to the host and vanish with the process. The only host-visible
// objects are the temp directory and the bpffs pin directory
// /sys/fs/bpf/ebpfbench-<rand>; both are removed on exit, on failure and on
// SIGINT/SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/test/internal/benchkit"
)

// innerEnv marks the re-executed process running in the private mount namespace.
const (
	innerEnv   = "EBPFBENCH_INNER"
	cmdlineEnv = "EBPFBENCH_CMDLINE"
)

type options struct {
	n        int
	scale    []int
	quick    bool
	outDir   string
	phases   bool
	attachTC bool
	// scaleReps is how many ADD+DEL are timed at each scale point.
	scaleReps int

	// hostPort benchmark (hostport.go)
	hpScale  []int
	hpOnly   bool
	connSecs float64
	workers  int
}

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	n := fs.Int("n", 20, "timed ADD/DEL repetitions per configuration")
	scale := fs.String("scale", "1,200", "comma-separated numbers of pods present for the at-scale runs (\"\" or \"0\" to skip)")
	quick := fs.Bool("quick", false, "quick run: n=10, scale 1,50 (explicit -n/-scale still win)")
	out := fs.String("out", "results", "directory for latency-<date>.md and .json")
	attachTC := fs.Bool("attach-tc", false, "also measure ebpf-cni with attachMode tc (clsact + cls_bpf instead of tcx links), without the at-scale runs")
	hpScale := fs.String("hostport-scale", "1,200,1000", "pods with hostPorts at which to measure ADD latency and connections/s through a hostPort, ebpf-cni beside ptp+portmap (\"\" to skip)")
	hpOnly := fs.Bool("hostport-only", false, "run only the hostPort benchmark")
	connSecs := fs.Float64("conn-seconds", 3, "seconds of connections per measurement of the hostPort benchmark")
	workers := fs.Int("conn-workers", 4, "parallel client connections of the hostPort benchmark")
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
		hpOnly: *hpOnly, connSecs: *connSecs, workers: *workers}
	if o.quick {
		if !set["n"] {
			o.n = 10
		}
		if !set["scale"] {
			*scale = "1,50"
		}
		if !set["hostport-scale"] {
			*hpScale = "1,100"
		}
		if !set["conn-seconds"] {
			o.connSecs = 2
		}
	}
	if o.connSecs <= 0 || o.workers < 1 {
		return nil, fmt.Errorf("-conn-seconds and -conn-workers must be positive")
	}
	var err error
	if o.hpScale, err = parseScale(*hpScale, "-hostport-scale"); err != nil {
		return nil, err
	}
	if o.hpOnly && len(o.hpScale) == 0 {
		return nil, fmt.Errorf("-hostport-only with an empty -hostport-scale measures nothing")
	}
	if o.n < 1 {
		return nil, fmt.Errorf("-n must be at least 1")
	}
	if o.scale, err = parseScale(*scale, "-scale"); err != nil {
		return nil, err
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
	if os.Getenv(innerEnv) == "" {
		os.Exit(benchkit.Outer("bench", innerEnv, cmdlineEnv))
	}
	os.Exit(inner(opts))
}

// inner runs the benchmark; every exit path goes through the cleanup.
func inner(opts *options) int {
	var b *bench
	return benchkit.Inner("bench", logf, func(ctx context.Context) error {
		var err error
		b, err = newBench(ctx, opts)
		if err != nil {
			return err
		}
		return b.run(ctx)
	}, func() {
		if b != nil {
			b.cleanup()
		}
	})
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...)
}
