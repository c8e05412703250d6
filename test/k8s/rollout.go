package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/internal/ociimage"
)

// The rollout under traffic (issue 27, -rollout FROM): the cluster starts
// with the DaemonSet of release FROM (its own deploy/ebpf-cni.yaml and an
// image built offline from its tree), pods on both nodes keep every path
// busy, and the DaemonSet is rolled to this tree's image (kubectl apply of
// deploy/ebpf-cni.yaml: maxUnavailable 1), back to FROM's, and forward
// again with the first node's new agent killed (SIGKILL) while it migrates
// the maps. Each phase's lost datagrams, TCP retransmissions and longest
// silence per path go to rollout.md; pods must keep their UID, addresses
// and restart count.

// releaseImage is the image name of FROM's build.
func releaseImage(commit string) string { return "ebpf-cni/ebpf-cni:" + commit[:7] }

// buildRelease builds FROM's plugin, agent and installer from `git archive`
// (cached by commit) and its image, as buildAll does this tree's.
func buildRelease(ctx context.Context, o options, a *artifacts) error {
	full, err := exec.Command("git", "-C", o.repo, "rev-parse", "--verify", o.rollout+"^{commit}").Output()
	if err != nil {
		return fmt.Errorf("-rollout %s: not a commit of the repository: %w", o.rollout, err)
	}
	commit := strings.TrimSpace(string(full))
	a.release = commit
	dir := filepath.Join(o.cache, "ebpf-cni-"+commit[:12])
	if err := cached(ctx, dir, "ebpf-cni at "+commit[:7], func(tmp string) error {
		src, err := os.MkdirTemp("", "ebpf-cni-src-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(src)
		if out, err := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("git -C %q archive --format=tar %s | tar -x -C %q", o.repo, commit, src)).CombinedOutput(); err != nil {
			return fmt.Errorf("extract %s: %w: %s", commit, err, out)
		}
		return goCmd(ctx, src, []string{"CGO_ENABLED=0"}, "build", "-trimpath", "-ldflags", "-X main.Version="+commit[:7],
			"-o", tmp+"/", "./cmd/ebpf-cni", "./cmd/ebpf-agent", "./deploy/install-cni")
	}); err != nil {
		return err
	}
	im := ociimage.New("docker.io/"+releaseImage(commit), runtime.GOARCH)
	im.Entrypoint, im.Cmd = []string{"/usr/local/bin/ebpf-agent"}, []string{"run"}
	for dst, src := range map[string]string{
		"/usr/local/bin/ebpf-agent":        filepath.Join(dir, "ebpf-agent"),
		"/usr/local/bin/install-cni":       filepath.Join(dir, "install-cni"),
		"/opt/ebpf-cni/cni-bin/ebpf-cni":   filepath.Join(dir, "ebpf-cni"),
		"/opt/ebpf-cni/cni-bin/host-local": a.path("host-local"),
		"/opt/ebpf-cni/cni-bin/loopback":   a.path("loopback"),
	} {
		if err := im.File(dst, src); err != nil {
			return err
		}
	}
	out := filepath.Join(o.cache, "images", "ebpf-cni-"+commit[:12]+".tar")
	if err := im.Write(out); err != nil {
		return err
	}
	a.images = append(a.images, out)
	return nil
}

// releaseManifest: FROM's deploy/ebpf-cni.yaml naming FROM's image.
func (c *cluster) releaseManifest() (string, error) {
	b, err := exec.Command("git", "-C", c.o.repo, "show", c.a.release+":deploy/ebpf-cni.yaml").Output()
	if err != nil {
		return "", fmt.Errorf("deploy/ebpf-cni.yaml of %s: %w", c.a.release[:7], err)
	}
	m := strings.ReplaceAll(string(b), "image: ebpf-cni/ebpf-cni:dev", "image: "+releaseImage(c.a.release))
	if m == string(b) {
		return "", fmt.Errorf("deploy/ebpf-cni.yaml of %s names no ebpf-cni/ebpf-cni:dev image", c.a.release[:7])
	}
	return m, nil
}

const (
	rolloutNS   = "rollout"
	echoPort    = 8080
	hostPortNum = 18080
	nodePortNum = 30080
	outsidePort = 7
	probeEvery  = 5 * time.Millisecond
	settle      = 20 * time.Second
)

func rolloutWorkload(nodes []*node, dualStack bool) string {
	family := ""
	if dualStack {
		family = "\n  ipFamilyPolicy: RequireDualStack"
	}
	pod := func(name, node, extra string) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: %[4]s, labels: {app: %[1]s}}
spec:
  nodeName: %[2]s
  terminationGracePeriodSeconds: 1
  containers:
  - name: pause
    image: %[3]s
    args: ["pause"]%[5]s
`, name, node, agnhostImage, rolloutNS, extra)
	}
	hostPorts := fmt.Sprintf(`
    ports:
    - {containerPort: %[1]d, hostPort: %[2]d, protocol: UDP}
    - {containerPort: %[1]d, hostPort: %[2]d, protocol: TCP}`, echoPort, hostPortNum)
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: v1
kind: Service
metadata: {name: cluster-ip, namespace: %[1]s}
spec:%[4]s
  selector: {app: s2}
  ports:
  - {name: udp, port: 80, targetPort: %[2]d, protocol: UDP}
  - {name: tcp, port: 80, targetPort: %[2]d, protocol: TCP}
---
apiVersion: v1
kind: Service
metadata: {name: node-port, namespace: %[1]s}
spec:%[4]s
  type: NodePort
  selector: {app: s2}
  ports:
  - {name: udp, port: 81, targetPort: %[2]d, nodePort: %[3]d, protocol: UDP}
  - {name: tcp, port: 81, targetPort: %[2]d, nodePort: %[3]d, protocol: TCP}
`, rolloutNS, echoPort, nodePortNum, family) +
		pod("s1", nodes[0].name, hostPorts) + pod("c1", nodes[0].name, "") +
		pod("s2", nodes[1].name, "") + pod("c2", nodes[1].name, "")
}

// podInfo: what must not change across the rollout.
type podInfo struct {
	uid, ips string
	restarts int
}

func (c *cluster) podInfos(namespaces ...string) (map[string]podInfo, error) {
	out := map[string]podInfo{}
	for _, ns := range namespaces {
		js, err := c.kubectl("-n", ns, "get", "pods", "-o", "json")
		if err != nil {
			return nil, err
		}
		var l struct {
			Items []struct {
				Metadata struct{ Name, UID string }
				Spec     struct{ HostNetwork bool }
				Status   struct {
					PodIPs            []struct{ IP string }
					ContainerStatuses []struct{ RestartCount int }
				}
			}
		}
		if err := json.Unmarshal([]byte(js), &l); err != nil {
			return nil, err
		}
		for _, it := range l.Items {
			if it.Spec.HostNetwork {
				continue // the DaemonSet's own pods are what the rollout replaces
			}
			var ips []string
			for _, ip := range it.Status.PodIPs {
				ips = append(ips, ip.IP)
			}
			r := 0
			for _, cs := range it.Status.ContainerStatuses {
				r += cs.RestartCount
			}
			out[ns+"/"+it.Metadata.Name] = podInfo{uid: it.Metadata.UID, ips: strings.Join(ips, ","), restarts: r}
		}
	}
	return out, nil
}

// podPid: a process of the pod (kubelet's cgroupfs driver puts it in
// .../pod<uid>/<container>), whose network namespace is the pod's.
func podPid(uid string) (int, error) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if strings.Contains(string(cg), "/pod"+uid+"/") {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process of pod %s", uid)
}

type rolloutPhase struct {
	name string
	run  func(ctx context.Context) (string, error) // what happened, for the table
}

// runRollout is the -rollout step, after the cluster is up with FROM's
// DaemonSet (or the reference plugins: then one phase of steady traffic,
// the kernel path's baseline).
func (c *cluster) runRollout(ctx context.Context) error {
	if err := c.apply(rolloutWorkload(c.nodes, c.o.dualStack)); err != nil {
		return fmt.Errorf("rollout workload: %w", err)
	}
	if _, err := c.kubectl("-n", rolloutNS, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=3m"); err != nil {
		return fmt.Errorf("rollout workload ready: %w", err)
	}
	before, err := c.podInfos(rolloutNS, "kube-system")
	if err != nil {
		return err
	}
	logf("rollout: workload ready")
	pids := map[string]int{}
	for _, name := range []string{"s1", "s2", "c1", "c2"} {
		pi := before[rolloutNS+"/"+name]
		if pids[name], err = podPid(pi.uid); err != nil {
			return err
		}
	}
	ip := func(name string) string { return strings.Split(before[rolloutNS+"/"+name].ips, ",")[0] }
	clusterIP, err := c.kubectl("-n", rolloutNS, "get", "service", "cluster-ip", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		return err
	}
	// Dual-stack: each pod's and the Service's IPv6 address (the second).
	ip6 := func(name string) string {
		ips := strings.Split(before[rolloutNS+"/"+name].ips, ",")
		return ips[len(ips)-1]
	}
	var clusterIP6 string
	if c.o.dualStack {
		ips, err := c.kubectl("-n", rolloutNS, "get", "service", "cluster-ip", "-o", "jsonpath={.spec.clusterIPs[*]}")
		if err != nil {
			return err
		}
		f := strings.Fields(ips)
		if len(f) != 2 || !strings.Contains(f[1], ":") || !strings.Contains(ip6("s2"), ":") {
			return fmt.Errorf("dual-stack: the Service has addresses %q and s2 %q: want an IPv6 one of each", ips, before[rolloutNS+"/s2"].ips)
		}
		clusterIP6 = f[1]
	}
	servers := &echoServers{}
	defer servers.close()
	cpPid := c.cp.cmd.Process.Pid
	for _, s := range []struct {
		pid, port int
	}{{pids["s1"], echoPort}, {pids["s2"], echoPort}, {cpPid, outsidePort}} {
		if err := servers.listen(s.pid, s.port, c.o.dualStack); err != nil {
			return err
		}
	}
	n1 := c.nodes[0].ip
	outside := c.cpIP
	type spec struct{ name, path, network, from, dst string }
	specs := []spec{
		{"pod to pod, same node", "c1 -> s1 (node1)", "udp", "c1", hp(ip("s1"), echoPort)},
		{"pod to pod, same node", "c1 -> s1 (node1)", "tcp", "c1", hp(ip("s1"), echoPort)},
		{"pod to pod, other node", "c1 (node1) -> s2 (node2)", "udp", "c1", hp(ip("s2"), echoPort)},
		{"pod to pod, other node", "c1 (node1) -> s2 (node2)", "tcp", "c1", hp(ip("s2"), echoPort)},
		{"pod to pod, other node", "c2 (node2) -> s1 (node1)", "udp", "c2", hp(ip("s1"), echoPort)},
		{"ClusterIP Service", "c1 (node1) -> " + clusterIP + ":80 -> s2 (node2)", "udp", "c1", hp(clusterIP, 80)},
		{"ClusterIP Service", "c1 (node1) -> " + clusterIP + ":80 -> s2 (node2)", "tcp", "c1", hp(clusterIP, 80)},
		{"hostPort", "outside -> node1:18080 -> s1", "udp", "outside", hp(n1, hostPortNum)},
		{"hostPort", "outside -> node1:18080 -> s1", "tcp", "outside", hp(n1, hostPortNum)},
		{"NodePort", "outside -> node1:30080 -> s2 (node2)", "udp", "outside", hp(n1, nodePortNum)},
		{"NodePort", "outside -> node1:30080 -> s2 (node2)", "tcp", "outside", hp(n1, nodePortNum)},
		{"egress (ipMasq) to outside", "c1 (node1) -> " + outside, "udp", "c1", hp(outside, outsidePort)},
		{"egress (ipMasq) to outside", "c1 (node1) -> " + outside, "tcp", "c1", hp(outside, outsidePort)},
		{"egress (ipMasq) to outside", "c2 (node2) -> " + outside, "udp", "c2", hp(outside, outsidePort)},
	}
	if c.o.dualStack {
		n16, outside6 := c.nodes[0].ip6, fabricPrefix6+"1"
		specs = append(specs, []spec{
			{"IPv6 pod to pod, same node", "c1 -> s1 (node1)", "udp", "c1", hp(ip6("s1"), echoPort)},
			{"IPv6 pod to pod, same node", "c1 -> s1 (node1)", "tcp", "c1", hp(ip6("s1"), echoPort)},
			{"IPv6 pod to pod, other node", "c1 (node1) -> s2 (node2)", "udp", "c1", hp(ip6("s2"), echoPort)},
			{"IPv6 pod to pod, other node", "c1 (node1) -> s2 (node2)", "tcp", "c1", hp(ip6("s2"), echoPort)},
			{"IPv6 ClusterIP Service", "c1 (node1) -> [" + clusterIP6 + "]:80 -> s2 (node2)", "udp", "c1", hp(clusterIP6, 80)},
			{"IPv6 hostPort", "outside -> node1:18080 -> s1", "udp", "outside", hp(n16, hostPortNum)},
			{"IPv6 hostPort", "outside -> node1:18080 -> s1", "tcp", "outside", hp(n16, hostPortNum)},
			{"IPv6 NodePort", "outside -> node1:30080 -> s2 (node2)", "udp", "outside", hp(n16, nodePortNum)},
			{"IPv6 NodePort", "outside -> node1:30080 -> s2 (node2)", "tcp", "outside", hp(n16, nodePortNum)},
			{"IPv6 egress (ipMasq) to outside", "c1 (node1) -> " + outside6, "udp", "c1", hp(outside6, outsidePort)},
			{"IPv6 egress (ipMasq) to outside", "c1 (node1) -> " + outside6, "tcp", "c1", hp(outside6, outsidePort)},
		}...)
	}
	var probes []*probe
	defer func() {
		for _, p := range probes {
			select {
			case <-p.stop:
			default:
				close(p.stop)
				p.c.Close()
			}
		}
	}()
	for _, s := range specs {
		from := cpPid
		if s.from != "outside" {
			from = pids[s.from]
		}
		var p *probe
		// kube-proxy programs the Services within seconds: retry the dial.
		if err := c.waitFor(ctx, "probe "+s.name+" "+s.network+" connects", time.Minute, func() error {
			var err error
			p, err = startProbe(s.name, s.path, s.network, from, s.dst, probeEvery)
			return err
		}); err != nil {
			return err
		}
		probes = append(probes, p)
	}
	if err := c.waitFor(ctx, "every probe answered", time.Minute, func() error {
		for _, p := range probes {
			if !p.answered() {
				return fmt.Errorf("%s (%s, %s): no echo yet", p.name, p.path, map[bool]string{true: "tcp", false: "udp"}[p.tcp])
			}
		}
		return nil
	}); err != nil {
		return err
	}

	logf("rollout: %d probes answered, every %s each", len(probes), probeEvery)
	// What the kernel of each node did to neighbours, routes and links,
	// timestamped: a loss no agent step explains is placed among them
	// (logs/monitor-<node>.log; ended with the cluster).
	for _, n := range c.nodes {
		if _, err := c.start("monitor-"+n.name, n.holder, false, n.name, "ip", "-ts", "monitor", "neigh", "route", "link"); err != nil {
			logf("rollout: ip monitor on %s: %v", n.name, err)
		}
	}
	phases := c.rolloutPhases()
	type phaseLog struct {
		name, what       string
		start            time.Time
		took             time.Duration
		loadFrom, loadTo string
	}
	var logs []phaseLog
	for _, ph := range phases {
		for _, p := range probes {
			p.markPhase()
		}
		logf("rollout phase %q", ph.name)
		l := phaseLog{name: ph.name, loadFrom: loadavg()}
		t := time.Now()
		l.start = t
		what, err := ph.run(ctx)
		l.took, l.what, l.loadTo = time.Since(t), what, loadavg()
		c.saveAgentLogs(ph.name)
		logs = append(logs, l)
		if err != nil {
			return fmt.Errorf("rollout phase %s: %w", ph.name, err)
		}
		logf("rollout phase %q: %s (%s)", ph.name, what, since(t))
	}
	// Every probe stops at once (the last phase ends for all), then the
	// last echoes get 2 s to arrive.
	for _, p := range probes {
		p.stopSending()
	}
	time.Sleep(2 * time.Second)
	results := make([][]phaseResult, len(probes))
	for i, p := range probes {
		results[i] = p.finish()
	}
	after, err := c.podInfos(rolloutNS, "kube-system")
	if err != nil {
		return err
	}

	// The table.
	var b strings.Builder
	var failures []string
	here := strings.TrimSpace(output(exec.Command("git", "-C", c.o.repo, "describe", "--always", "--dirty")))
	if c.a.release != "" {
		fmt.Fprintf(&b, "CNI %s, rollout from %s to %s; a numbered message every %s per flow, echoed back.\n\n", c.o.cni, c.a.release[:7], here, probeEvery)
	} else {
		fmt.Fprintf(&b, "CNI %s (%s), no rollout: its baseline; a numbered message every %s per flow, echoed back.\n\n", c.o.cni, here, probeEvery)
	}
	fmt.Fprintf(&b, "| phase | began (UTC) | what happened | took | load average (1, 5, 15 min) before -> after |\n|---|---|---|---:|---|\n")
	for _, l := range logs {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s -> %s |\n", l.name, l.start.UTC().Format("15:04:05.000"), l.what, l.took.Round(time.Second), l.loadFrom, l.loadTo)
	}
	fmt.Fprintf(&b, "\nUDP: lost/sent (longest silence between echoes); TCP: segments retransmitted for loss (longest silence).\n\n| path | flow | proto |")
	for _, l := range logs {
		fmt.Fprintf(&b, " %s |", l.name)
	}
	fmt.Fprintf(&b, "\n|---|---|---|%s\n", strings.Repeat("---:|", len(logs)))
	for i, p := range probes {
		proto := "UDP"
		if p.tcp {
			proto = "TCP"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |", p.name, p.path, proto)
		for j, r := range results[i] {
			cell := fmt.Sprintf("%d/%d (%s)", r.lost, r.sent, r.maxGap.Round(time.Millisecond))
			if p.tcp {
				cell = fmt.Sprintf("%d (%s)", r.retrans, r.maxGap.Round(time.Millisecond))
			}
			if r.broken {
				cell += " BROKEN"
			}
			if r.lost > 0 || r.retrans > 0 || r.broken {
				failures = append(failures, fmt.Sprintf("%s %s %s in %s: %s", p.name, p.path, proto, logs[j].name, cell))
			}
			fmt.Fprintf(&b, " %s |", cell)
		}
		fmt.Fprintln(&b)
		if len(p.errs) > 0 {
			fmt.Fprintf(&b, "\n%s %s socket errors: %s\n\n", p.name, proto, strings.Join(p.errs[:min(len(p.errs), 5)], "; "))
		}
	}
	// Where each loss was in time, to be read beside the agents' logs
	// (logs/agents-<phase>/, microsecond timestamps).
	var when []string
	for i, p := range probes {
		for j, r := range results[i] {
			if len(r.losses) == 0 {
				continue
			}
			ls := r.losses
			if len(ls) > 8 {
				ls = append(ls[:8:8], fmt.Sprintf("and %d more runs", len(r.losses)-8))
			}
			when = append(when, fmt.Sprintf("- %s %s, %s: %s", p.name, p.path, logs[j].name, strings.Join(ls, "; ")))
		}
	}
	if len(when) > 0 {
		fmt.Fprintf(&b, "\nUDP losses in time (runs of consecutive numbers, when sent):\n\n%s\n", strings.Join(when, "\n"))
	}
	var srcs []string
	for s := range servers.sourcesOf(cpPid) {
		srcs = append(srcs, s)
	}
	sort.Strings(srcs)
	fmt.Fprintf(&b, "\nSources the outside namespace saw: %s (pods are %s).\n", strings.Join(srcs, ", "),
		strings.Join([]string{before[rolloutNS+"/s1"].ips, before[rolloutNS+"/c1"].ips, before[rolloutNS+"/s2"].ips, before[rolloutNS+"/c2"].ips}, ", "))
	var changed []string
	for k, v := range before {
		if w, ok := after[k]; !ok {
			changed = append(changed, k+" is gone")
		} else if w != v {
			changed = append(changed, fmt.Sprintf("%s: %+v -> %+v", k, v, w))
		}
	}
	sort.Strings(changed)
	if len(changed) == 0 {
		fmt.Fprintf(&b, "\nPods (%d, rollout and kube-system but the DaemonSet's): none restarted, re-created or re-addressed.\n", len(before))
	} else {
		fmt.Fprintf(&b, "\nPods changed:\n\n- %s\n", strings.Join(changed, "\n- "))
		failures = append(failures, changed...)
	}
	path := filepath.Join(c.o.out, "rollout.md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		logf("write %s: %v", path, err)
	}
	for _, l := range strings.Split(strings.TrimRight(b.String(), "\n"), "\n") {
		logf("  %s", l)
	}
	if len(failures) > 0 {
		return fmt.Errorf("rollout under traffic (%s): %d failures:\n  %s", path, len(failures), strings.Join(failures, "\n  "))
	}
	return nil
}

func hp(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// rolloutPhases: for ebpf-cni, steady traffic on FROM, the rollout to this
// tree, back to FROM, and forward again with a SIGKILL; for the reference
// plugins (no daemon), steady traffic only.
func (c *cluster) rolloutPhases() []rolloutPhase {
	steady := rolloutPhase{"steady", func(ctx context.Context) (string, error) {
		time.Sleep(60 * time.Second)
		return "nothing: 60 s of traffic", nil
	}}
	if c.o.cni != "ebpf-cni" {
		return []rolloutPhase{steady}
	}
	steady.run = func(ctx context.Context) (string, error) {
		time.Sleep(30 * time.Second)
		return "nothing: 30 s of traffic on " + c.a.release[:7], nil
	}
	current := filepath.Join(c.o.repo, "deploy/ebpf-cni.yaml")
	roll := func(ctx context.Context, manifest string) (string, error) {
		t := time.Now()
		if _, err := c.kubectl("apply", "-f", manifest); err != nil {
			return "", err
		}
		if _, err := c.kubectl("-n", "kube-system", "rollout", "status", "daemonset/ebpf-cni", "--timeout=6m"); err != nil {
			return "", err
		}
		return fmt.Sprintf("kubectl apply -f %s; rollout status: done in %s", filepath.Base(manifest), since(t)), nil
	}
	back := func(ctx context.Context) (string, error) {
		m, err := c.releaseManifest()
		if err != nil {
			return "", err
		}
		f := filepath.Join(c.work, "release.yaml")
		if err := os.WriteFile(f, []byte(m), 0o644); err != nil {
			return "", err
		}
		what, err := roll(ctx, f)
		time.Sleep(settle)
		return "to " + c.a.release[:7] + ": " + what + ", then " + settle.String(), err
	}
	// The SIGKILL goes to the first rollout: the one that migrates the maps
	// to this tree's layout (after the rollback the newer layout's maps
	// are still there, and the next rollout opens them without a
	// migration).
	return []rolloutPhase{
		steady,
		{"forward, SIGKILL", func(ctx context.Context) (string, error) {
			n := c.nodes[0]
			old, _ := c.agentPid(n)
			done := make(chan string, 1)
			go func() { done <- c.killMidMigration(ctx, n, old) }()
			what, err := roll(ctx, current)
			killed := <-done
			time.Sleep(settle)
			return killed + "; " + what + ", then " + settle.String(), err
		}},
		{"back", back},
		{"forward again", func(ctx context.Context) (string, error) {
			what, err := roll(ctx, current)
			time.Sleep(settle)
			return what + ", then " + settle.String(), err
		}},
	}
}

// killMidMigration waits for n's next agent (not pid old) and kills it
// with SIGKILL as soon as its migration's staging directory exists in the
// node's bpffs (or, when none shows within 20 s, then), and says what it did.
func (c *cluster) killMidMigration(ctx context.Context, n *node, old int) string {
	deadline := time.Now().Add(5 * time.Minute)
	var pid int
	for ; pid == 0 || pid == old; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "no new agent appeared on " + n.name
		}
		pid, _ = c.agentPid(n)
	}
	started := time.Now()
	staging := filepath.Join(fmt.Sprintf("/proc/%d/root", n.holder.cmd.Process.Pid), datapath.StagingMapsDir(datapath.DefaultPinRoot))
	seen := false
	for time.Since(started) < 20*time.Second {
		if _, err := os.Stat(staging); err == nil {
			seen = true
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Sprintf("kill -9 of %s's agent %d failed: %v", n.name, pid, err)
	}
	if seen {
		return fmt.Sprintf("%s's new agent (pid %d) killed with SIGKILL %s after the harness saw it start, its migration's staging maps present", n.name, pid, time.Since(started).Round(time.Millisecond))
	}
	return fmt.Sprintf("%s's new agent (pid %d) killed with SIGKILL %s after the harness saw it start; no migration seen (no staging maps)", n.name, pid, time.Since(started).Round(time.Millisecond))
}

// saveAgentLogs keeps the logs of the DaemonSet's agents (and of their
// previous containers: a killed one's) after a phase, in logs/agents-<phase>.
func (c *cluster) saveAgentLogs(phase string) {
	if c.o.cni != "ebpf-cni" {
		return
	}
	dir := filepath.Join(c.logs, "agents-"+strings.ReplaceAll(strings.ReplaceAll(phase, " ", "-"), ",", ""))
	os.MkdirAll(dir, 0o755)
	names, err := c.kubectl("-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=ebpf-cni", "-o", "jsonpath={.items[*].metadata.name}")
	if err != nil {
		return
	}
	for _, pod := range strings.Fields(names) {
		if out, err := c.kubectl("-n", "kube-system", "logs", pod, "-c", "agent"); err == nil {
			os.WriteFile(filepath.Join(dir, pod+".log"), []byte(out), 0o644)
		}
		if out, err := c.kubectl("-n", "kube-system", "logs", pod, "-c", "agent", "--previous"); err == nil {
			os.WriteFile(filepath.Join(dir, pod+".previous.log"), []byte(out), 0o644)
		}
	}
}
