package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// preflight installs what is missing from apt: containerd and runc (the
// nodes' runtime), iptables (kube-proxy), util-linux (nsenter, unshare).
func preflight(ctx context.Context) error {
	need := map[string]string{
		"containerd": "containerd", "runc": "runc", "ctr": "containerd", "iptables": "iptables",
		"nsenter": "util-linux", "unshare": "util-linux", "ip": "iproute2", "apt-get": "apt",
		"dpkg-deb": "dpkg", "ldconfig": "libc-bin", "sysctl": "procps",
	}
	var pkgs []string
	seen := map[string]bool{}
	for cmd, pkg := range need {
		if _, err := exec.LookPath(cmd); err != nil && !seen[pkg] {
			seen[pkg] = true
			pkgs = append(pkgs, pkg)
		}
	}
	// apt-get download and apt-cache need package lists.
	lists, _ := filepath.Glob("/var/lib/apt/lists/*_Packages*")
	if len(pkgs) == 0 && len(lists) > 0 {
		return nil
	}
	sort.Strings(pkgs)
	logf("apt-get install %v", pkgs)
	if out, err := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get update: %w: %s", err, tail(string(out), 10))
	}
	if len(pkgs) == 0 {
		return nil
	}
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get install: %w: %s", err, tail(string(out), 10))
	}
	return nil
}

// Machine-wide sysctls kubelet sets (pkg/kubelet/cm setupKernelTunables)
// and conntrack limits kube-proxy may set; recorded before, restored after.
var watchedSysctls = []string{
	"vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
	"kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes", "net.netfilter.nf_conntrack_max",
	"net.nf_conntrack_max", "kernel.pid_max", "fs.inotify.max_user_instances", "fs.inotify.max_user_watches",
}

func sysctlPath(k string) string { return "/proc/sys/" + strings.ReplaceAll(k, ".", "/") }

func readSysctls() map[string]string {
	m := map[string]string{}
	for _, k := range watchedSysctls {
		if b, err := os.ReadFile(sysctlPath(k)); err == nil {
			m[k] = strings.TrimSpace(string(b))
		}
	}
	return m
}

func (c *cluster) recordSysctls() { c.sysctls = readSysctls() }

// state: what the leak check compares.
type state struct {
	sysctls  map[string]string
	mounts   map[string]bool // host mount points
	hostDirs map[string]bool // paths a careless node would create on the host
	pins     map[string]bool // /sys/fs/bpf entries
	rules    map[string]string
}

var hostPaths = []string{
	"/etc/cni", "/opt/cni", "/var/lib/cni", "/var/lib/kubelet", "/var/lib/containerd", "/run/containerd",
	"/var/log/pods", "/var/log/containers", "/etc/kubernetes", "/usr/libexec/kubernetes", "/run/netns",
	"/sys/fs/bpf/ebpf-cni",
}

func mountPoints() map[string]bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	m := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 {
			m[f[4]] = true
		}
	}
	return m
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// rulesets: the host's iptables, ip6tables and nftables rules, without
// counters and comments.
func rulesets() map[string]string {
	m := map[string]string{}
	for name, args := range map[string][]string{
		"iptables": {"iptables-save"}, "ip6tables": {"ip6tables-save"}, "nft": {"nft", "list", "ruleset"},
	} {
		if _, err := exec.LookPath(args[0]); err != nil {
			continue
		}
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			continue
		}
		var keep []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "#") {
				continue
			}
			keep = append(keep, counters.ReplaceAllString(l, ""))
		}
		m[name] = strings.Join(keep, "\n")
	}
	return m
}

func snapshot(c *cluster) (*state, error) {
	s := &state{sysctls: readSysctls(), mounts: mountPoints(), hostDirs: map[string]bool{}, pins: map[string]bool{}, rules: rulesets()}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); err == nil {
			s.hostDirs[p] = true
		}
	}
	ents, _ := os.ReadDir("/sys/fs/bpf")
	for _, e := range ents {
		s.pins[e.Name()] = true
	}
	return s, nil
}

// compare lists what the run left on the machine.
func compare(before *state, c *cluster) []string {
	var leaks []string
	add := func(format string, args ...any) { leaks = append(leaks, fmt.Sprintf(format, args...)) }
	after := readSysctls()
	for k, v := range before.sysctls {
		if after[k] != v {
			add("sysctl %s is %s, was %s", k, after[k], v)
		}
	}
	for p := range mountPoints() {
		if !before.mounts[p] && (strings.Contains(p, c.id) || strings.HasPrefix(p, c.work)) {
			add("mount %s", p)
		}
	}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); err == nil && !before.hostDirs[p] {
			add("host path %s was created", p)
		}
	}
	if _, err := os.Stat(c.work); err == nil && !c.o.keep {
		add("work directory %s", c.work)
	}
	for _, pid := range c.ourPids() {
		add("process %d: %s", pid, cmdline(pid))
	}
	for _, d := range c.ourCgroups() {
		add("cgroup %s", d)
	}
	for _, ns := range c.liveNetns() {
		add("network namespace %s still referenced", ns)
	}
	// The socket hooks the nodes pinned must be detached with them.
	now := attachedIDs()
	for id := range c.cgProgsOurs {
		if now[id] {
			add("socket hook program %d, pinned by a node of the run, is still attached to the cgroup2 root", id)
		}
	}
	after2 := rulesets()
	for k, v := range before.rules {
		if after2[k] != v {
			add("host %s ruleset changed during the run (another session may have changed it):\n%s", k, lineDiff(v, after2[k]))
		}
	}
	return leaks
}

func lineDiff(a, b string) string {
	am, bm := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(a, "\n") {
		am[l] = true
	}
	for _, l := range strings.Split(b, "\n") {
		bm[l] = true
	}
	var out []string
	for l := range am {
		if !bm[l] {
			out = append(out, "    - "+l)
		}
	}
	for l := range bm {
		if !am[l] {
			out = append(out, "    + "+l)
		}
	}
	sort.Strings(out)
	if len(out) > 20 {
		out = append(out[:20], "    ...")
	}
	return strings.Join(out, "\n")
}

func isCgroup2(p string) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(p, &st) == nil && st.Type == 0x63677270 // CGROUP2_SUPER_MAGIC
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// ourCgroups: k8se-<id> directories, deepest first.
func (c *cluster) ourCgroups() []string {
	var dirs []string
	for _, m := range cgroupMounts() {
		root := filepath.Join(m, c.cgName)
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, k int) bool { return len(dirs[i]) > len(dirs[k]) })
	return dirs
}

// ourPids: every process in the run's cgroups, or whose command line names
// the work directory (a shim that escaped its cgroup would still).
func (c *cluster) ourPids() []int {
	set := map[int]bool{}
	for _, d := range c.ourCgroups() {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				set[n] = true
			}
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n == os.Getpid() {
			continue
		}
		if strings.Contains(cmdline(n), c.work) {
			set[n] = true
		}
	}
	var pids []int
	for p := range set {
		pids = append(pids, p)
	}
	sort.Ints(pids)
	return pids
}

// liveNetns: the run's network namespaces that some process still holds,
// with the processes. The inode number alone does not say: the kernel
// reuses a freed one at once, and the integration tests, which go test
// runs next to these, make namespaces all the time (CI saw one of theirs
// named as this run's). The netns cookie is never reused.
func (c *cluster) liveNetns() []string {
	if len(c.netnsIDs) == 0 {
		return nil
	}
	found := map[string][]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ns, _ := os.Readlink("/proc/" + e.Name() + "/ns/net")
		want, ours := c.netnsIDs[ns]
		if !ours {
			continue
		}
		if cookie, err := netnsCookie(pid); err != nil || cookie != want {
			continue // gone meanwhile, or another namespace with the number
		}
		found[ns] = append(found[ns], fmt.Sprintf("process %d: %s", pid, cmdline(pid)))
	}
	var out []string
	for ns, procs := range found {
		out = append(out, ns+" ("+strings.Join(procs, "; ")+")")
	}
	sort.Strings(out)
	return out
}

// netnsCookie: the cookie of pid's network namespace (SO_NETNS_COOKIE,
// Linux 5.14), unique for the boot.
func netnsCookie(pid int) (uint64, error) {
	var cookie uint64
	err := inNetns(pid, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("netns cookie of process %d: %w", pid, err)
	}
	return cookie, nil
}

// down kills everything the run started (the cluster has no state worth a
// graceful stop: the node mount namespaces hold every pod netns, overlay
// and pin, and vanish with their last process), removes cgroups, restores
// sysctls and removes the work directory.
func (c *cluster) down() {
	// kubelet first, so it does not restart what dies next.
	for _, p := range c.procs {
		if strings.HasSuffix(p.name, "-kubelet") && !p.exited() {
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		}
	}
	for _, p := range c.procs {
		if !p.exited() {
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range c.procs {
		select {
		case <-p.done:
		case <-time.After(time.Until(deadline)):
		}
	}
	// Containers, shims and anything else in the run's cgroups.
	for i := 0; i < 50; i++ {
		pids := c.ourPids()
		for _, p := range c.procs {
			if !p.exited() {
				syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			}
		}
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, p := range c.procs {
		<-p.done
	}
	for i := 0; i < 25; i++ {
		left := 0
		for _, d := range c.ourCgroups() {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				left++
			}
		}
		if left == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for k, v := range c.sysctls {
		if cur, err := os.ReadFile(sysctlPath(k)); err == nil && strings.TrimSpace(string(cur)) != v {
			if err := os.WriteFile(sysctlPath(k), []byte(v), 0o644); err != nil {
				logf("restore sysctl %s=%s: %v", k, v, err)
			} else {
				logf("restored sysctl %s=%s (was set to %s)", k, v, strings.TrimSpace(string(cur)))
			}
		}
	}
	if c.o.keep {
		logf("kept %s", c.work)
		return
	}
	// Overlay work directories hold root-only entries; RemoveAll copes.
	if err := os.RemoveAll(c.work); err != nil {
		logf("remove %s: %v", c.work, err)
	}
}

// collectLogs copies the kube-system pods' container logs (the agents',
// CoreDNS') out of the node before it goes (kubelet's /var/log/pods is in
// the node's overlay; its directories are <namespace>_<pod>_<uid>).
func (c *cluster) collectLogs() {
	for _, n := range c.nodes {
		if n.holder == nil || n.holder.exited() {
			continue
		}
		dst := filepath.Join(c.logs, n.name+"-pods")
		os.MkdirAll(dst, 0o755)
		in(n.holder, true, "/bin/sh", "-c", fmt.Sprintf("cp -rL /var/log/pods/kube-system_* %s/ 2>/dev/null; true", dst))
	}
}

// checkOffline proves nothing can leave the machine: no namespace of the
// run has a default route or a route to a public or host address, none has
// a link whose other end is outside the run's namespaces, the kubelet's
// resolv.conf is empty, and CoreDNS has no upstream. Route lookups only: no
// packet is sent.
func (c *cluster) checkOffline() error {
	holders := c.holders()
	// Addresses that must be unreachable: public ones and the host's own.
	targets := []string{"1.1.1.1", "8.8.8.8", "192.0.2.1", "172.16.0.1", "192.168.0.1", "2001:4860:4860::8888", "2606:4700::1111"}
	if out, err := sh("ip", "-o", "addr", "show", "scope", "global"); err == nil {
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			if len(f) > 3 {
				if a, _, ok := strings.Cut(f[3], "/"); ok && !strings.HasPrefix(a, fabricPrefix+".") && !strings.HasPrefix(a, fabricPrefix6) {
					targets = append(targets, a)
				}
			}
		}
	}
	for _, h := range holders {
		for _, fam := range []string{"-4", "-6"} {
			routes, err := in(h, false, "ip", fam, "route", "show", "default")
			if err != nil {
				return err
			}
			if strings.TrimSpace(routes) != "" {
				return fmt.Errorf("%s has a default route: %s", h.name, routes)
			}
		}
		for _, t := range targets {
			if out, err := in(h, false, "ip", "route", "get", t); err == nil {
				return fmt.Errorf("%s has a route to %s: %s", h.name, t, strings.TrimSpace(out))
			}
		}
	}
	// The fabric has no way out: the control-plane namespace holds the
	// bridge and one veth per node, nothing else (the nodes' other links are
	// their pods' veths, whose other ends are in pod namespaces).
	links, err := in(c.cp, false, "ip", "-o", "link", "show")
	if err != nil {
		return err
	}
	want := map[string]bool{"lo": true}
	for sn := 0; sn < c.numSubnets(); sn++ {
		want[fmt.Sprintf("br%d", sn)] = true
		if c.o.subnets {
			want[fmt.Sprintf("v-router%d", sn)] = true
		}
	}
	for _, n := range c.nodes {
		want["v-"+n.name] = true
	}
	for _, l := range strings.Split(strings.TrimSpace(links), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if !want[name] {
			return fmt.Errorf("unexpected link %s in the control-plane namespace (line %q of %q)", name, l, links)
		}
	}
	if err := c.checkSubnets(); err != nil {
		return err
	}
	if b, _ := os.ReadFile(filepath.Join(c.nodes[0].dir, "resolv.conf")); len(strings.TrimSpace(string(b))) != 0 {
		return fmt.Errorf("kubelet resolv.conf is not empty")
	}
	cf, err := c.kubectl("-n", "kube-system", "get", "configmap", "coredns", "-o", "jsonpath={.data.Corefile}")
	if err != nil {
		return err
	}
	if strings.Contains(cf, "forward") || strings.Contains(cf, "proxy ") {
		return fmt.Errorf("CoreDNS has an upstream: %s", cf)
	}
	logf("offline: no default route or route to %d outside addresses in any namespace, empty resolv.conf, no CoreDNS upstream", len(targets))
	return nil
}
