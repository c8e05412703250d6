// Package bandwidth is the bandwidth part of the benchmark command
// (go run ./test/bench -parts bandwidth): how accurately pod bandwidth limits hold, side by
// side for ebpf-cni (the bandwidth capability, enforced by its tc programs and
// TCP pacing) and the reference chain ptp + bandwidth (TBF, with an ifb for
// the pod's egress) from containernetworking/plugins, in the same run.
//
// Run from the repository root, as root:
//
//	go run ./test/bench -parts bandwidth          # 10, 100, 1000 Mbit/s, 10 s per run (about 5 minutes)
//	go run ./test/bench -parts bandwidth -quick   # 10 and 100 Mbit/s, 5 s per run
//
// Both configurations are driven through cnitool, as a runtime drives them,
// with the bandwidth capability in CAP_ARGS and the burst containerd sends
// (4294967295 bits) in both directions. Per configuration there is a node
// network namespace (lo up, 192.0.2.1/32 on lo), an unlimited "peer" pod and,
// per rate, a freshly added limited pod. For each rate and direction one TCP
// stream (iperf3 -J -i 1) runs while ping measures latency under load; the
// figures reported are the receiver's (the iperf3 server's own -J output).
//
// The command runs it in the private mount namespace it re-executed itself
// in, with a temp directory bind-mounted over /var/lib/cni (cnitool cannot
// move libcni's result cache); network namespaces are bind-mounted under the
// temp directory. The only host-visible objects are the temp directory and the
// bpffs pin directory /sys/fs/bpf/ebpfbwbench-<rand>; both are removed on
// exit, on failure and on SIGINT/SIGTERM, and every iperf3 and ping process
// is killed. /etc/cni, /opt/cni, /var/lib/cni and the host's iptables are
// never touched.
package bandwidth

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// Options configure the bandwidth part.
type Options struct {
	quick    bool
	outDir   string
	ratesMb  []uint64 // Mbit/s
	duration time.Duration
	// idlePings is the number of pings of the idle reference, loadPings the
	// most pings sent under load (fewer when the run is short).
	idlePings, loadPings int
}

// NewOptions configures the part: rates in Mbit/s (comma-separated, ""
// for the default), seconds per iperf3 run (0 for the default); quick uses
// 10 and 100 Mbit/s, 5 s each, where they are not given.
func NewOptions(quick bool, outDir, rates string, secs int) (*Options, error) {
	if rates == "" {
		rates = "10,100,1000"
		if quick {
			rates = "10,100"
		}
	}
	if secs == 0 {
		secs = 10
		if quick {
			secs = 5
		}
	}
	if secs < 3 || secs > 120 {
		return nil, fmt.Errorf("-bw-seconds: %d is not between 3 and 120 seconds", secs)
	}
	o := &Options{quick: quick, outDir: outDir, duration: time.Duration(secs) * time.Second, idlePings: 20, loadPings: 40}
	if quick {
		o.idlePings = 10
	}
	seen := map[uint64]bool{}
	for _, f := range strings.Split(rates, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		r, err := strconv.ParseUint(f, 10, 64)
		if err != nil || r < 1 || r > 10000 {
			return nil, fmt.Errorf("-bw-rates: %q is not a rate in Mbit/s (1-10000)", f)
		}
		if !seen[r] {
			seen[r] = true
			o.ratesMb = append(o.ratesMb, r)
		}
	}
	if len(o.ratesMb) == 0 {
		return nil, errors.New("-bw-rates: no rate given")
	}
	return o, nil
}

// Bench is one run of the part.
type Bench = bench

// New prepares a run (in the private mount namespace the bench command
// re-executed itself in); on error the returned Bench, if any, holds what
// was made so far, for Cleanup.
func New(ctx context.Context, o *Options) (*Bench, error) {
	for _, tool := range []string{"iperf3", "ping"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found (apt-get install iperf3 iputils-ping)", tool)
		}
	}
	return newBench(ctx, o)
}

// Run measures and writes bandwidth-<date>.md and .json.
func (b *bench) Run(ctx context.Context) error { return b.run(ctx) }

// Rows is the summary table of the run, for the command's combined report.
func (b *bench) Rows() []testenv.Row { return b.res.Rows }

// Cleanup removes everything the run created; safe on a partial setup.
func (b *bench) Cleanup() { b.cleanup() }

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench: bandwidth: "+format+"\n", a...)
}
