// Command k8s runs the upstream Kubernetes sig-network e2e suite against a
// real 2-node cluster on this machine, with the CNI under test
// (make k8s-e2e, make k8s-e2e CNI=reference):
//
//	go run ./test/k8s [-cni ebpf-cni|reference] [-focus RE] [-skip RE] [-quick|-netpol] [-subnets]
//
// Everything comes from the Go module proxy and Debian's apt: Kubernetes
// v1.34 (test/k8s/tools pins it), etcd, CoreDNS, e2e.test, agnhost and
// ginkgo are built into a cache (-cache, $EBPF_CNI_K8S_CACHE, default
// /var/cache/ebpf-cni-k8s; kept between runs, keyed by version), images are
// written as OCI archives (test/internal/ociimage, Debian packages unpacked
// for the shell tools the tests exec) and imported into each node's
// containerd. Nothing is pulled.
//
// The cluster: a control-plane network namespace (etcd, kube-apiserver,
// kube-controller-manager with --allocate-node-cidrs, kube-scheduler, and
// e2e.test) holding a bridge, and two node namespaces on it, each with its
// own mount namespace (overlays on /etc, /opt, /run, /var/lib, /var/log and
// a private bpffs, so the node's /etc/cni, /opt/cni/bin, /var/lib/cni and
// pins are its own) running containerd, kubelet and kube-proxy (iptables).
// With -subnets, each node has its own subnet (a bridge each) and a router
// namespace joins them; the agent tunnels (subnets.go).
// None of these namespaces has a link to the host's network namespace, a
// default route or an upstream resolver: nothing can leave the machine, and
// that is checked before the suite starts.
//
// Results go to -out (default results/k8s-e2e-<cni>-<time>): summary.md (a
// per-spec table), results.json, junit.xml, the e2e log and the daemons'
// logs. The machine is snapshotted before the cluster starts (network
// namespaces, host links, mounts, processes, cgroups, bpffs pins, sysctls,
// the host's iptables and nftables rulesets); teardown kills everything the
// run started, restores the sysctls kubelet changed, and compares. An
// interrupt (SIGINT, SIGTERM) tears down the same way. The last line is
// "k8s-e2e: N passed, M failed[, K skipped]".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// The suite's defaults. Skipped beyond the usual
// Slow|Serial|Disruptive|Flaky|Feature|LoadBalancer|cloud (each needs
// something a 2-node offline cluster does not have):
var skipReasons = []struct{ re, why string }{
	{`\[Slow\]`, "slow specs (upstream's own fast lane skips them)"},
	{`\[Serial\]`, "specs that must run alone"},
	{`\[Disruptive\]`, "specs that break nodes or the control plane"},
	{`\[Flaky\]`, "known flaky upstream"},
	{`\[Feature:`, "optional features a default cluster does not enable"},
	{`LoadBalancer`, "no load-balancer implementation"},
	{`[Cc]loud|\[Provider:`, "no cloud provider"},
}

// netpolFocus is upstream's NetworkPolicy suite (test/e2e/network/netpol);
// netpolSkip leaves out only its SCTP specs: the nodes share the host's
// kernel, and where it has no SCTP (socket(IPPROTO_SCTP) fails with
// EPROTONOSUPPORT, no sctp module: this machine's 6.18 build) no pod can
// open an SCTP socket, whatever the CNI.
const (
	netpolFocus = `\[Feature:NetworkPolicy\]`
	netpolSkip  = `SCTP`
)

const quickFocus = `\[sig-network\] (HostPort|Networking Granular Checks: (Pods|Services)|Services should (serve a basic endpoint|serve multiport|be able to create a functioning NodePort|have session affinity work for service with type clusterIP|create endpoints for unready pods|be able to switch session affinity for service with type clusterIP)|DNS should (provide DNS for the cluster|provide DNS for services|resolve DNS of partial qualified names))`

// dualStackSkip is defaultSkip but for the dual-stack feature's specs
// (RE2 has no lookahead: every [Feature: tag but [Feature:IPv6DualStack]).
func dualStackSkip() string {
	var res []string
	for _, s := range skipReasons {
		if s.re == `\[Feature:` {
			res = append(res, `\[Feature:([^I]|I[^P]|IP[^v]|IPv[^6]|IPv6[^D])`)
			continue
		}
		res = append(res, s.re)
	}
	return strings.Join(res, "|")
}

func defaultSkip() string {
	var res []string
	for _, s := range skipReasons {
		res = append(res, s.re)
	}
	return strings.Join(res, "|")
}

type options struct {
	cni       string
	focus     string
	skip      string
	cache     string
	out       string
	procs     int
	timeout   time.Duration
	keep      bool
	buildOnly bool
	dualStack bool
	repo      string
	// connectivity runs `ebpf-agent connectivity` on the cluster before the
	// suite (its table in connectivity.txt); noE2E skips the suite.
	connectivity bool
	connPolicy   bool
	noE2E        bool
	// uninstall deletes the DaemonSet with the cleanup mode on after the
	// suite and checks both nodes are left as found (issue 31).
	uninstall bool
	// rollout: the release (commit) the DaemonSet starts from; the cluster
	// is then rolled to this tree and back under traffic (rollout.go).
	rollout string
	// helm installs deploy/helm/ebpf-cni with helm instead of applying
	// deploy/ebpf-cni.yaml.
	helm bool
	// subnets puts each node on its own subnet behind a router namespace
	// (subnets.go); tunnel is the agent's tunnel mode (vxlan, geneve, or
	// hybrid: vxlan with host-gw within a subnet), vxlan by default with
	// subnets.
	subnets bool
	tunnel  string
}

func main() {
	o := options{}
	flag.StringVar(&o.cni, "cni", "ebpf-cni", "CNI under test: ebpf-cni (deploy/ applied with kubectl) or reference (ptp + portmap + bandwidth)")
	flag.StringVar(&o.focus, "focus", `\[sig-network\]`, "ginkgo focus regexp")
	flag.StringVar(&o.skip, "skip", defaultSkip(), "ginkgo skip regexp")
	quick := flag.Bool("quick", false, "focus on HostPort, Networking Granular Checks (Pods, Services), a few Services and DNS specs")
	netpol := flag.Bool("netpol", false, "upstream's NetworkPolicy specs ([Feature:NetworkPolicy]), skipping only SCTP (-focus and -skip still narrow it)")
	flag.StringVar(&o.cache, "cache", envOr("EBPF_CNI_K8S_CACHE", "/var/cache/ebpf-cni-k8s"), "build cache (binaries, Debian packages, images)")
	flag.StringVar(&o.out, "out", "", "results directory (default results/k8s-e2e-<cni>-<time>)")
	flag.IntVar(&o.procs, "procs", 4, "parallel ginkgo processes")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Hour, "suite timeout")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (configs, certificates) after teardown")
	flag.BoolVar(&o.buildOnly, "build-only", false, "build binaries and images into the cache, then stop")
	flag.BoolVar(&o.dualStack, "dual-stack", false, "IPv4 and IPv6 pod, Service and node addresses (and the [Feature:IPv6DualStack] specs, unless -skip is given)")
	flag.BoolVar(&o.connectivity, "connectivity", false, "run `ebpf-agent connectivity` against the cluster before the suite (fails the run when a path fails)")
	flag.BoolVar(&o.connPolicy, "connectivity-policy", false, "with -connectivity: also check NetworkPolicy deny and allow")
	flag.BoolVar(&o.uninstall, "uninstall", false, "after the suite: delete the DaemonSet with uninstall-on-stop=force and check both nodes have nothing of ebpf-cni left")
	flag.StringVar(&o.rollout, "rollout", "", "start the DaemonSet at this commit's release and roll it to this tree, back, and forward with an agent killed, under traffic on every path (rollout.md; with -cni reference: the same traffic, steady, as the baseline)")
	flag.BoolVar(&o.helm, "helm", false, "install ebpf-cni with helm install of deploy/helm/ebpf-cni (a helm built from test/helm/tools) instead of kubectl apply -f deploy/ebpf-cni.yaml")
	flag.BoolVar(&o.subnets, "subnets", false, "each node on its own subnet behind a router namespace that has no route to any pod CIDR (ebpf-cni only; the agent tunnels, -tunnel)")
	flag.StringVar(&o.tunnel, "tunnel", "", "the agent's tunnel mode: vxlan, geneve or hybrid (vxlan, host-gw within a subnet); default off, vxlan with -subnets")
	flag.BoolVar(&o.noE2E, "no-e2e", false, "bring the cluster up (and run -connectivity), skip the e2e suite")
	cmp := flag.String("compare", "", "comma-separated results.json files: print one markdown table of them and exit")
	flag.Parse()
	if *cmp != "" {
		if err := compareResults(os.Stdout, strings.Split(*cmp, ",")); err != nil {
			fmt.Fprintln(os.Stderr, "k8s-e2e:", err)
			os.Exit(1)
		}
		return
	}
	if *quick {
		o.focus = quickFocus
	}
	skipSet, focusSet := false, false
	flag.Visit(func(f *flag.Flag) {
		skipSet = skipSet || f.Name == "skip"
		focusSet = focusSet || f.Name == "focus"
	})
	if *netpol {
		if *quick {
			fatalf("-netpol and -quick: use one")
		}
		if !focusSet {
			o.focus = netpolFocus
		} else {
			o.focus = netpolFocus + ".*(" + o.focus + ")|(" + o.focus + ").*" + netpolFocus
		}
		if !skipSet {
			o.skip = netpolSkip
		}
	}
	if o.dualStack && !skipSet {
		o.skip = dualStackSkip()
	}
	if o.cni != "ebpf-cni" && o.cni != "reference" {
		fatalf("-cni %q: want ebpf-cni or reference", o.cni)
	}
	if o.subnets && o.tunnel == "" {
		o.tunnel = "vxlan"
	}
	switch o.tunnel {
	case "", "vxlan", "geneve", "hybrid":
	default:
		fatalf("-tunnel %q: want vxlan, geneve or hybrid", o.tunnel)
	}
	if o.tunnel != "" && o.cni != "ebpf-cni" {
		fatalf("-subnets and -tunnel need -cni ebpf-cni (the reference plugins route host-gw only)")
	}
	if o.tunnel != "" && o.rollout != "" {
		fatalf("-rollout starts from a release's manifest: it does not combine with -subnets or -tunnel")
	}
	if os.Geteuid() != 0 {
		fatalf("run as root (network namespaces, containerd, kubelet)")
	}
	wd, _ := os.Getwd()
	o.repo = findRepo(wd)
	if o.out == "" {
		o.out = filepath.Join(o.repo, "results", fmt.Sprintf("k8s-e2e-%s-%s", o.cni, time.Now().Format("20060102-150405")))
	}
	os.Exit(run(o))
}

func run(o options) int {
	start := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()

	logf("cache %s, %d CPUs, %s", o.cache, runtime.NumCPU(), runtime.Version())
	if err := preflight(ctx); err != nil {
		return finish(start, nil, fmt.Errorf("preflight: %w", err))
	}
	t := time.Now()
	arts, err := buildAll(ctx, o)
	if err != nil {
		return finish(start, nil, fmt.Errorf("build: %w", err))
	}
	logf("build and images: %s", since(t))
	if o.buildOnly {
		fmt.Println("k8s-e2e: build only, 0 passed, 0 failed")
		return 0
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return finish(start, nil, err)
	}

	c := newCluster(o, arts)
	before, err := snapshot(c)
	if err != nil {
		return finish(start, nil, fmt.Errorf("snapshot the machine: %w", err))
	}
	var res *results
	runErr := func() error {
		t := time.Now()
		if err := c.up(ctx); err != nil {
			return fmt.Errorf("cluster up: %w", err)
		}
		logf("cluster up with %s: %s", o.cni, since(t))
		if err := c.checkOffline(); err != nil {
			return fmt.Errorf("offline check: %w", err)
		}
		if o.connectivity {
			t = time.Now()
			if err := c.runConnectivity(ctx); err != nil {
				return err
			}
			logf("connectivity: %s", since(t))
		}
		if o.rollout != "" {
			t = time.Now()
			if err := c.runRollout(ctx); err != nil {
				return err
			}
			logf("rollout: %s", since(t))
		}
		if o.noE2E {
			return nil
		}
		t = time.Now()
		var err error
		res, err = c.runE2E(ctx)
		logf("e2e: %s", since(t))
		return err
	}()
	if runErr != nil {
		logf("error: %v", runErr)
	}
	c.collectLogs()
	c.cgProgsOurs = c.ourCgroupProgs()
	if c.o.cni == "ebpf-cni" && len(c.cgProgsOurs) == 0 && runErr == nil {
		runErr = fmt.Errorf("no socket hook pinned in the nodes' bpffs: the leak check of the cgroup2 root would prove nothing")
	}
	if o.uninstall && runErr == nil {
		t := time.Now()
		if err := c.uninstallCNI(ctx, c.cgProgsOurs); err != nil {
			runErr = fmt.Errorf("uninstall: %w", err)
		}
		logf("uninstall: %s", since(t))
	}
	t = time.Now()
	c.down()
	leaks := compare(before, c)
	logf("teardown: %s", since(t))
	if len(leaks) > 0 {
		logf("LEAKED after teardown:")
		for _, l := range leaks {
			logf("  %s", l)
		}
		if runErr == nil {
			runErr = fmt.Errorf("%d leftovers after teardown", len(leaks))
		}
	} else {
		logf("teardown left nothing behind (namespaces, links, mounts, processes, cgroups, pins, sysctls, rulesets)")
	}
	if res != nil {
		res.leaks = leaks
		if err := res.write(o, c, time.Since(start)); err != nil {
			logf("write results: %v", err)
		}
	}
	return finish(start, res, runErr)
}

func finish(start time.Time, res *results, err error) int {
	rc := 0
	if err != nil {
		logf("FAILED: %v", err)
		rc = 1
	}
	p, f, s := 0, 0, 0
	if res != nil {
		p, f, s = res.counts()
		if f > 0 {
			rc = 1
		}
	}
	if err != nil && res == nil {
		f = 1
	}
	logf("total %s", since(start))
	line := fmt.Sprintf("k8s-e2e: %d passed, %d failed", p, f)
	if s > 0 {
		line += fmt.Sprintf(", %d skipped", s)
	}
	fmt.Println(line)
	return rc
}

func findRepo(dir string) string {
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/ebpf-cni/ebpf-cni\n") {
			return d
		}
	}
	fatalf("run from inside the ebpf-cni repository")
	return ""
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func since(t time.Time) string { return time.Since(t).Round(time.Second).String() }

var t0 = time.Now()

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%6s] %s\n", time.Since(t0).Round(time.Second), fmt.Sprintf(format, args...))
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "k8s-e2e: "+format+"\n", args...)
	fmt.Println("k8s-e2e: 0 passed, 1 failed")
	os.Exit(1)
}
