// Upgrades under traffic: pods of an earlier release keep every path
// (egress masquerade, hostPort, Services, pod to pod, their limits) while
// this build's plugin and agent take the node over, in either order.

package integration

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// Releases an upgrade starts from: the last with masquerade in the host
// veth program (map layout 1), and main before issue 28's fixes (layout 2).
var upgradeReleases = []struct{ name, commit string }{
	{"e383872", testenv.PreUplinkMasqCommit},
	{"41b58f6", testenv.PreIssue28Commit},
}

// TestUpgradeUnderTraffic: a node whose pods an earlier release attached (a
// masquerading pod with a UDP hostPort and an ingress limit, a plain pod, a
// pod with an egress limit) is taken over by this build, the plugin first (a DEL of an old
// pod, then an ADD) or the agent first (its start), from each release.
// Throughout, a numbered UDP datagram every 5 ms goes over every path of
// the old pods and is echoed back (and a numbered TCP message over an
// established masqueraded connection and a hostPort one, whose sender must
// retransmit nothing but spurious duplicates): egress masquerade to a host outside the
// cluster that has no route to pods (IPv4 and IPv6), a hostPort from that
// host (IPv4 and IPv6), a Service (kube-proxy's DNAT) and pod to pod (what
// the release had of these: e383872 masqueraded IPv4 only and had no
// Services path); the
// limited pod sends UDP at twice its limit to the outside host all along.
// Not one datagram may be lost, the limit must hold at every moment, and
// afterwards the new pod and the old ones work as before.
func TestUpgradeUnderTraffic(t *testing.T) {
	for _, rel := range upgradeReleases {
		for _, order := range []string{"plugin-first", "agent-first"} {
			t.Run(rel.name+"/"+order, func(t *testing.T) {
				upgradeUnderTraffic(t, rel.commit, order)
			})
		}
	}
}

// TestUpgradeUnderTrafficNoParts (attack13): TestUpgradeUnderTraffic from
// 41b58f6 (no per-pod tables, no flag), both orders, with
// HP_CFG_SF_NO_PARTS checked against cni_stack_flow_parts at the end.
func TestUpgradeUnderTrafficNoParts(t *testing.T) {
	for _, order := range []string{"plugin-first", "agent-first"} {
		t.Run(order, func(t *testing.T) { upgradeUnderTraffic(t, testenv.PreIssue28Commit, order) })
	}
}

func upgradeUnderTraffic(t *testing.T, commit, order string) {
	oldBin := testenv.BuildAt(t, commit)
	lab := newMasqLab(t)
	e := lab.a
	e.Extra["capabilities"] = map[string]bool{"portMappings": true, "bandwidth": true}
	newCNI := e.CNI
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, e.CacheDir, nil)

	addRT := func(pod ns.NetNS, id string, edit func(rt *libcni.RuntimeConf)) *current.Result {
		t.Helper()
		rt := e.RuntimeConf(pod, id, "eth0")
		rt.CapabilityArgs = map[string]any{}
		if edit != nil {
			edit(rt)
		}
		r, err := e.AddList(e.ConfList("1.0.0"), rt)
		if err != nil {
			t.Fatalf("ADD %s: %v", id, err)
		}
		return r
	}
	const hostPort, podPort = 8081, 81
	a, b, c, x := e.NewPod(), e.NewPod(), e.NewPod(), e.NewPod()
	for id, p := range map[string]ns.NetNS{"a": a, "b": b, "c": c, "x": x} {
		e.CleanupDel(p, id)
	}
	// a's ingress limit (far above the probes) puts this build's hostPort
	// delivery through its host veth's egress, into whichever build's
	// to-pod program runs there.
	ra := addRT(a, "a", func(rt *libcni.RuntimeConf) {
		rt.CapabilityArgs["portMappings"] = []testenv.PM{{HostPort: hostPort, ContainerPort: podPort, Protocol: "udp"},
			{HostPort: hostPort, ContainerPort: podPort, Protocol: "tcp"}}
		rt.CapabilityArgs["bandwidth"] = bandwidthArgs(50e6, 0)
	})
	rb := addRT(b, "b", nil)
	const limit = 20e6
	addRT(c, "c", func(rt *libcni.RuntimeConf) { rt.CapabilityArgs["bandwidth"] = bandwidthArgs(0, limit) })
	addRT(x, "x", nil)
	a4, a6 := testenv.PodIPs(t, ra)
	_ = rb

	// A Service: 10.96.0.10:80/udp -> a:81, kube-proxy's rules in the node.
	svc := svcPort{name: "up-udp", proto: "udp", clusterIP: svcWeb[4], port: 80, backend: a4, target: podPort}
	proxyModes[0].install(t, e.Node, 4, labCluster, []net.IP{labNodeA}, []svcPort{svc})

	echoUDP(t, lab.out, 7)
	echoUDP(t, a, podPort)
	echoTCP(t, lab.out, 7)
	echoTCP(t, a, podPort)
	var sink *net.UDPConn
	must(t, lab.out.Do(func(ns.NetNS) error {
		var err error
		sink, err = net.ListenUDP("udp4", &net.UDPAddr{IP: outsideIP, Port: 9})
		return err
	}))
	defer sink.Close()
	// Seconds are counted by the kernel's arrival stamps, not by when this
	// process gets to read (a loaded machine delays the reader).
	if raw, err := sink.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1) })
		raw.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) })
	}

	// What the kernel did to neighbours, routes, links and addresses, and
	// its counters: shown when a datagram is lost, to tell where.
	var watches []func() string
	for name, n := range map[string]ns.NetNS{"pod a": a, "pod b": b, "node": e.Node, "outside": lab.out} {
		watches = append(watches, watchNetns(t, name, n.Path()))
	}
	const every = 5 * time.Millisecond
	// Steps are logged at their number: the probe's datagram sent then.
	probesStart := time.Now()
	step := func(what string) { t.Logf("step at #%d: %s", time.Since(probesStart)/every, what) }
	probes := []*seqProbe{
		startProbe(t, "egress masquerade, IPv4", a, hp(outsideIP, 7), every),
		startProbeOver(t, "tcp", "egress masquerade, TCP, IPv4", a, hp(outsideIP, 7), every),
		startProbeOver(t, "tcp", "hostPort from outside, TCP, IPv4", lab.out, hp(labNodeA, hostPort), every),
	}
	// e383872 masqueraded IPv4 only, and sent a pod's replies to a pod of
	// the node around the stack, a Service's included (no stack flows yet):
	// paths it never had are not asked of its pods.
	if commit != testenv.PreUplinkMasqCommit {
		probes = append(probes,
			startProbe(t, "egress masquerade, IPv6", a, hp(outsideIP6, 7), every),
			startProbe(t, "Service (kube-proxy DNAT)", b, hp(svcWeb[4], 80), every))
	}
	probes = append(probes,
		startProbe(t, "hostPort from outside, IPv4", lab.out, hp(labNodeA, hostPort), every),
		startProbe(t, "hostPort from outside, IPv6", lab.out, hp(labNodeA6, hostPort), every),
		startProbe(t, "pod to pod", b, hp(a6, podPort), every),
	)
	for _, p := range probes {
		p.waitAnswered(t)
	}

	// c sends at twice its limit to the outside host all along; what
	// arrives must stay within the limit (plus its 50 ms burst) in every
	// second.
	var (
		perSec  []int64
		blastMu sync.Mutex
	)
	blastStop := make(chan struct{})
	blastDone := make(chan struct{})
	start := time.Now()
	go func() {
		buf, oob := make([]byte, 2048), make([]byte, 128)
		for {
			sink.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			n, oobn, _, _, err := sink.ReadMsgUDP(buf, oob)
			select {
			case <-blastDone:
				return
			default:
			}
			if err != nil {
				continue
			}
			at := time.Now()
			if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range msgs {
					if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= 16 {
						ts := (*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
						at = time.Unix(ts.Unix())
					}
				}
			}
			s := int(at.Sub(start) / time.Second)
			if s < 0 {
				s = 0
			}
			blastMu.Lock()
			for len(perSec) <= s {
				perSec = append(perSec, 0)
			}
			perSec[s] += int64(n)
			blastMu.Unlock()
		}
	}()
	go func() {
		c.Do(func(ns.NetNS) error {
			conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: outsideIP, Port: 9})
			if err != nil {
				return err
			}
			defer conn.Close()
			buf := make([]byte, 1400)
			gap := time.Duration(float64(len(buf)*8) / (2 * limit) * float64(time.Second))
			next := time.Now()
			for {
				select {
				case <-blastStop:
					return nil
				default:
				}
				conn.Write(buf)
				next = next.Add(gap)
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
			}
		})
	}()

	time.Sleep(time.Second)
	var agent *testenv.AgentProc
	startAgent := func() {
		step("agent start")
		agent = e.StartAgent(e.WriteConfDir())
		step("agent started")
	}
	var d ns.NetNS
	newPodSteps := func() {
		e.CNI = newCNI
		step("DEL x")
		e.MustDel(x, "x") // an old pod goes: this build's first verb
		step("DEL x done")
		time.Sleep(500 * time.Millisecond)
		d = e.NewPod()
		e.CleanupDel(d, "d")
		step("ADD d")
		rd := e.Add(d, "d") // a new pod with ipMasq: the node hooks
		step("ADD d done")
		d4, _ := testenv.PodIPs(t, rd)
		time.Sleep(500 * time.Millisecond)
		must(t, testenv.Ping(d, outsideIP, 2))
		must(t, testenv.Ping(b, d4, 1))
	}
	if order == "plugin-first" {
		newPodSteps()
		time.Sleep(time.Second)
		startAgent()
	} else {
		startAgent()
		time.Sleep(time.Second)
		newPodSteps()
	}
	time.Sleep(1500 * time.Millisecond)

	close(blastStop)
	var failed []string
	for _, p := range probes {
		sent, lost, retrans := p.finish()
		t.Logf("%s: %d sent, %d lost, %d retransmitted (%d, %d of them reported as duplicates)", p.name, sent, len(lost), retrans, p.rawRetrans, p.dsack)
		if len(p.errs) > 0 {
			t.Logf("%s: its socket's errors: %v", p.name, p.errs)
		}
		if len(lost) > 0 || retrans > 0 {
			failed = append(failed, fmt.Sprintf("%s: %d of %d lost (numbers %v, %v apart), %d retransmitted%s", p.name, len(lost), sent, span(lost), every, retrans, p.where(lost, probesStart, every)))
		}
	}
	close(blastDone)
	blastMu.Lock()
	secs := perSec
	blastMu.Unlock()
	maxPerSec := limit/8 + limit/8*0.05 // the rate and the 50 ms bucket
	var worst int64
	for i, n := range secs {
		if i > 0 && i < len(secs)-1 { // whole seconds only
			worst = max(worst, n)
		}
	}
	t.Logf("limited pod at 2x its %.0f Mbit/s limit: %d whole seconds, worst %.1f Mbit/s", limit/1e6, max(len(secs)-2, 0), float64(worst)*8/1e6)
	if float64(worst) > 1.1*maxPerSec {
		failed = append(failed, fmt.Sprintf("the limited pod's egress reached %.1f Mbit/s in one second, over its %.0f Mbit/s limit", float64(worst)*8/1e6, limit/1e6))
	}
	if worst == 0 {
		failed = append(failed, "nothing of the limited pod's blast arrived")
	}
	if len(failed) > 0 {
		var diag []string
		for _, w := range watches {
			diag = append(diag, w())
		}
		// The programs' own counters: a drop they made names its reason.
		stats, err := e.AgentCmd(append([]string{"dump", "stats"}, e.AgentArgs(e.WriteConfDir())...)...)
		diag = append(diag, fmt.Sprintf("--- dump stats (%v)\n%s", err, stats))
		t.Errorf("across the upgrade from %s (%s):\n  %s\nagent log:\n%s\n%s", commit[:7], order, strings.Join(failed, "\n  "), agent.Logs(), strings.Join(diag, "\n"))
	}

	// attack13: the "no per-pod tables" flag follows the tables the
	// upgrade left, with the new pod's and the old ones' traffic run.
	wantPartsLookedUp(t, e.Maps())

	// This build tears it all down.
	agent.Stop()
	for id, p := range map[string]ns.NetNS{"a": a, "b": b, "c": c, "d": d} {
		e.MustDel(p, id)
	}
	e.AssertNoHostPorts()
	e.AssertClean()
}

// watchNetns records `ip monitor` of the namespace at path from now on;
// the function returned gives it, with the namespace's nstat counters
// (those that are not zero).
func watchNetns(t *testing.T, name, path string) func() string {
	t.Helper()
	var buf bytes.Buffer
	var mu sync.Mutex
	cmd := exec.Command("nsenter", "--net="+path, "ip", "-ts", "monitor", "neigh", "route", "link", "addr")
	w := &lockedWriter{mu: &mu, w: &buf}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatalf("ip monitor in %s: %v", name, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return func() string {
		// Counters that are not zero (a drop shows as one), and the links'
		// own: a frame dropped for its destination MAC (otherhost) or by
		// a full queue counts there only.
		out, _ := exec.Command("nsenter", "--net="+path, "nstat", "-as").CombinedOutput()
		links, _ := exec.Command("nsenter", "--net="+path, "ip", "-s", "-s", "link").CombinedOutput()
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("--- %s: ip monitor\n%s--- %s: nstat\n%s--- %s: links\n%s", name, buf.String(), name, out, name, links)
	}
}

// span is the first and last of a sorted list of numbers.
func span(ns []uint32) string {
	if len(ns) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d-%d", ns[0], ns[len(ns)-1])
}

// TestUpgradeMixedBuilds holds the upgrade at every link it moves (the
// crashpoint build's pause, 300 ms each), so that each state the node
// passes through on its way from the release's programs to this build's
// (the uplinks moved and no pod; some pods moved and not others; one of a
// pod's two links moved) lasts long enough for traffic to meet it: an
// upgrade normally passes through them in microseconds. Every path of the
// pods, both families, must lose nothing in any of them. (The 2-4 IPv6
// datagrams these tests once lost, numbers 257 on, were lost before the
// upgrade began, in the lab: see the end of newMasqLab.)
func TestUpgradeMixedBuilds(t *testing.T) {
	for _, rel := range upgradeReleases {
		t.Run(rel.name, func(t *testing.T) { upgradeMixedBuilds(t, rel.commit, false) })
	}
}

// TestUpgradeDaemonSetCaps: the agent that takes the node over runs with
// the DaemonSet's capabilities alone (NET_ADMIN, BPF, PERFMON: no
// SYS_ADMIN, so no program by ID). Before the fix its migration could not
// name the programs of the uplink and cgroup links the release attached:
// it exited ("not every attachment moved"), its restart left those links
// on the release's programs over the release's maps, and the pods' cls_bpf
// filters were never moved to tcx (seen in the k8s harness's rollout run).
// Now every link moves, the release's maps go, and nothing is lost.
func TestUpgradeDaemonSetCaps(t *testing.T) {
	upgradeMixedBuilds(t, testenv.PreIssue28Commit, true)
}

// daemonSetAgent is the agent started with only the DaemonSet's
// capabilities (deploy/ebpf-cni.yaml), as root (uid 0) there.
func daemonSetAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ebpf-agent")
	script := fmt.Sprintf("#!/bin/sh\nexec setpriv --bounding-set=-all,+net_admin,+bpf,+perfmon --inh-caps=-all -- %s \"$@\"\n",
		filepath.Join(testenv.BinDir, "ebpf-agent"))
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func upgradeMixedBuilds(t *testing.T, commit string, daemonSetCaps bool) {
	oldBin := testenv.BuildAt(t, commit)
	lab := newMasqLab(t)
	e := lab.a
	e.Extra["capabilities"] = map[string]bool{"portMappings": true, "bandwidth": true}
	newCNI := e.CNI
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, e.CacheDir, nil)
	const hostPort, podPort = 8081, 81
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "a")
	e.CleanupDel(b, "b")
	rt := e.RuntimeConf(a, "a", "eth0")
	rt.CapabilityArgs = map[string]any{
		"portMappings": []testenv.PM{{HostPort: hostPort, ContainerPort: podPort, Protocol: "udp"}},
		"bandwidth":    bandwidthArgs(50e6, 0),
	}
	ra, err := e.AddList(e.ConfList("1.0.0"), rt)
	if err != nil {
		t.Fatalf("ADD a: %v", err)
	}
	rb := e.Add(b, "b")
	a4, a6 := testenv.PodIPs(t, ra)
	b4, b6 := testenv.PodIPs(t, rb)
	echoUDP(t, a, podPort)
	echoUDP(t, b, podPort)
	echoUDP(t, lab.out, 7)

	var watches []func() string
	for name, n := range map[string]ns.NetNS{"pod a": a, "pod b": b, "node": e.Node, "outside": lab.out} {
		watches = append(watches, watchNetns(t, name, n.Path()))
	}
	const every = 5 * time.Millisecond
	probesStart := time.Now()
	probes := []*seqProbe{
		startProbe(t, "hostPort from outside, IPv4", lab.out, hp(labNodeA, hostPort), every),
		startProbe(t, "hostPort from outside, IPv6", lab.out, hp(labNodeA6, hostPort), every),
		startProbe(t, "pod to pod b->a, IPv4", b, hp(a4, podPort), every),
		startProbe(t, "pod to pod b->a, IPv6", b, hp(a6, podPort), every),
		startProbe(t, "pod to pod a->b, IPv4", a, hp(b4, podPort), every),
		startProbe(t, "pod to pod a->b, IPv6", a, hp(b6, podPort), every),
		startProbe(t, "egress masquerade, IPv4", a, hp(outsideIP, 7), every),
	}
	if commit != testenv.PreUplinkMasqCommit {
		probes = append(probes, startProbe(t, "egress masquerade, IPv6", a, hp(outsideIP6, 7), every))
	}
	for _, p := range probes {
		p.waitAnswered(t)
	}
	time.Sleep(500 * time.Millisecond)

	// This build's agent migrates the node, pausing after the uplinks and
	// after each pod link it moves.
	start := time.Now()
	t.Logf("agent start at step #%d", start.Sub(probesStart)/every)
	var agent *testenv.AgentProc
	if daemonSetCaps {
		agent = e.StartAgentBin(daemonSetAgent(t), nil, e.WriteConfDir(), "--metrics-addr", "")
	} else {
		agent = e.StartAgentBin(crashAgent(t), []string{"EBPF_CNI_PAUSE_AT=upgrade-link", "EBPF_CNI_PAUSE=300ms"}, e.WriteConfDir(), "--metrics-addr", "")
	}
	defer agent.Stop()
	for !strings.Contains(agent.Logs(), "datapath ready") {
		if time.Since(start) > time.Minute {
			t.Fatalf("the agent did not get ready in a minute:\n%s", agent.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("migration: %s (ready at step #%d)", time.Since(start).Round(time.Millisecond), time.Since(probesStart)/every)
	time.Sleep(time.Second)
	if daemonSetCaps {
		logs := agent.Logs()
		if old := datapath.OlderLayoutDirs(e.PinDir); strings.Contains(logs, "not permitted") || len(old) > 0 {
			t.Errorf("the agent with the DaemonSet's capabilities did not move every link and remove the release's maps (%v left):\n%s", old, logs)
		}
		// A pod added now gets cls_bpf filters (the agent runs), which the
		// agent moves to tcx links: the program its filter runs, opened
		// without SYS_ADMIN.
		e.CNI = newCNI
		d := e.NewPod()
		e.CleanupDel(d, "d")
		e.Add(d, "d")
		host := state.HostIfName("d", "eth0")
		for _, dir := range []string{datapath.DirIngress, datapath.DirEgress} {
			pin := datapath.LinkPinPath(e.PinDir, host, dir)
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				if _, err := os.Stat(pin); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the agent with the DaemonSet's capabilities did not move pod d's %s hook to tcx (no %s) in 20 s:\n%s", dir, pin, agent.Logs())
				}
			}
		}
		e.MustDel(d, "d")
	}

	var failed []string
	for _, p := range probes {
		sent, lost, _ := p.finish()
		t.Logf("%s: %d sent, %d lost", p.name, sent, len(lost))
		if len(p.errs) > 0 {
			t.Logf("%s: its socket's errors: %v", p.name, p.errs)
		}
		if len(lost) > 0 {
			failed = append(failed, fmt.Sprintf("%s: %d of %d lost (numbers %v)%s", p.name, len(lost), sent, lost, p.where(lost, probesStart, every)))
		}
	}
	if len(failed) > 0 {
		var diag []string
		for _, w := range watches {
			diag = append(diag, w())
		}
		stats, err := e.AgentCmd(append([]string{"dump", "stats"}, e.AgentArgs(e.WriteConfDir())...)...)
		diag = append(diag, fmt.Sprintf("--- dump stats (%v)\n%s", err, stats))
		t.Errorf("pods of %s while this build's agent moved them link by link:\n  %s\nagent log:\n%s\n%s",
			commit[:7], strings.Join(failed, "\n  "), agent.Logs(), strings.Join(diag, "\n"))
	}
	agent.Stop()
	e.CNI = newCNI
	e.MustDel(a, "a")
	e.MustDel(b, "b")
	e.AssertNoHostPorts()
	e.AssertClean()
}
