package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Versions. Kubernetes and what it pins (etcd, ginkgo) come from
// test/k8s/tools/go.mod; the rest are named here.
const (
	corednsVersion  = "v1.12.1"
	pauseImage      = "registry.k8s.io/pause:3.10.1"
	agnhostImage    = "registry.k8s.io/e2e-test-images/agnhost:2.56"
	busyboxImage    = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
	dnsutilsImage   = "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7"
	corednsImage    = "registry.k8s.io/coredns/coredns:" + corednsVersion
	iptablesImage   = "registry.k8s.io/build-image/distroless-iptables:v0.7.14"
	regressionImage = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.2"
	// deploy/ebpf-cni.yaml names "ebpf-cni/ebpf-cni:dev"; the kubelet asks
	// containerd for its normalized form.
	ebpfCNIImage = "docker.io/ebpf-cni/ebpf-cni:dev"
)

// artifacts: paths of everything the cluster needs.
type artifacts struct {
	k8sVersion string
	k8sSrc     string            // k8s.io/kubernetes in the module cache (agnhost's porter certificate)
	bin        map[string]string // name -> path (kube-*, kubectl, kubelet, etcd, e2e.test, ginkgo, coredns, CNI plugins, ebpf-*)
	images     []string          // OCI archives to import into every node
	release    string            // -rollout: the full commit of the release rolled from
}

func (a *artifacts) path(name string) string {
	p, ok := a.bin[name]
	if !ok {
		panic("no artifact " + name) // a harness bug, not bad input
	}
	return p
}

var k8sBins = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"}

// Test images' programs built from k8s.io/kubernetes/test/images.
var k8sTestBins = []string{"agnhost", "regression-issue-74839"}

// buildAll builds or reuses every binary and image.
func buildAll(ctx context.Context, o options) (*artifacts, error) {
	a := &artifacts{bin: map[string]string{}}
	toolsDir := filepath.Join(o.repo, "test/k8s/tools")
	key, err := k8sKey(toolsDir, a)
	if err != nil {
		return nil, err
	}
	kdir := filepath.Join(o.cache, "k8s-"+key)
	if err := cached(ctx, kdir, "Kubernetes "+a.k8sVersion+" (first time: ~12 min on 2 cores)", func(tmp string) error {
		return buildKubernetes(ctx, toolsDir, tmp, a.k8sVersion)
	}); err != nil {
		return nil, err
	}
	list := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	list.Dir, list.Env = toolsDir, append(os.Environ(), "GOTOOLCHAIN=local")
	dir, err := list.Output()
	if err != nil {
		return nil, fmt.Errorf("locate k8s.io/kubernetes in the module cache: %w", err)
	}
	a.k8sSrc = strings.TrimSpace(string(dir))
	for _, b := range append(append([]string{}, k8sBins...), "etcd", "e2e.test", "ginkgo") {
		a.bin[b] = filepath.Join(kdir, b)
	}
	for _, b := range k8sTestBins {
		a.bin[b] = filepath.Join(kdir, b)
	}

	cdir := filepath.Join(o.cache, "coredns-"+corednsVersion)
	if err := cached(ctx, cdir, "CoreDNS "+corednsVersion, func(tmp string) error {
		return goCmd(ctx, "", []string{"GOBIN=" + tmp, "CGO_ENABLED=0", "GOFLAGS=-trimpath"},
			"install", "github.com/coredns/coredns@"+corednsVersion)
	}); err != nil {
		return nil, err
	}
	a.bin["coredns"] = filepath.Join(cdir, "coredns")

	// The reference plugins at the version the plugin's go.mod pins, and
	// this tree's ebpf-cni, agent and installer (rebuilt every run).
	pv, err := moduleVersion(o.repo, "github.com/containernetworking/plugins")
	if err != nil {
		return nil, err
	}
	pdir := filepath.Join(o.cache, "cni-plugins-"+pv)
	refPlugins := []string{"ptp", "portmap", "bandwidth", "host-local", "loopback"}
	if err := cached(ctx, pdir, "containernetworking/plugins "+pv, func(tmp string) error {
		return goCmd(ctx, o.repo, []string{"CGO_ENABLED=0"}, "build", "-trimpath", "-o", tmp+"/",
			"github.com/containernetworking/plugins/plugins/main/ptp",
			"github.com/containernetworking/plugins/plugins/meta/portmap",
			"github.com/containernetworking/plugins/plugins/meta/bandwidth",
			"github.com/containernetworking/plugins/plugins/ipam/host-local",
			"github.com/containernetworking/plugins/plugins/main/loopback")
	}); err != nil {
		return nil, err
	}
	for _, p := range refPlugins {
		a.bin[p] = filepath.Join(pdir, p)
	}
	own := filepath.Join(o.cache, "ebpf-cni-build")
	if err := os.MkdirAll(own, 0o755); err != nil {
		return nil, err
	}
	version := strings.TrimSpace(output(exec.Command("git", "-C", o.repo, "describe", "--always", "--dirty")))
	if err := goCmd(ctx, o.repo, []string{"CGO_ENABLED=0"}, "build", "-trimpath",
		"-ldflags", "-X main.Version="+version, "-o", own+"/",
		"./cmd/ebpf-cni", "./cmd/ebpf-agent", "./deploy/install-cni", "./test/e2e/images/pause"); err != nil {
		return nil, err
	}
	for _, b := range []string{"ebpf-cni", "ebpf-agent", "install-cni", "pause"} {
		a.bin[b] = filepath.Join(own, b)
	}

	if err := buildImages(ctx, o, a); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	if o.helm && o.cni == "ebpf-cni" {
		if err := buildHelm(ctx, o, a); err != nil {
			return nil, err
		}
	}
	if o.rollout != "" && o.cni == "ebpf-cni" {
		if err := buildRelease(ctx, o, a); err != nil {
			return nil, fmt.Errorf("release %s: %w", o.rollout, err)
		}
	}
	return a, nil
}

// k8sKey: the Kubernetes version test/k8s/tools pins (into a), and the
// cache key: the version and a hash of go.mod, go.sum and what is built
// from them, so a changed pin or a new binary rebuilds.
func k8sKey(toolsDir string, a *artifacts) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(toolsDir, "go.mod"))
	if err != nil {
		return "", err
	}
	gosum, err := os.ReadFile(filepath.Join(toolsDir, "go.sum"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?k8s\.io/kubernetes (v\S+)`).FindSubmatch(gomod)
	if m == nil {
		return "", fmt.Errorf("%s/go.mod: no `require k8s.io/kubernetes vX` line", toolsDir)
	}
	a.k8sVersion = string(m[1])
	sum := sha256.Sum256(append(append(gomod, gosum...), strings.Join(k8sTestBins, ",")...))
	return a.k8sVersion + "-" + hex.EncodeToString(sum[:4]), nil
}

// apiServerBins: etcd, kube-apiserver and kubectl, all the agent's
// Node-following tests need: from the full build when it is cached, else
// built alone (their compiled packages are then in the Go build cache for
// the full build).
func apiServerBins(ctx context.Context, o options) (*artifacts, error) {
	a := &artifacts{bin: map[string]string{}}
	toolsDir := filepath.Join(o.repo, "test/k8s/tools")
	key, err := k8sKey(toolsDir, a)
	if err != nil {
		return nil, err
	}
	bins := []string{"etcd", "kube-apiserver", "kubectl"}
	dir := filepath.Join(o.cache, "k8s-"+key)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = filepath.Join(o.cache, "apiserver-"+key)
		if err := cached(ctx, dir, "etcd, kube-apiserver, kubectl "+a.k8sVersion, func(tmp string) error {
			return buildKubernetesSubset(ctx, toolsDir, tmp, a.k8sVersion, []string{"kube-apiserver", "kubectl"}, true, false)
		}); err != nil {
			return nil, err
		}
	}
	for _, b := range bins {
		a.bin[b] = filepath.Join(dir, b)
	}
	return a, nil
}

// cached runs build into a temporary directory beside dir and renames it to
// dir when it succeeds; an existing dir is reused as it is.
func cached(ctx context.Context, dir, what string, build func(tmp string) error) error {
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		logf("cached: %s (%s)", what, dir)
		return nil
	}
	logf("building %s into %s", what, dir)
	t := time.Now()
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	if err := build(tmp); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := ctx.Err(); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	logf("built %s in %s", what, since(t))
	return os.Rename(tmp, dir)
}

// buildKubernetes builds the components with the version stamps the e2e
// framework reads, then e2e.test, agnhost, etcd and ginkgo, all from the
// wrapper module.
func buildKubernetes(ctx context.Context, toolsDir, out, version string) error {
	return buildKubernetesSubset(ctx, toolsDir, out, version, k8sBins, true, true)
}

// buildKubernetesSubset builds the commands named (of k8sBins), etcd when
// asked, and ginkgo, e2e.test and the test images' programs with e2e.
func buildKubernetesSubset(ctx context.Context, toolsDir, out, version string, cmds []string, etcd, e2e bool) error {
	major, minor, _ := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	ld := []string{"-s", "-w"}
	for _, p := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		ld = append(ld, "-X", p+".gitVersion="+version, "-X", p+".gitMajor="+major, "-X", p+".gitMinor="+minor,
			"-X", p+".gitTreeState=clean", "-X", p+".buildDate=1970-01-01T00:00:00Z")
	}
	ldflags := strings.Join(ld, " ")
	env := []string{"CGO_ENABLED=0"}
	var pkgs []string
	for _, b := range cmds {
		pkgs = append(pkgs, "k8s.io/kubernetes/cmd/"+b)
	}
	steps := [][]string{append([]string{"build", "-trimpath", "-ldflags", ldflags, "-o", out + "/"}, pkgs...)}
	if etcd {
		steps = append(steps, []string{"build", "-trimpath", "-o", out + "/etcd", "go.etcd.io/etcd/server/v3"})
	}
	if e2e {
		steps = append(steps,
			[]string{"build", "-trimpath", "-o", out + "/ginkgo", "github.com/onsi/ginkgo/v2/ginkgo"},
			[]string{"test", "-c", "-trimpath", "-ldflags", ldflags, "-o", out + "/e2e.test", "k8s.io/kubernetes/test/e2e"})
		for _, b := range k8sTestBins {
			steps = append(steps, []string{"build", "-trimpath", "-o", out + "/" + b, "k8s.io/kubernetes/test/images/" + b})
		}
	}
	for _, s := range steps {
		if err := goCmd(ctx, toolsDir, env, s...); err != nil {
			return err
		}
	}
	return nil
}

// goCmd runs the go command niced (the machine is shared), with the local
// toolchain and the module proxy only.
func goCmd(ctx context.Context, dir string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, "nice", append([]string{"-n", "10", "go"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "GOTOOLCHAIN=local", "GOFLAGS=-buildvcs=false"), env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, tail(buf.String(), 30))
	}
	return nil
}

// moduleVersion: the version of mod that the repository's go.mod requires.
func moduleVersion(repo, mod string) (string, error) {
	b, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(mod) + `\s+(v\S+)`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("go.mod does not require %s", mod)
	}
	return string(m[1]), nil
}

func output(cmd *exec.Cmd) string {
	b, _ := cmd.Output()
	return string(b)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
