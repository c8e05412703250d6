package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The cluster's addresses. Nothing outside the run's own namespaces ever
// sees them: the namespaces have no link to the host's.
const (
	fabricPrefix = "10.255.0" // the bridge in the control-plane namespace: .1, nodes .11, .12
	// -subnets: node i is on 10.255.(i-1).0/24 (bridge br<i-1>), the
	// control plane .1 on each, the router .254 on each (subnets.go).
	fabricNet    = "10.255"
	clusterCIDR  = "10.244.0.0/16"
	serviceCIDR  = "10.96.0.0/16"
	apiServiceIP = "10.96.0.1"
	dnsServiceIP = "10.96.0.10"
	numNodes     = 2

	// Dual-stack mode (-dual-stack) adds an IPv6 family to each.
	fabricPrefix6 = "fd00:255::"  // bridge ::1, nodes ::11, ::12
	fabricNet6    = "fd00:255:0:" // -subnets: fd00:255:0:<i-1>::/64
	clusterCIDR6  = "fd00:10:244::/56"
	serviceCIDR6  = "fd00:10:96::/112"
)

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

type node struct {
	name     string
	ip       string
	ip6      string // dual-stack mode only
	subnet   int    // index of its subnet (bridge br<subnet>): 0 but with -subnets
	dir      string
	holder   *proc    // sleeps in the node's network and mount namespaces
	podCIDRs []string // as the controller manager allocated them
}

// ips: the node's addresses, IPv4 first.
func (n *node) ips() []string {
	if n.ip6 == "" {
		return []string{n.ip}
	}
	return []string{n.ip, n.ip6}
}

// via: the node's address of a CIDR's family.
func (n *node) via(cidr string) string {
	if strings.Contains(cidr, ":") {
		return n.ip6
	}
	return n.ip
}

func (c *cluster) clusterCIDRs() string {
	if c.o.dualStack {
		return clusterCIDR + "," + clusterCIDR6
	}
	return clusterCIDR
}

func (c *cluster) serviceCIDRs() string {
	if c.o.dualStack {
		return serviceCIDR + "," + serviceCIDR6
	}
	return serviceCIDR
}

type cluster struct {
	o         options
	a         *artifacts
	id        string
	work      string // configs, certificates, state (removed at teardown)
	logs      string // daemon logs (kept in the results)
	cgName    string // cgroup directory name, in every hierarchy
	cp        *proc  // holder of the control-plane network namespace
	router    *proc  // -subnets: holder of the router's network namespace
	cpIP      string
	nodes     []*node
	procs     []*proc
	pki       *pki
	sysctls   map[string]string // machine-wide values kubelet may change, as found
	netnsIDs  map[string]uint64 // the run's namespaces: inode id -> netns cookie (leak check)
	admin     string            // admin kubeconfig
	apiserver *proc

	cgProgsOurs map[uint32]bool // programs of the cgroup links the nodes pinned
}

func newCluster(o options, a *artifacts) *cluster {
	b := make([]byte, 3)
	rand.Read(b)
	id := hex.EncodeToString(b)
	c := &cluster{o: o, a: a, id: id, work: "/tmp/k8se-" + id, logs: filepath.Join(o.out, "logs"),
		cgName: "k8se-" + id, cpIP: fabricPrefix + ".1"}
	for i := 1; i <= numNodes; i++ {
		n := &node{name: fmt.Sprintf("node%d", i)}
		if o.subnets {
			n.subnet = i - 1
		}
		n.ip = fmt.Sprintf("%s.%d", subnetPrefix(n.subnet), 10+i)
		if o.dualStack {
			n.ip6 = fmt.Sprintf("%s%d", subnetPrefix6(n.subnet), 10+i)
		}
		n.dir = filepath.Join(c.work, n.name)
		c.nodes = append(c.nodes, n)
	}
	return c
}

// ---------------------------------------------------------------- processes

// cgroupMounts: the mount points of every cgroup hierarchy (v1 controllers
// and the cgroup2 one).
func cgroupMounts() []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		for i, x := range f {
			if x == "-" && i+1 < len(f) && (f[i+1] == "cgroup" || f[i+1] == "cgroup2") {
				out = append(out, f[4])
			}
		}
	}
	return out
}

// cgroupDirs creates k8se-<id>/sub in every hierarchy (cpuset inherits its
// parent's CPUs and memory nodes, or no task could join it).
func (c *cluster) cgroupDirs(sub string) ([]string, error) {
	var dirs []string
	for _, m := range cgroupMounts() {
		parent := m
		for _, part := range []string{c.cgName, sub} {
			d := filepath.Join(parent, part)
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return nil, fmt.Errorf("create cgroup %s: %w", d, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if b, err := os.ReadFile(filepath.Join(parent, f)); err == nil {
					if cur, _ := os.ReadFile(filepath.Join(d, f)); len(bytes.TrimSpace(cur)) == 0 {
						os.WriteFile(filepath.Join(d, f), b, 0o644)
					}
				}
			}
			parent = d
		}
		dirs = append(dirs, parent)
	}
	return dirs, nil
}

// start runs args inside the namespaces of holder (network; mount and UTS
// too when mnt), in the cgroup k8se-<id>/<cg>, logging to logs/<name>.log. A nil
// holder runs it in the host's namespaces (only the holders themselves).
func (c *cluster) start(name string, holder *proc, mnt bool, cg string, args ...string) (*proc, error) {
	dirs, err := c.cgroupDirs(cg)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.logs, 0o755); err != nil {
		return nil, err
	}
	lf, err := os.OpenFile(filepath.Join(c.logs, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	full := []string{"/bin/sh", "-c", `for d in $K8SE_CGROUPS; do echo $$ > "$d/cgroup.procs" || exit 111; done; exec "$@"`, "sh"}
	if holder != nil {
		ns := []string{"nsenter", "-t", strconv.Itoa(holder.cmd.Process.Pid), "-n"}
		if mnt {
			ns = append(ns, "-m", "-u")
		}
		full = append(full, append(ns, "--")...)
	}
	full = append(full, args...)
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Env = append(os.Environ(), "K8SE_CGROUPS="+strings.Join(dirs, " "))
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Dir = c.work
	// Its own process group; and SIGKILL should the harness itself die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// sh runs a command and returns its combined output.
func sh(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// in runs a command in holder's network namespace (and mount namespace).
func in(holder *proc, mnt bool, args ...string) (string, error) {
	ns := []string{"nsenter", "-t", strconv.Itoa(holder.cmd.Process.Pid), "-n"}
	if mnt {
		ns = append(ns, "-m", "-u")
	}
	return sh(append(append(ns, "--"), args...)...)
}

func (c *cluster) kubectl(args ...string) (string, error) {
	return in(c.cp, false, append([]string{c.a.path("kubectl"), "--kubeconfig", c.admin}, args...)...)
}

// waitFor polls f every second until it succeeds, the timeout passes or
// the context ends; it fails early when one of the run's daemons died.
func (c *cluster) waitFor(ctx context.Context, what string, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = f(); last == nil {
			return nil
		}
		for _, p := range c.procs {
			if p.exited() {
				return fmt.Errorf("%s: %s exited (%v); see %s", what, p.name, p.err, filepath.Join(c.logs, p.name+".log"))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %s: %v", what, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// ---------------------------------------------------------------- bring-up

func (c *cluster) up(ctx context.Context) error {
	if err := os.MkdirAll(c.work, 0o700); err != nil {
		return err
	}
	c.recordSysctls()
	if err := c.network(); err != nil {
		return fmt.Errorf("namespaces and links: %w", err)
	}
	if err := c.controlPlane(ctx); err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	for _, n := range c.nodes {
		if err := c.startNode(ctx, n); err != nil {
			return fmt.Errorf("%s: %w", n.name, err)
		}
	}
	if err := c.podCIDRRoutes(ctx); err != nil {
		return err
	}
	if err := c.installCNI(ctx); err != nil {
		return fmt.Errorf("CNI %s: %w", c.o.cni, err)
	}
	if err := c.apply(coreDNSManifest()); err != nil {
		return fmt.Errorf("CoreDNS: %w", err)
	}
	if err := c.waitFor(ctx, "nodes Ready", 5*time.Minute, func() error {
		out, err := c.kubectl("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`)
		if err != nil {
			return err
		}
		if strings.Count(out, "=True") != numNodes {
			return fmt.Errorf("%s", out)
		}
		return nil
	}); err != nil {
		return err
	}
	return c.waitFor(ctx, "kube-system pods ready", 5*time.Minute, func() error {
		out, err := c.kubectl("get", "pods", "-n", "kube-system", "-o",
			`jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`)
		if err != nil {
			return err
		}
		f := strings.Fields(out)
		if len(f) == 0 || strings.Count(out, "=True") != len(f) {
			return fmt.Errorf("%s", out)
		}
		return nil
	})
}

// network: the control-plane namespace with the bridge, the node
// namespaces, and a veth from each node to the bridge. No link to the
// host's namespace, no default route anywhere.
func (c *cluster) network() error {
	var err error
	if c.cp, err = c.start("netns-cp", nil, false, "cp", "unshare", "--net", "--", "sleep", "infinity"); err != nil {
		return err
	}
	for _, n := range c.nodes {
		if n.holder, err = c.start("netns-"+n.name, nil, false, n.name,
			"unshare", "--net", "--mount", "--uts", "--propagation", "private", "--", "sleep", "infinity"); err != nil {
			return err
		}
	}
	if c.o.subnets {
		if c.router, err = c.start("netns-router", nil, false, "router", "unshare", "--net", "--", "sleep", "infinity"); err != nil {
			return err
		}
	}
	// unshare execs sleep once the namespaces exist: wait for that.
	holders := c.holders()
	self, _ := os.Readlink("/proc/self/ns/net")
	for _, h := range holders {
		ok := false
		for i := 0; i < 100 && !ok; i++ {
			ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", h.cmd.Process.Pid))
			exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", h.cmd.Process.Pid))
			if ns != "" && ns != self && strings.HasSuffix(exe, "/sleep") {
				cookie, err := netnsCookie(h.cmd.Process.Pid)
				if err != nil {
					return fmt.Errorf("%s: %w", h.name, err)
				}
				if c.netnsIDs == nil {
					c.netnsIDs = map[string]uint64{}
				}
				c.netnsIDs[ns] = cookie
				ok = true
			} else {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if !ok {
			return fmt.Errorf("%s: no new network namespace", h.name)
		}
	}
	if _, err := in(c.cp, false, "ip", "link", "set", "lo", "up"); err != nil {
		return err
	}
	for sn := 0; sn < c.numSubnets(); sn++ {
		br := fmt.Sprintf("br%d", sn)
		steps := [][]string{
			{"ip", "link", "add", br, "type", "bridge"},
			{"ip", "addr", "add", subnetPrefix(sn) + ".1/24", "dev", br},
			{"ip", "link", "set", br, "up"},
		}
		if c.o.dualStack {
			steps = append(steps, []string{"ip", "addr", "add", subnetPrefix6(sn) + "1/64", "dev", br, "nodad"})
		}
		for _, s := range steps {
			if _, err := in(c.cp, false, s...); err != nil {
				return err
			}
		}
	}
	if c.o.subnets {
		if err := c.routerNetwork(); err != nil {
			return err
		}
	}
	for _, n := range c.nodes {
		pid := strconv.Itoa(n.holder.cmd.Process.Pid)
		for _, s := range [][]string{
			{"ip", "link", "add", "v-" + n.name, "type", "veth", "peer", "name", "eth0", "netns", pid},
			{"ip", "link", "set", "v-" + n.name, "master", fmt.Sprintf("br%d", n.subnet), "up"},
		} {
			if _, err := in(c.cp, false, s...); err != nil {
				return err
			}
		}
		// Its own hostname: hostNetwork pods report the node's.
		if _, err := in(n.holder, true, "hostname", n.name); err != nil {
			return err
		}
		steps := [][]string{
			{"ip", "link", "set", "lo", "up"},
			{"ip", "addr", "add", n.ip + "/24", "dev", "eth0"},
			{"ip", "link", "set", "eth0", "up"},
			// A node process's connect to a ClusterIP needs a route before
			// kube-proxy's DNAT: a link route for the Service range.
			{"ip", "route", "add", serviceCIDR, "dev", "eth0"},
			{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		}
		if c.o.dualStack {
			steps = append(steps,
				[]string{"ip", "addr", "add", n.ip6 + "/64", "dev", "eth0", "nodad"},
				[]string{"ip", "-6", "route", "add", serviceCIDR6, "dev", "eth0"},
				[]string{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"})
		}
		steps = append(steps, c.subnetRoutes(n)...)
		for _, s := range steps {
			if _, err := in(n.holder, false, s...); err != nil {
				return err
			}
		}
		if err := c.nodeMounts(n); err != nil {
			return err
		}
	}
	return nil
}

// nodeMounts gives the node's mount namespace its own /etc, /opt, /run,
// /var/lib, /var/log (overlays whose writes land in the work directory) and
// its own bpffs: the node's /etc/cni/net.d, /opt/cni/bin, /var/lib/cni,
// /var/lib/kubelet, /var/log/pods, /run/netns and pins exist nowhere else
// and vanish with it.
func (c *cluster) nodeMounts(n *node) error {
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, d := range []string{"etc", "opt", "run", "var/lib", "var/log"} {
		up := filepath.Join(n.dir, "ovl", d, "upper")
		wk := filepath.Join(n.dir, "ovl", d, "work")
		fmt.Fprintf(&script, "mkdir -p %s %s\nmount -t overlay overlay -o lowerdir=/%s,upperdir=%s,workdir=%s /%s\n", up, wk, d, up, wk, d)
	}
	script.WriteString("mount -t bpf bpffs /sys/fs/bpf\n")
	script.WriteString("mkdir -p /etc/cni/net.d /opt/cni/bin /var/lib/cni /var/lib/kubelet /var/log/pods\n")
	// Shared inside the node (new peer groups: nothing propagates to the
	// host), as on a systemd host: kubelet accepts HostToContainer and
	// Bidirectional volume mounts only from shared or slave mounts.
	script.WriteString("mount --make-rshared /\n")
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return err
	}
	_, err := in(n.holder, true, "/bin/sh", "-c", script.String())
	return err
}

func (c *cluster) controlPlane(ctx context.Context) error {
	if err := c.apiServer(ctx); err != nil {
		return err
	}
	p := c.pki
	kc := func(name string) (string, error) {
		path := filepath.Join(c.work, name+".kubeconfig")
		return path, p.kubeconfig(path, name, "https://"+c.cpIP+":6443")
	}
	cmKC, err := kc("controller-manager")
	if err != nil {
		return err
	}
	schedKC, err := kc("scheduler")
	if err != nil {
		return err
	}
	cidrFlags := []string{"--allocate-node-cidrs", "--cluster-cidr", c.clusterCIDRs(), "--node-cidr-mask-size-ipv4", "24"}
	if c.o.dualStack {
		cidrFlags = append(cidrFlags, "--node-cidr-mask-size-ipv6", "64")
	}
	if _, err := c.start("kube-controller-manager", c.cp, false, "cp", append(append([]string{c.a.path("kube-controller-manager"),
		"--kubeconfig", cmKC, "--authentication-kubeconfig", cmKC, "--authorization-kubeconfig", cmKC,
		"--bind-address", "127.0.0.1", "--leader-elect=false"}, cidrFlags...),
		"--service-cluster-ip-range", c.serviceCIDRs(),
		"--root-ca-file", p.path("ca.crt"), "--service-account-private-key-file", p.path("sa.key"),
		"--use-service-account-credentials",
		"--cluster-signing-cert-file", p.path("ca.crt"), "--cluster-signing-key-file", p.path("ca.key"),
		"--controllers", "*,bootstrapsigner,tokencleaner",
		// Its default is under /usr/libexec on the host, which it would create.
		"--flex-volume-plugin-dir", filepath.Join(c.work, "flexvolume"), "--v=1")...); err != nil {
		return err
	}
	_, err = c.start("kube-scheduler", c.cp, false, "cp", c.a.path("kube-scheduler"),
		"--kubeconfig", schedKC, "--authentication-kubeconfig", schedKC, "--authorization-kubeconfig", schedKC,
		"--bind-address", "127.0.0.1", "--leader-elect=false", "--v=1")
	return err
}

// apiServer starts etcd and kube-apiserver in the control-plane namespace
// (with the cluster's PKI and the admin kubeconfig) and waits until the API
// server is ready. It is all the agent's Node-following tests need.
func (c *cluster) apiServer(ctx context.Context) error {
	var err error
	if c.pki, err = newPKI(filepath.Join(c.work, "pki")); err != nil {
		return err
	}
	p := c.pki
	server := "https://" + c.cpIP + ":6443"
	issue := []struct {
		name, cn string
		orgs     []string
		hosts    []string
	}{
		{"apiserver", "kube-apiserver", nil, []string{c.cpIP, apiServiceIP, "127.0.0.1", "localhost", "kubernetes",
			"kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil},
		{"admin", "kubernetes-admin", []string{"system:masters"}, nil},
		{"controller-manager", "system:kube-controller-manager", nil, nil},
		{"scheduler", "system:kube-scheduler", nil, nil},
		{"kube-proxy", "system:kube-proxy", nil, nil},
	}
	for _, n := range c.nodes {
		issue = append(issue, struct {
			name, cn string
			orgs     []string
			hosts    []string
		}{"kubelet-" + n.name, "system:node:" + n.name, []string{"system:nodes"}, []string{n.ip, n.name}})
	}
	for _, i := range issue {
		if err := p.issue(i.name, i.cn, i.orgs, i.hosts); err != nil {
			return err
		}
	}
	kc := func(name string) (string, error) {
		path := filepath.Join(c.work, name+".kubeconfig")
		return path, p.kubeconfig(path, name, server)
	}
	if c.admin, err = kc("admin"); err != nil {
		return err
	}
	if _, err := c.start("etcd", c.cp, false, "cp", c.a.path("etcd"),
		"--name", "e2e", "--data-dir", filepath.Join(c.work, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "e2e=http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level", "warn"); err != nil {
		return err
	}
	return c.startAPIServer(ctx)
}

// startAPIServer starts kube-apiserver (again, after stopAPIServer) and
// waits until it is ready.
func (c *cluster) startAPIServer(ctx context.Context) error {
	p := c.pki
	var err error
	if c.apiserver, err = c.start("kube-apiserver", c.cp, false, "cp", c.a.path("kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--advertise-address", c.cpIP, "--bind-address", "0.0.0.0", "--secure-port", "6443",
		"--service-cluster-ip-range", c.serviceCIDRs(),
		"--client-ca-file", p.path("ca.crt"),
		"--tls-cert-file", p.path("apiserver.crt"), "--tls-private-key-file", p.path("apiserver.key"),
		"--kubelet-client-certificate", p.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", p.path("apiserver-kubelet-client.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p.path("sa.pub"), "--service-account-signing-key-file", p.path("sa.key"),
		// Node names resolve nowhere (no DNS outside the cluster): reach
		// kubelets by their InternalIP.
		"--kubelet-preferred-address-types", "InternalIP",
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
		"--allow-privileged", "--profiling=false", "--v=1"); err != nil {
		return err
	}
	return c.waitFor(ctx, "kube-apiserver ready", 3*time.Minute, func() error {
		_, err := c.kubectl("get", "--raw", "/readyz")
		return err
	})
}

// stopAPIServer kills kube-apiserver (the agent tests' outage); etcd keeps
// the cluster's state for startAPIServer.
func (c *cluster) stopAPIServer() { c.stop(c.apiserver) }

// stop kills one of the run's processes and forgets it (waitFor fails when
// one of them exits).
func (c *cluster) stop(p *proc) {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	for i, q := range c.procs {
		if q == p {
			c.procs = append(c.procs[:i], c.procs[i+1:]...)
			break
		}
	}
}

func (c *cluster) startNode(ctx context.Context, n *node) error {
	p := c.pki
	server := "https://" + c.cpIP + ":6443"
	kubeletKC := filepath.Join(n.dir, "kubelet.kubeconfig")
	if err := p.kubeconfig(kubeletKC, "kubelet-"+n.name, server); err != nil {
		return err
	}
	proxyKC := filepath.Join(n.dir, "kube-proxy.kubeconfig")
	if err := p.kubeconfig(proxyKC, "kube-proxy", server); err != nil {
		return err
	}
	sock := filepath.Join(n.dir, "containerd.sock")
	files := map[string]string{
		"containerd.toml": fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
`, filepath.Join(n.dir, "containerd/root"), filepath.Join(n.dir, "containerd/state"), sock,
			sock+".ttrpc", filepath.Join(n.dir, "containerd/opt"), pauseImage),
		// An empty resolv.conf: pods with dnsPolicy Default and the node's own
		// lookups get no upstream resolver.
		"resolv.conf": "",
		"kubelet.yaml": fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[1]q}
authorization: {mode: Webhook}
address: %[2]q
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
cgroupDriver: cgroupfs
cgroupRoot: /%[3]s/%[4]s-pods
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%[5]s
clusterDNS: [%[6]q]
clusterDomain: cluster.local
resolvConf: %[7]q
volumePluginDir: %[8]q
serializeImagePulls: false
rotateCertificates: false
protectKernelDefaults: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 110
`, p.path("ca.crt"), n.ip, c.cgName, n.name, sock, dnsServiceIP, filepath.Join(n.dir, "resolv.conf"),
			filepath.Join(n.dir, "volume-plugins")),
		"kube-proxy.yaml": fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %[1]q}
mode: iptables
clusterCIDR: %[2]q
hostnameOverride: %[3]q
bindAddress: 0.0.0.0
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0, min: 0}
`, proxyKC, c.clusterCIDRs(), n.name),
	}
	for name, s := range files {
		if err := os.WriteFile(filepath.Join(n.dir, name), []byte(s), 0o644); err != nil {
			return err
		}
	}
	if _, err := c.cgroupDirs(n.name + "-pods"); err != nil {
		return err
	}
	if _, err := c.start(n.name+"-containerd", n.holder, true, n.name,
		"containerd", "--config", filepath.Join(n.dir, "containerd.toml")); err != nil {
		return err
	}
	if err := c.waitFor(ctx, n.name+" containerd", time.Minute, func() error {
		_, err := in(n.holder, true, "ctr", "--address", sock, "version")
		return err
	}); err != nil {
		return err
	}
	for _, img := range c.a.images {
		if _, err := in(n.holder, true, "ctr", "--address", sock, "-n", "k8s.io", "images", "import", img); err != nil {
			return fmt.Errorf("import %s: %w", filepath.Base(img), err)
		}
	}
	if _, err := c.start(n.name+"-kubelet", n.holder, true, n.name, c.a.path("kubelet"),
		"--config", filepath.Join(n.dir, "kubelet.yaml"), "--kubeconfig", kubeletKC,
		"--hostname-override", n.name, "--node-ip", strings.Join(n.ips(), ","),
		"--root-dir", filepath.Join(n.dir, "kubelet"), "--cert-dir", filepath.Join(n.dir, "kubelet-pki"), "--v=1"); err != nil {
		return err
	}
	_, err := c.start(n.name+"-kube-proxy", n.holder, true, n.name, c.a.path("kube-proxy"),
		"--config", filepath.Join(n.dir, "kube-proxy.yaml"), "--v=1")
	return err
}

// podCIDRRoutes waits for the controller-manager to give every node its pod
// ranges, then routes each range via its node in the control-plane
// namespace (not a node: it runs no agent; the API server and e2e.test
// reach pods through these routes) and, for the reference plugins, on the
// other nodes (host-gw, as flannel's would: ptp installs none). With
// ebpf-cni the nodes get theirs from the agent's Node-following
// (checkAgents proves it).
func (c *cluster) podCIDRRoutes(ctx context.Context) error {
	if err := c.waitFor(ctx, "nodes registered with pod CIDRs", 3*time.Minute, func() error {
		out, err := c.kubectl("get", "nodes", "-o", "json")
		if err != nil {
			return err
		}
		var l struct {
			Items []struct {
				Metadata struct{ Name string }
				Spec     struct{ PodCIDRs []string }
			}
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			return err
		}
		got := map[string][]string{}
		for _, it := range l.Items {
			got[it.Metadata.Name] = it.Spec.PodCIDRs
		}
		for _, n := range c.nodes {
			if len(got[n.name]) != len(n.ips()) {
				return fmt.Errorf("%s has pod CIDRs %v, want one per family of %v", n.name, got[n.name], n.ips())
			}
			n.podCIDRs = got[n.name]
		}
		return nil
	}); err != nil {
		return err
	}
	for _, n := range c.nodes {
		logf("%s: %v, pod CIDRs %v", n.name, n.ips(), n.podCIDRs)
		for _, cidr := range n.podCIDRs {
			if _, err := in(c.cp, false, "ip", "route", "add", cidr, "via", n.via(cidr)); err != nil {
				return err
			}
			if c.o.cni != "reference" {
				continue
			}
			for _, m := range c.nodes {
				if m != n {
					if _, err := in(m.holder, false, "ip", "route", "add", cidr, "via", n.via(cidr)); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// apply: kubectl apply of a manifest.
func (c *cluster) apply(manifest string) error {
	f := filepath.Join(c.work, fmt.Sprintf("manifest-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte(manifest), 0o644); err != nil {
		return err
	}
	_, err := c.kubectl("apply", "-f", f)
	return err
}
