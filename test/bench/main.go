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
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
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
		os.Exit(outer())
	}
	os.Exit(inner(opts))
}

// outer mounts bpffs if needed and re-executes this program in a private mount
// namespace, relaying signals and the exit code.
func outer() int {
	if err := datapath.EnsureBPFFS(datapath.BPFFSRoot); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: find own executable:", err)
		return 1
	}
	// Pdeathsig is delivered when the forking thread dies: keep it alive.
	runtime.LockOSThread()
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), innerEnv+"=1", cmdlineEnv+"="+commandLine())
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Go makes the new mount namespace's mounts private (MS_REC|MS_PRIVATE on /).
		Unshareflags: syscall.CLONE_NEWNS,
		Pdeathsig:    syscall.SIGTERM,
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "bench: start in a private mount namespace:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			// A terminal's SIGINT reaches the child too; the child treats
			// repeats as one. Others (kill PID) only reach us: pass them on.
			_ = cmd.Process.Signal(s)
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return 128 + int(ws.Signal())
				}
				return ee.ExitCode()
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "bench:", err)
				return 1
			}
			return 0
		}
	}
}

// commandLine is the command the user typed: the go command's when this
// runs under `go run`, else our own argv.
func commandLine() string {
	args := os.Args
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", os.Getppid())); err == nil {
		pa := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(pa) >= 2 && filepath.Base(pa[0]) == "go" && pa[1] == "run" {
			args = pa
		}
	}
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'$\\") {
			a = strconv.Quote(a)
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

// inner runs the benchmark; every exit path goes through the cleanup.
func inner(opts *options) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	var got os.Signal
	sigSeen := make(chan struct{})
	go func() {
		s := <-sigs
		got = s
		logf("received %v: stopping and cleaning up", s)
		close(sigSeen)
		cancel()
		for range sigs { // repeats: cleanup is already under way
		}
	}()

	b, err := newBench(ctx, opts)
	if err == nil {
		err = b.run(ctx)
	}
	if b != nil {
		b.cleanup()
	}
	select {
	case <-sigSeen:
		if s, ok := got.(syscall.Signal); ok {
			return 128 + int(s)
		}
		return 130
	default:
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: FAILED:", err)
		return 1
	}
	return 0
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...)
}
