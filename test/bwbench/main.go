// Command bwbench measures how accurately pod bandwidth limits hold, side by
// side for ebpf-cni (the bandwidth capability, enforced by its tc programs and
// TCP pacing) and the reference chain ptp + bandwidth (TBF, with an ifb for
// the pod's egress) from containernetworking/plugins, in the same run.
//
// Run from the repository root, as root:
//
//	go run ./test/bwbench                # 10, 100, 1000 Mbit/s, 10 s per run (about 5 minutes)
//	go run ./test/bwbench -quick         # 10 and 100 Mbit/s, 5 s per run
//	go run ./test/bwbench -out /tmp/res  # results directory (default: results)
//
// Both configurations are driven through cnitool, as a runtime drives them,
// with the bandwidth capability in CAP_ARGS and the burst containerd sends
// (4294967295 bits) in both directions. Per configuration there is a node
// network namespace (lo up, 192.0.2.1/32 on lo), an unlimited "peer" pod and,
// per rate, a freshly added limited pod. For each rate and direction one TCP
// stream (iperf3 -J -i 1) runs while ping measures latency under load; the
// figures reported are the receiver's (the iperf3 server's own -J output).
//
// The process re-executes itself in a private mount namespace where a temp
// directory is bind-mounted over /var/lib/cni (cnitool cannot move libcni's
// result cache); network namespaces are bind-mounted under the temp
// directory. The only host-visible objects are the temp directory and the
// bpffs pin directory /sys/fs/bpf/ebpfbwbench-<rand>; both are removed on
// exit, on failure and on SIGINT/SIGTERM, and every iperf3 and ping process
// is killed. /etc/cni, /opt/cni, /var/lib/cni and the host's iptables are
// never touched.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/internal/benchkit"
)

// innerEnv marks the re-executed process running in the private mount namespace.
const (
	innerEnv   = "EBPFBWBENCH_INNER"
	cmdlineEnv = "EBPFBWBENCH_CMDLINE"
)

type options struct {
	quick    bool
	outDir   string
	ratesMb  []uint64 // Mbit/s
	duration time.Duration
	// idlePings is the number of pings of the idle reference, loadPings the
	// most pings sent under load (fewer when the run is short).
	idlePings, loadPings int
}

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("bwbench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "quick run: rates 10,100 Mbit/s, 5 s each (explicit -rates/-t still win)")
	out := fs.String("out", "results", "directory for bandwidth-<date>.md and .json")
	rates := fs.String("rates", "10,100,1000", "comma-separated rates in Mbit/s")
	secs := fs.Int("t", 10, "seconds per iperf3 run")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./test/bwbench [flags]   (as root, from the repository root)\n")
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
	if *quick {
		if !set["rates"] {
			*rates = "10,100"
		}
		if !set["t"] {
			*secs = 5
		}
	}
	if *secs < 3 || *secs > 120 {
		return nil, fmt.Errorf("-t: %d is not between 3 and 120 seconds", *secs)
	}
	o := &options{quick: *quick, outDir: *out, duration: time.Duration(*secs) * time.Second, idlePings: 20, loadPings: 40}
	if *quick {
		o.idlePings = 10
	}
	seen := map[uint64]bool{}
	for _, f := range strings.Split(*rates, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		r, err := strconv.ParseUint(f, 10, 64)
		if err != nil || r < 1 || r > 10000 {
			return nil, fmt.Errorf("-rates: %q is not a rate in Mbit/s (1-10000)", f)
		}
		if !seen[r] {
			seen[r] = true
			o.ratesMb = append(o.ratesMb, r)
		}
	}
	if len(o.ratesMb) == 0 {
		return nil, errors.New("-rates: no rate given")
	}
	return o, nil
}

func main() {
	opts, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bwbench:", err)
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bwbench: must run as root (network namespaces, BPF, mounts)")
		os.Exit(1)
	}
	if os.Getenv(innerEnv) == "" {
		os.Exit(outer())
	}
	os.Exit(inner(opts))
}

// outer checks the tools and re-executes this program in a private mount
// namespace (benchkit.Outer).
func outer() int {
	for _, tool := range []string{"iperf3", "ping", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Fprintf(os.Stderr, "bwbench: %s not found (apt-get install iperf3 iputils-ping)\n", tool)
			return 1
		}
	}
	return benchkit.Outer("bwbench", innerEnv, cmdlineEnv)
}

// inner runs the benchmark; every exit path goes through the cleanup.
func inner(opts *options) int {
	var b *bench
	return benchkit.Inner("bwbench", logf, func(ctx context.Context) error {
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
	fmt.Fprintf(os.Stderr, "bwbench: "+format+"\n", a...)
}
