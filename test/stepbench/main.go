// Command stepbench measures, on this kernel, what each kernel-side step of
// ebpf-cni's ADD and DEL costs, and what the alternatives of issue 17 (a pool
// of veth pairs prepared ahead with their tcx links, one attach point, DEL in
// the background, returning pairs to the pool, netns destruction) would cost
// instead. It drives netlink and cilium/ebpf directly, in a throwaway node
// network namespace, with a trivial tcx/cls_bpf program: the cost of an attach
// does not depend on the program (the verifier ran at load time).
//
//	go run ./test/stepbench                  # steps: 20 interleaved rounds of every scenario
//	go run ./test/stepbench -parts parallel  # 100 pods set up at once, per variant
//	go run ./test/stepbench -parts contention,state,memory
//	go run ./test/stepbench -parts population # 0 and 1000 pods present: IPv6 and /proc/sys/net costs
//
// Each part prints a table: median, p10, p90 in ms, and the 1-minute load
// average at the start and end of the part. Everything it creates (node and
// pod namespaces, bpffs pins under /sys/fs/bpf/stepbench-<rand>) is removed
// on exit, failure or SIGINT; it runs in a private mount namespace like
// test/bench.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

const (
	innerEnv   = "STEPBENCH_INNER"
	cmdlineEnv = "STEPBENCH_CMDLINE"
)

var allParts = []string{"steps", "parallel", "contention", "state", "population"}

type options struct {
	n          int
	parallel   int
	population int
	parts      map[string]bool
}

func main() {
	fs := flag.NewFlagSet("stepbench", flag.ContinueOnError)
	n := fs.Int("n", 20, "rounds of the steps part (every scenario once per round, order rotated)")
	par := fs.Int("parallel", 100, "pods set up at once in the parallel part")
	popPods := fs.Int("population", 1000, "pods present in the population part (beside a run with none)")
	parts := fs.String("parts", "steps", "comma-separated parts: "+strings.Join(allParts, ", "))
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	o := &options{n: *n, parallel: *par, population: *popPods, parts: map[string]bool{}}
	for _, p := range strings.Split(*parts, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !slices.Contains(allParts, p) {
			fmt.Fprintf(os.Stderr, "stepbench: unknown part %q (have %s)\n", p, strings.Join(allParts, ", "))
			os.Exit(2)
		}
		o.parts[p] = true
	}
	if o.n < 1 || o.parallel < 1 || o.population < 1 {
		fmt.Fprintln(os.Stderr, "stepbench: -n, -parallel and -population must be positive")
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "stepbench: must run as root")
		os.Exit(1)
	}
	if os.Getenv(innerEnv) == "" {
		os.Exit(testenv.Outer("stepbench", innerEnv, cmdlineEnv))
	}
	var e *env
	os.Exit(testenv.Inner("stepbench", logf, func(ctx context.Context) error {
		var err error
		if e, err = newEnv(); err != nil {
			return err
		}
		fmt.Printf("# stepbench: kernel %s, %s, load %s, command: %s\n", testenv.KernelRelease(), testenv.GoVersion(),
			testenv.Loadavg(), os.Getenv(cmdlineEnv))
		for _, p := range allParts {
			if !o.parts[p] {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			var err error
			switch p {
			case "steps":
				err = e.runSteps(ctx, o.n)
			case "parallel":
				err = e.runParallel(ctx, o.parallel)
			case "contention":
				err = e.runContention(ctx)
			case "state":
				err = e.runState()
			case "population":
				err = e.runPopulation(ctx, o.population, o.n)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
		return nil
	}, func() {
		if e != nil {
			e.cleanup()
		}
	}))
}

func logf(format string, a ...any) { fmt.Fprintf(os.Stderr, "stepbench: "+format+"\n", a...) }

// env is the node namespace, pin directory and program every part uses.
type env struct {
	root   string // temp dir: namespace mount points
	pinDir string
	node   ns.NetNS
	prog   *ebpf.Program // SchedCLS returning 0 (TCX_PASS / TC_ACT_OK)

	mu   sync.Mutex
	seq  int
	pods map[string]ns.NetNS
}

func newEnv() (*env, error) {
	id := testenv.RandHex(4)
	root, err := os.MkdirTemp("", "stepbench-"+id+"-")
	if err != nil {
		return nil, err
	}
	e := &env{root: root, pinDir: filepath.Join("/sys/fs/bpf", "stepbench-"+id), pods: map[string]ns.NetNS{}}
	if err := os.MkdirAll(e.pinDir, 0o700); err != nil {
		return e, err
	}
	if e.node, err = testenv.NewNetNS(filepath.Join(root, "node")); err != nil {
		return e, err
	}
	if err := testenv.SetupNode(e.node, "192.0.2.1/32"); err != nil {
		return e, err
	}
	e.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return e, fmt.Errorf("load test program: %w", err)
	}
	logf("node netns %s, pins %s", e.node.Path(), e.pinDir)
	return e, nil
}

// newPod creates a pod namespace (not timed).
func (e *env) newPod() (ns.NetNS, error) {
	e.mu.Lock()
	e.seq++
	path := filepath.Join(e.root, fmt.Sprintf("pod-%d", e.seq))
	e.mu.Unlock()
	p, err := testenv.NewNetNS(path)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.pods[path] = p
	e.mu.Unlock()
	return p, nil
}

func (e *env) removePod(p ns.NetNS) error {
	e.mu.Lock()
	delete(e.pods, p.Path())
	e.mu.Unlock()
	return testenv.RemoveNetNS(p)
}

// name returns a unique interface name with a prefix (at most 15 bytes).
func (e *env) name(prefix string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	return fmt.Sprintf("%s%d", prefix, e.seq)
}

func (e *env) cleanup() {
	var errs []error
	for _, p := range e.pods {
		errs = append(errs, testenv.RemoveNetNS(p))
	}
	if e.node != nil {
		// The node's veths, with their tcx links, go with it.
		errs = append(errs, testenv.RemoveNetNS(e.node))
	}
	if e.prog != nil {
		e.prog.Close()
	}
	errs = append(errs, os.RemoveAll(e.pinDir), os.RemoveAll(e.root))
	if err := errors.Join(errs...); err != nil {
		logf("cleanup incomplete: %v", err)
		return
	}
	logf("cleaned up: namespaces, %s, %s", e.pinDir, e.root)
}

// samples collects durations per step, in the order steps first appear.
type samples struct {
	order []string
	ms    map[string][]float64
}

func newSamples() *samples { return &samples{ms: map[string][]float64{}} }

func (s *samples) add(step string, d time.Duration) {
	if _, ok := s.ms[step]; !ok {
		s.order = append(s.order, step)
	}
	s.ms[step] = append(s.ms[step], float64(d.Microseconds())/1000)
}

// timed runs f and records its duration under step unless it fails.
func (s *samples) timed(step string, f func() error) error {
	t := time.Now()
	if err := f(); err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	s.add(step, time.Since(t))
	return nil
}

func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = append([]float64(nil), v...)
	sort.Float64s(v)
	i := int(p*float64(len(v)-1) + 0.5)
	return v[i]
}

// print writes the table of a part.
func (s *samples) print(title, loadBefore string) {
	fmt.Printf("\n## %s (load before %s, after %s)\n\n", title, loadBefore, testenv.Loadavg())
	fmt.Println("| step | n | median ms | p10 | p90 |")
	fmt.Println("|---|---|---|---|---|")
	for _, k := range s.order {
		v := s.ms[k]
		fmt.Printf("| %s | %d | %.2f | %.2f | %.2f |\n", k, len(v), testenv.Median(v), pct(v, 0.1), pct(v, 0.9))
	}
}
