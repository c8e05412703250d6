package main

// The throughput benchmark: iperf3 TCP throughput with 1 and 4
// parallel streams over
//
//   - raw: a bare veth pair between two namespaces (the physical limit: no
//     CNI, no forwarding, no NAT);
//   - pod to pod on one node, through ebpf-cni and through ptp;
//   - remote to hostPort: a "remote" netns routed to the node netns over a
//     veth (the node's uplink), the client dialling nodeIP:hostPort mapped to
//     the server pod, through ebpf-cni (portMappings) and ptp+portmap;
//
// every figure also as a ratio to the raw pair's median in the same run.
// Each plugin has a node netns (and ebpf-cni a pin directory) of its own, so
// neither sees the other's traffic. No pod has a bandwidth limit: neither
// configuration declares the bandwidth capability, and the benchmark checks
// that ebpf-cni's cni_bandwidth map is empty and no tbf qdisc exists.
//
// Rounds: each round measures every path with 1, then 4 streams, the order
// of the paths rotated per round, so drift and background load hit all
// alike. A measurement is a fresh `iperf3 -s -1` in the receiver and
// `iperf3 -c -t SECS -P STREAMS -J` in the sender (client pinned to CPU 0,
// server to CPU 1 with iperf3 -A); the figure is the
// receiver's (end.sum_received of the client's JSON, which iperf3 fills in
// from the server). iperf3's own CPU figures (client host_total, server
// remote_total) are kept, with the 1-minute load average at the start.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

const (
	tputPort     = 5201  // iperf3 in the server pod
	tputHostPort = 15201 // hostPort mapped to it
)

var (
	tputRawA = net.ParseIP("203.0.113.11").To4()
	tputRawB = net.ParseIP("203.0.113.12").To4()
)

// tputPath is one measured path.
type tputPath struct {
	key, label string
	client     ns.NetNS
	server     ns.NetNS
	addr       string // host:port the client dials
}

// tputEnv is the throughput benchmark's topology.
type tputEnv struct {
	paths []*tputPath
	// progs are ebpf-cni's pinned programs in the throughput node.
	progs map[string]*ebpf.Program
	// per configuration, for the no-limit check
	ebpf, ptp *config
}

// tputResults is the throughput part of the JSON results.
type tputResults struct {
	Seconds int      `json:"secondsPerRun"`
	Rounds  int      `json:"rounds"`
	Rounds4 int      `json:"roundsWith4Streams"`
	Paths   []string `json:"paths"`
	Labels  []string `json:"labels"`
	NoLimit string   `json:"noLimitCheck"`
	Calm    string   `json:"calm"`
	// BPFStats says whether BPF run-time statistics were on (they cost
	// two clock reads per program run, on every path alike).
	BPFStats string    `json:"bpfStats"`
	Runs     []tputRun `json:"runs"`
}

type tputRun struct {
	Path        string  `json:"path"`
	Streams     int     `json:"streams"`
	Round       int     `json:"round"`
	Bps         float64 `json:"receivedBitsPerSecond"`
	SentBps     float64 `json:"sentBitsPerSecond"`
	Retransmits int64   `json:"retransmits"`
	CPUClient   float64 `json:"cpuClientPct"`
	CPUServer   float64 `json:"cpuServerPct"`
	Load1       float64 `json:"load1AtStart"`
	// BPF is what ebpf-cni's programs cost during the run (ebpf-cni paths,
	// when the kernel's BPF run-time statistics could be enabled).
	BPF []progStat `json:"bpfPrograms,omitempty"`
	// BPFCPUPct is their total run time over the run's wall time.
	BPFCPUPct float64 `json:"bpfCpuPct,omitempty"`
	// Others is the mean number of other user tasks runnable during the
	// run (testenv.SampleOthers: threads in state R of processes other
	// than this benchmark and the two iperf3), i.e. other work competing
	// for the CPUs. A run with Others >= disturbedOthers is disturbed and
	// measured again at the end of the part (within -tput-reruns); the
	// less disturbed of the two counts, the other is kept here marked
	// superseded.
	Others     float64 `json:"otherRunnable"`
	Disturbed  bool    `json:"disturbed"`
	Rerun      bool    `json:"rerun,omitempty"`
	Superseded bool    `json:"superseded,omitempty"`
}

// disturbedOthers is the mean number of other runnable user tasks from
// which a throughput run counts as disturbed: another task runnable half
// of the time takes a share of a CPU from iperf3 on a small machine.
const disturbedOthers = 0.5

// progStat is one program's share of a run: BPF_ENABLE_STATS counters.
type progStat struct {
	Program   string  `json:"program"`
	Runs      uint64  `json:"runs"`
	RuntimeNs uint64  `json:"runtimeNs"`
	NsPerRun  float64 `json:"nsPerRun"`
}

// setupThroughput creates the raw pair, one node + remote + two pods per
// plugin, and the pods (untimed).
func (b *bench) setupThroughput() (*tputEnv, error) {
	e := &tputEnv{}
	rawA, err := b.newNetNS("tput-raw-a")
	if err != nil {
		return nil, err
	}
	rawB, err := b.newNetNS("tput-raw-b")
	if err != nil {
		return nil, err
	}
	if err := testenv.VethBetween(rawA, "eth0", tputRawA, rawB, "eth0", tputRawB); err != nil {
		return nil, fmt.Errorf("raw veth pair: %w", err)
	}
	e.paths = append(e.paths, &tputPath{key: "raw", label: "raw veth pair", client: rawA, server: rawB,
		addr: net.JoinHostPort(tputRawB.String(), strconv.Itoa(tputPort))})

	type plugin struct {
		name   string
		subnet *net.IPNet
		list   func(pin string) map[string]any
		p2p    string
		hp     string
	}
	for _, pl := range []plugin{
		{name: "ebpf", subnet: mustCIDR("10.246.0.0/16"), p2p: "ebpf-cni pod to pod", hp: "ebpf-cni remote to hostPort",
			list: func(pin string) map[string]any {
				return map[string]any{"plugins": []any{b.ebpfPlugin(mustCIDR("10.246.0.0/16"), pin, b.stateFor(pin), "portMappings")}}
			}},
		{name: "ptp", subnet: mustCIDR("10.245.0.0/16"), p2p: "ptp pod to pod", hp: "ptp+portmap remote to hostPort",
			list: func(string) map[string]any {
				return map[string]any{"plugins": []any{
					map[string]any{"type": "ptp", "ipMasq": false, "ipam": b.hostLocal(mustCIDR("10.245.0.0/16"))},
					map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
				}}
			}},
	} {
		node, err := b.newNode("tput-" + pl.name + "-node")
		if err != nil {
			return nil, err
		}
		remote, err := b.newNetNS("tput-" + pl.name + "-remote")
		if err != nil {
			return nil, err
		}
		if err := testenv.VethBetween(node, "uplink0", benchUplink4, remote, "eth0", benchRemote4); err != nil {
			return nil, fmt.Errorf("%s node uplink: %w", pl.name, err)
		}
		if err := testenv.RouteVia(remote, "eth0", benchUplink4); err != nil {
			return nil, err
		}
		c := &config{key: "tput-" + pl.name, netName: "bench-tput-" + pl.name, subnet: pl.subnet, node: node}
		c.label = map[string]string{"ebpf": "ebpf-cni (portMappings, no limit)", "ptp": "ptp+portmap"}[pl.name]
		if pl.name == "ebpf" {
			c.pinDir = b.newPinDir("tput")
			e.ebpf = c
		} else {
			e.ptp = c
		}
		c.list = pl.list(c.pinDir)
		if err := b.register(c); err != nil {
			return nil, err
		}
		// The server pod holds the hostPort; the client pod none.
		srv, err := b.newPod()
		if err != nil {
			return nil, err
		}
		capArgs := fmt.Sprintf(`{"portMappings":[{"hostPort":%d,"containerPort":%d,"protocol":"tcp"}]}`, tputHostPort, tputPort)
		_, out, _, err := b.cnitoolCap(c, "add", srv, capArgs)
		if err != nil {
			return nil, err
		}
		if err := b.checkAdd(c, srv, out); err != nil {
			return nil, err
		}
		srvIP, err := resultIP(out)
		if err != nil {
			return nil, err
		}
		cli, err := b.newPod()
		if err != nil {
			return nil, err
		}
		if _, out, _, err = b.cnitoolCap(c, "add", cli, ""); err != nil {
			return nil, err
		}
		if err := b.checkAdd(c, cli, out); err != nil {
			return nil, err
		}
		e.paths = append(e.paths,
			&tputPath{key: pl.name + "-p2p", label: pl.p2p, client: cli, server: srv,
				addr: net.JoinHostPort(srvIP.String(), strconv.Itoa(tputPort))},
			&tputPath{key: pl.name + "-hostport", label: pl.hp, client: remote, server: srv,
				addr: net.JoinHostPort(benchUplink4.String(), strconv.Itoa(tputHostPort))})
	}
	// Order: raw, the two pod-to-pod paths, the two hostPort paths.
	p := e.paths
	e.paths = []*tputPath{p[0], p[1], p[3], p[2], p[4]}
	return e, nil
}

// resultIP is the first IPv4 address of a CNI ADD result.
func resultIP(out []byte) (net.IP, error) {
	var r addResult
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, err
	}
	for _, ipc := range r.IPs {
		if ip, _, err := net.ParseCIDR(ipc.Address); err == nil && ip.To4() != nil {
			return ip.To4(), nil
		}
	}
	return nil, fmt.Errorf("no IPv4 address in the ADD result: %s", out)
}

// checkNoLimit proves no pod of the throughput benchmark is rate limited.
func (b *bench) checkNoLimit(e *tputEnv) (string, error) {
	m, err := datapath.OpenMaps(e.ebpf.pinDir)
	if err != nil {
		return "", fmt.Errorf("open ebpf-cni maps: %w", err)
	}
	limits, err := m.Bandwidth().ListLimits()
	m.Close()
	if err != nil {
		return "", err
	}
	if len(limits) > 0 {
		return "", fmt.Errorf("ebpf-cni has %d bandwidth limits in its maps", len(limits))
	}
	for _, n := range []ns.NetNS{e.ebpf.node, e.ptp.node} {
		err := n.Do(func(ns.NetNS) error {
			links, err := netlink.LinkList()
			if err != nil {
				return err
			}
			for _, l := range links {
				qs, err := netlink.QdiscList(l)
				if err != nil {
					return err
				}
				for _, q := range qs {
					if q.Type() == "tbf" {
						return fmt.Errorf("a tbf qdisc on %s", l.Attrs().Name)
					}
				}
			}
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	return "ebpf-cni: no bandwidth capability, cni_bandwidth empty; ptp+portmap: no bandwidth plugin, no tbf qdisc in either node", nil
}

func (b *bench) runThroughput(ctx context.Context, start time.Time) error {
	o := b.opts
	e, err := b.setupThroughput()
	if err != nil {
		return err
	}
	noLimit, err := b.checkNoLimit(e)
	if err != nil {
		return err
	}
	maxWait := 30 * time.Second
	if o.quick {
		maxWait = 10 * time.Second
	}
	waited, calm := testenv.WaitCalm(ctx, maxWait)
	calmNote := fmt.Sprintf("waited %s for no other runnable task (kernel threads included) before the first run", waited.Round(100*time.Millisecond))
	if !calm {
		calmNote = fmt.Sprintf("the machine was still busy after waiting %s", waited.Round(100*time.Millisecond))
	}
	logf("throughput: %s", calmNote)
	r := &tputResults{Seconds: o.tputSecs, Rounds: o.tputRounds, Rounds4: o.tputRoundsMulti, NoLimit: noLimit, Calm: calmNote, Runs: []tputRun{}}
	for _, p := range e.paths {
		r.Paths = append(r.Paths, p.key)
		r.Labels = append(r.Labels, p.label)
	}
	b.res.Throughput = r
	// Per-program run time, for "where the time goes". The statistics stay
	// on only while the returned fd is open.
	if st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err != nil {
		r.BPFStats = fmt.Sprintf("off (BPF_ENABLE_STATS: %v)", err)
	} else {
		defer st.Close()
		r.BPFStats = "on during the whole throughput part (BPF_ENABLE_STATS, closed at its end)"
		if e.progs, err = pinnedProgs(e.ebpf.pinDir); err != nil {
			return err
		}
		defer func() {
			for _, p := range e.progs {
				p.Close()
			}
		}()
	}
	logf("throughput: %d round(s) of %d paths with 1 stream, %d of them with 4 streams too, %d s each", o.tputRounds, len(e.paths), o.tputRoundsMulti, o.tputSecs)
	for round := 0; round < o.tputRounds; round++ {
		streamCounts := []int{1}
		if round < o.tputRoundsMulti {
			streamCounts = append(streamCounts, 4)
		}
		for _, streams := range streamCounts {
			for j := range e.paths {
				p := e.paths[(round+j)%len(e.paths)]
				if err := ctx.Err(); err != nil {
					return err
				}
				var before map[string]ebpf.ProgramStats
				if strings.HasPrefix(p.key, "ebpf") {
					before = progStats(e.progs)
				}
				run, err := b.iperf(ctx, p, streams)
				if err != nil {
					return fmt.Errorf("%s, %d streams: %w", p.label, streams, err)
				}
				run.Round = round + 1
				if before != nil {
					run.bpfDelta(before, progStats(e.progs), float64(o.tputSecs))
				}
				r.Runs = append(r.Runs, *run)
				run.log(p.label, start)
			}
		}
	}
	if err := b.rerunDisturbed(ctx, e, r, start); err != nil {
		return err
	}
	return b.teardownThroughput(e)
}

// teardownThroughput DELs the throughput pods and checks nothing is left.
func (b *bench) teardownThroughput(e *tputEnv) error {
	for _, p := range e.paths {
		if !strings.HasSuffix(p.key, "-p2p") {
			continue
		}
		c := e.ebpf
		if strings.HasPrefix(p.key, "ptp") {
			c = e.ptp
		}
		srvCap := fmt.Sprintf(`{"portMappings":[{"hostPort":%d,"containerPort":%d,"protocol":"tcp"}]}`, tputHostPort, tputPort)
		for _, pod := range []struct {
			n   ns.NetNS
			cap string
		}{{p.server, srvCap}, {p.client, ""}} {
			if _, _, _, err := b.cnitoolCap(c, "del", pod.n, pod.cap); err != nil {
				return err
			}
			if err := b.removePod(pod.n); err != nil {
				return err
			}
		}
		if err := b.assertClean(c); err != nil {
			return err
		}
	}
	return nil
}

// iperf runs one measurement over a path.
func (b *bench) iperf(ctx context.Context, p *tputPath, streams int) (*tputRun, error) {
	run := &tputRun{Path: p.key, Streams: streams, Load1: testenv.Load1()}
	// Client and server on CPUs of their own, the same for every path
	// (the receive path's softirq runs on the sender's CPU with veths).
	srvArgs := []string{"-s", "-1", "-J", "-p", strconv.Itoa(tputPort)}
	var cliAff []string
	if runtime.NumCPU() >= 2 {
		srvArgs = append(srvArgs, "-A", "1")
		cliAff = []string{"-A", "0"}
	}
	srv, err := b.procs.Start(ctx, p.server, "iperf3", srvArgs...)
	if err != nil {
		return nil, err
	}
	defer srv.Kill() // no-op once it exited
	if err := testenv.WaitListen(srv, tputPort); err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(p.addr)
	secs := b.opts.tputSecs
	cli, err := b.procs.Start(ctx, p.client, "iperf3", append([]string{"-c", host, "-p", port, "-t", strconv.Itoa(secs),
		"-P", strconv.Itoa(streams), "-J", "--connect-timeout", "5000"}, cliAff...)...)
	if err != nil {
		return nil, err
	}
	defer cli.Kill()
	others := testenv.SampleOthers(srv.Pid(), cli.Pid())
	err = cli.Wait(time.Duration(secs)*time.Second + 30*time.Second)
	run.Others = others()
	run.Disturbed = run.Others >= disturbedOthers
	if err != nil {
		return nil, fmt.Errorf("iperf3 client: %w", err)
	}
	if err := srv.Wait(15 * time.Second); err != nil {
		return nil, fmt.Errorf("iperf3 server: %w", err)
	}
	j, err := testenv.ParseIperf(cli.Stdout.Bytes(), "iperf3 client")
	if err != nil {
		return nil, err
	}
	run.Bps = j.End.SumReceived.BitsPerSecond
	run.SentBps = j.End.SumSent.BitsPerSecond
	if r := j.End.SumSent.Retransmits; r != nil {
		run.Retransmits = *r
	}
	run.CPUClient = j.End.CPUUtilization.HostTotal
	run.CPUServer = j.End.CPUUtilization.RemoteTotal
	if run.Bps <= 0 {
		return nil, fmt.Errorf("iperf3 received nothing:\n%s", testenv.Tail(cli.Stdout.String()))
	}
	return run, nil
}

// pinnedProgs opens every program pinned under pinDir.
func pinnedProgs(pinDir string) (map[string]*ebpf.Program, error) {
	pins := datapath.ProgramPins(pinDir)
	if len(pins) == 0 {
		return nil, fmt.Errorf("no programs pinned under %s", pinDir)
	}
	out := map[string]*ebpf.Program{}
	for _, e := range pins {
		p, err := ebpf.LoadPinnedProgram(e.Path, nil)
		if err != nil {
			continue
		}
		out[e.Name] = p
	}
	return out, nil
}

func progStats(progs map[string]*ebpf.Program) map[string]ebpf.ProgramStats {
	out := map[string]ebpf.ProgramStats{}
	for name, p := range progs {
		if st, err := p.Stats(); err == nil {
			out[name] = *st
		}
	}
	return out
}

// bpfDelta records what each program ran between two snapshots.
func (run *tputRun) bpfDelta(before, after map[string]ebpf.ProgramStats, secs float64) {
	var names []string
	for n := range after {
		names = append(names, n)
	}
	sort.Strings(names)
	var total uint64
	for _, n := range names {
		a, b := after[n], before[n]
		runs := a.RunCount - b.RunCount
		if runs == 0 {
			continue
		}
		ns := uint64(a.Runtime - b.Runtime)
		total += ns
		run.BPF = append(run.BPF, progStat{Program: n, Runs: runs, RuntimeNs: ns, NsPerRun: float64(ns) / float64(runs)})
	}
	run.BPFCPUPct = float64(total) / (secs * 1e9) * 100
}

func (run *tputRun) log(label string, start time.Time) {
	d := ""
	if run.Disturbed {
		d = " DISTURBED"
	}
	if run.Rerun {
		d += " (rerun)"
	}
	logf("  %-32s %d stream(s): %6.2f Gbit/s (retr %d, cpu client %.0f%% server %.0f%%, bpf %.1f%%, load %.1f, other runnable %.2f%s) (%s)",
		label, run.Streams, run.Bps/1e9, run.Retransmits, run.CPUClient, run.CPUServer, run.BPFCPUPct, run.Load1, run.Others, d,
		time.Since(start).Round(time.Second))
}

// rerunDisturbed measures disturbed runs again, single-stream runs first,
// within the -tput-reruns budget, each after waiting (up to 10 s) for the
// machine to calm down (testenv.WaitCalm).
func (b *bench) rerunDisturbed(ctx context.Context, e *tputEnv, r *tputResults, start time.Time) error {
	var idx []int
	for i, x := range r.Runs {
		if x.Disturbed {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(i, j int) bool {
		a, c := r.Runs[idx[i]], r.Runs[idx[j]]
		if a.Streams != c.Streams {
			return a.Streams < c.Streams
		}
		return a.Others > c.Others
	})
	if len(idx) > b.opts.tputReruns {
		idx = idx[:b.opts.tputReruns]
	}
	byKey := map[string]*tputPath{}
	for _, p := range e.paths {
		byKey[p.key] = p
	}
	for _, i := range idx {
		old := &r.Runs[i]
		if _, _ = testenv.WaitCalm(ctx, 10*time.Second); ctx.Err() != nil {
			return ctx.Err()
		}
		p := byKey[old.Path]
		var before map[string]ebpf.ProgramStats
		if strings.HasPrefix(p.key, "ebpf") {
			before = progStats(e.progs)
		}
		run, err := b.iperf(ctx, p, old.Streams)
		if err != nil {
			return fmt.Errorf("rerun of %s, %d streams: %w", p.label, old.Streams, err)
		}
		if before != nil {
			run.bpfDelta(before, progStats(e.progs), float64(b.opts.tputSecs))
		}
		run.Round, run.Rerun = old.Round, true
		run.log(p.label, start)
		old = &r.Runs[i] // no append yet: the pointer is valid
		if run.Others < old.Others {
			old.Superseded = true
		} else {
			run.Superseded = true
		}
		r.Runs = append(r.Runs, *run)
	}
	return nil
}
