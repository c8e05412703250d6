// Upgrades under traffic: pods of an earlier release keep every path
// (egress masquerade, hostPort, Services, pod to pod, their limits) while
// this build's plugin and agent take the node over, in either order.

package integration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
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

// echoUDP answers every datagram to port on all addresses of netns with
// itself, until the test ends.
func echoUDP(t *testing.T, netns ns.NetNS, port int) {
	t.Helper()
	for _, fam := range []string{"4", "6"} {
		var c *net.UDPConn
		must(t, netns.Do(func(ns.NetNS) error {
			var err error
			c, err = net.ListenUDP("udp"+fam, &net.UDPAddr{Port: port})
			return err
		}))
		t.Cleanup(func() { c.Close() })
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := c.ReadFromUDP(buf)
				if err != nil {
					return
				}
				c.WriteToUDP(buf[:n], from)
			}
		}()
	}
}

// seqProbe sends a numbered datagram every interval over one UDP flow
// (one socket, one source port: an established flow) and counts the
// echoes: every number without one was lost on the way there or back.
type seqProbe struct {
	name string
	c    net.Conn
	tcp  bool // a TCP stream: the echoes come back as a stream
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	sent uint32
	got  map[uint32]bool
	// TCP, once stopped: retransmitted segments, and duplicates the
	// receiver reported (DSACK).
	rawRetrans, dsack uint32
	// Errors of the probe's own socket, with the number they hit: a
	// datagram that never left (ENOBUFS, an ICMP error reported on the next
	// send) is told apart from one the path lost.
	errs []string
}

func startProbe(t *testing.T, name string, from ns.NetNS, dst string, interval time.Duration) *seqProbe {
	t.Helper()
	return startProbeOver(t, "udp", name, from, dst, interval)
}

// startProbeOver is startProbe over network "udp" or "tcp" (one
// connection, to an echo server; a lost segment shows as a retransmission).
func startProbeOver(t *testing.T, network, name string, from ns.NetNS, dst string, interval time.Duration) *seqProbe {
	t.Helper()
	p := &seqProbe{name: name, tcp: network == "tcp", stop: make(chan struct{}), done: make(chan struct{}), got: map[uint32]bool{}}
	must(t, from.Do(func(ns.NetNS) error {
		var err error
		p.c, err = net.DialTimeout(network, dst, 3*time.Second)
		return err
	}))
	t.Cleanup(func() { p.c.Close() })
	go func() {
		buf := make([]byte, 32)
		for {
			var (
				n   int
				err error
			)
			if p.tcp {
				n, err = io.ReadFull(p.c, buf)
			} else {
				n, err = p.c.Read(buf)
			}
			if err != nil {
				if ne, ok := err.(net.Error); ok && !p.tcp && !ne.Timeout() && !strings.Contains(err.Error(), "closed") {
					// UDP: an ICMP error reported on a read; the flow goes on.
					p.mu.Lock()
					p.errs = append(p.errs, fmt.Sprintf("read after #%d: %v", p.sent, err))
					p.mu.Unlock()
					continue
				}
				return
			}
			if n >= 4 {
				p.mu.Lock()
				p.got[binary.BigEndian.Uint32(buf)] = true
				p.mu.Unlock()
			}
		}
	}()
	go func() {
		defer close(p.done)
		tk := time.NewTicker(interval)
		defer tk.Stop()
		msg := make([]byte, 32)
		for {
			select {
			case <-p.stop:
				return
			case <-tk.C:
			}
			p.mu.Lock()
			p.sent++
			binary.BigEndian.PutUint32(msg, p.sent)
			p.mu.Unlock()
			if _, err := p.c.Write(msg); err != nil {
				p.mu.Lock()
				p.errs = append(p.errs, fmt.Sprintf("write #%d: %v", binary.BigEndian.Uint32(msg), err))
				p.mu.Unlock()
			}
		}
	}()
	return p
}

// waitAnswered waits until the probe got its first echo.
func (p *seqProbe) waitAnswered(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		p.mu.Lock()
		n := len(p.got)
		p.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe %s: no echo in 5 s", p.name)
		}
	}
}

// finish stops sending, waits a second for the last echoes and returns how
// many were sent, which numbers were lost, and (TCP) how many segments the
// sender retransmitted because one was lost: its retransmissions less those
// the receiver reported as duplicates (DSACK), the tail loss probes and
// timeouts a stalled, loaded machine fires although nothing was lost.
func (p *seqProbe) finish() (sent uint32, lost []uint32, retrans uint32) {
	close(p.stop)
	<-p.done
	time.Sleep(time.Second)
	if p.tcp {
		if raw, err := p.c.(*net.TCPConn).SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) {
				if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
					p.rawRetrans, p.dsack = info.Total_retrans, info.Dsack_dups
					if info.Total_retrans > info.Dsack_dups {
						retrans = info.Total_retrans - info.Dsack_dups
					}
				}
			})
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Numbers before the first echo went out while the path was still
	// being resolved (neighbour discovery), before the upgrade began
	// (waitAnswered): not counted.
	first := p.sent + 1
	for i := range p.got {
		first = min(first, i)
	}
	for i := first; i <= p.sent; i++ {
		if !p.got[i] {
			lost = append(lost, i)
		}
	}
	return p.sent - (first - 1), lost, retrans
}

// echoTCP echoes every connection to port on all addresses of netns.
func echoTCP(t *testing.T, netns ns.NetNS, port int) {
	t.Helper()
	for _, fam := range []string{"4", "6"} {
		var ln net.Listener
		must(t, netns.Do(func(ns.NetNS) error {
			var err error
			ln, err = net.Listen("tcp"+fam, fmt.Sprintf(":%d", port))
			return err
		}))
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() })
				go io.Copy(c, c)
			}
		}()
	}
}

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
			failed = append(failed, fmt.Sprintf("%s: %d of %d lost (numbers %v, %v apart), %d retransmitted", p.name, len(lost), sent, span(lost), every, retrans))
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
		t.Errorf("across the upgrade from %s (%s):\n  %s\nagent log:\n%s\n%s", commit[:7], order, strings.Join(failed, "\n  "), agent.Logs(), strings.Join(diag, "\n"))
	}

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
		out, _ := exec.Command("nsenter", "--net="+path, "nstat", "-asz").CombinedOutput()
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("--- %s: ip monitor\n%s--- %s: nstat\n%s", name, buf.String(), name, out)
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
// upgrade normally passes through them in microseconds, and only a
// preempted upgrade on a loaded machine lets a datagram in (the flake of
// TestUpgradeUnderTraffic/e383872/plugin-first: 2 hostPort IPv6 and 1 pod to
// pod IPv6 datagrams lost). Every path of the pods, both families, must
// lose nothing in any of them.
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
	t.Logf("migration: %s", time.Since(start).Round(time.Millisecond))
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
			failed = append(failed, fmt.Sprintf("%s: %d of %d lost (numbers %v)", p.name, len(lost), sent, lost))
		}
	}
	if len(failed) > 0 {
		var diag []string
		for _, w := range watches {
			diag = append(diag, w())
		}
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
