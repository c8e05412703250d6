package main

// New connections per second through masquerade, inside the hostport part
// (issue 30): the newest pod of 1, 200 and 1000 on the node dials a server
// outside the node (outside4, on the remote's lo, over the node's uplink):
// ebpf-cni ipMasq (BPF SNAT at the uplink's egress) beside ptp ipMasq
// (iptables MASQUERADE, one chain and POSTROUTING rule per pod) and the
// routed baseline's pod dialling the same server with no translation and
// no programs (hostport.go). The pods are cheap: they only exist, with
// their veths and map entries or rules.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// masqPoint is one configuration at one population.
type masqPoint struct {
	Config        string    `json:"config"`
	Pods          int       `json:"pods"`
	ConnsPerSec   float64   `json:"connsPerSec"`
	ConnErrors    int64     `json:"connErrors"`
	RoutedPerSec  float64   `json:"routedConnsPerSec"`
	VsRouted      float64   `json:"vsRouted"`
	ConnSamples   []float64 `json:"connsPerSecSamples"`
	RoutedSamples []float64 `json:"routedConnsPerSecSamples"`
	Load1         float64   `json:"load1"`
	// SynRetrans: SYNs the pod retransmitted during the point's runs;
	// PAWS: SYNs the server refused in TIME_WAIT meanwhile (PAWSTimewait),
	// each a second lost (TestMasqServerTimeWait).
	SynRetrans uint64 `json:"podSynRetrans"`
	PAWS       uint64 `json:"serverPAWSTimewait"`
	// CPUPerConn and RoutedCPUPerConn: this process's CPU time (user and
	// system: the clients and the server, and the softirq work of their
	// packets, which runs in their context) per connection, medians of the
	// runs. On a machine other work loads, conn/s moves with the CPU left
	// to the bench; this moves with what a connection costs (round 15).
	CPUPerConn       float64 `json:"cpuUsPerConn"`
	RoutedCPUPerConn float64 `json:"routedCpuUsPerConn"`
	// Counters: ebpf-cni's masquerade counters after the point
	// (ebpf-agent dump nat; cumulative over the node's points).
	Counters map[string]uint64 `json:"counters,omitempty"`
}

// masqCounters reads ebpf-cni's masquerade counters of the node (nil on
// error: logged, not fatal).
func (b *bench) masqCounters(c *config) map[string]uint64 {
	var out []byte
	err := b.nodeOf(c).Do(func(ns.NetNS) error {
		cmd := exec.Command(filepath.Join(b.binDir, "ebpf-agent"), "dump", "nat", "-o", "json", "--pin-dir", b.pinOf(c), "--state-dir", b.stateOf(c))
		var err error
		out, err = cmd.Output()
		return err
	})
	var d struct {
		Counters map[string]uint64 `json:"counters"`
	}
	if err == nil {
		err = json.Unmarshal(out, &d)
	}
	if err != nil {
		logf("  masquerade counters: %v", err)
		return nil
	}
	logf("  masquerade counters: %v", d.Counters)
	return d.Counters
}

// masqConfigs are ptp with ipMasq and ebpf-cni with ipMasq, in that order.
func (b *bench) masqConfigs() []*config {
	ebpfNet := mustCIDR("10.236.0.0/16")
	ptpNet := mustCIDR("10.235.0.0/16")
	return []*config{
		{
			key: "ptp-masq", label: "ptp ipMasq (iptables)", netName: "bench-ptp-masq", subnet: ptpNet, hostPorts: true, node: b.hp.refNode,
			list: map[string]any{"plugins": []any{map[string]any{"type": "ptp", "ipMasq": true, "ipam": b.hostLocal(ptpNet)}}},
		},
		{
			key: "ebpf-masq", label: "ebpf-cni ipMasq", netName: "bench-ebpf-masq", subnet: ebpfNet, hostPorts: true,
			node: b.hp.ebpfNode, pinDir: b.hp.ebpfPin,
			list: map[string]any{"plugins": []any{map[string]any{
				"type": "ebpf-cni", "pinDir": b.hp.ebpfPin, "stateDir": b.stateFor(b.hp.ebpfPin), "ipam": b.hostLocal(ebpfNet), "maxPods": b.maxPods(),
				"ipMasq": true, "clusterCIDRs": []string{ebpfNet.String()},
			}}},
		},
	}
}

func isMasqConfig(c *config) bool { return strings.HasSuffix(c.key, "-masq") }

// masqScale measures c's masquerade at every -masq-scale point.
func (b *bench) masqScale(ctx context.Context, c *config, base hpBase, d time.Duration, start time.Time) error {
	o := b.opts
	pop := &population{b: b, c: c, ctx: ctx, caps: func(int) string { return "" }}
	for _, p := range o.masqScale {
		if err := pop.grow(p); err != nil {
			return err
		}
		// A server port of the point's own: the server keeps TIME_WAIT for
		// 60 s for every tuple it closed, and a new SYN on one of them from
		// another pod is refused unless its timestamps follow the last ones
		// (PAWS; the kernel's offset is per tuple), with MASQUERADE as in
		// BPF. The pods of the last point are not the newest pod's.
		b.masqSeq++
		port := 8000 + b.masqSeq
		srv, err := startServerOn(b.hp.remote, port)
		if err != nil {
			return err
		}
		target := net.JoinHostPort(outside4.String(), fmt.Sprint(port))
		// The newest pod dials: ptp's rule for it is the last of POSTROUTING.
		pod := pop.newest().pod
		var cpu, routedCPU []float64
		measure := func() (float64, int64, error) {
			c0 := procCPU()
			rate, f, err := connRate(ctx, pod, target, o.workers, d)
			if err == nil && rate == 0 {
				err = fmt.Errorf("no connection from %s to %s succeeded (%d failed)", pod.Path(), target, f)
			}
			cpu = append(cpu, cpuPerConn(c0, rate, d))
			return rate, f, err
		}
		routed := func() (float64, error) {
			c0 := procCPU()
			rate, err := base.routedOut(port)
			routedCPU = append(routedCPU, cpuPerConn(c0, rate, d))
			return rate, err
		}
		if c.isEBPF() {
			b.masqWait(ctx, c, pod, target)
		}
		syn0, paws0 := tcpExt(pod, "TCPSynRetrans")[0], tcpExt(b.hp.remote, "PAWSTimewait")[0]
		stats0 := b.progStats(c)
		rates, bases, failed, err := alternate(measure, routed)
		b.logProgStats(c, p, stats0)
		srv.close()
		if err != nil {
			return err
		}
		syn, paws := tcpExt(pod, "TCPSynRetrans")[0]-syn0, tcpExt(b.hp.remote, "PAWSTimewait")[0]-paws0
		rate, routedRate := testenv.Median(rates), testenv.Median(bases[0])
		pt := masqPoint{Config: c.key, Pods: p, ConnsPerSec: rate, ConnErrors: failed, RoutedPerSec: routedRate, VsRouted: rate / routedRate,
			ConnSamples: rates, RoutedSamples: bases[0], Load1: testenv.Load1(), SynRetrans: syn, PAWS: paws,
			CPUPerConn: testenv.Median(cpu), RoutedCPUPerConn: testenv.Median(routedCPU)}
		if c.isEBPF() {
			pt.Counters = b.masqCounters(c)
		}
		b.res.HostPort.Masq = append(b.res.HostPort.Masq, pt)
		logf("  masquerade %-22s %4d pods: %7.0f conn/s (routed, no masquerade %7.0f, %.2fx, %d failed, %d SYNs retransmitted, %d refused by PAWS), CPU %.1f us/conn (routed %.1f, %.2fx), load %.2f; node: %s; routed node: %s (%s)",
			c.label, p, rate, routedRate, pt.VsRouted, failed, syn, paws, pt.CPUPerConn, pt.RoutedCPUPerConn, pt.CPUPerConn/pt.RoutedCPUPerConn,
			pt.Load1, nfState(b.nodeOf(c)), nfState(b.hp.routedNode), time.Since(start).Round(time.Second))
	}
	return pop.removeAll()
}

// procCPU is this process's CPU time so far (user and system).
func procCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuPerConn is the CPU time since c0 per connection of a run of d at rate, in us.
func cpuPerConn(c0 time.Duration, rate float64, d time.Duration) float64 {
	if rate == 0 {
		return 0
	}
	return float64(procCPU()-c0) / float64(time.Microsecond) / (rate * d.Seconds())
}

// masqWait logs the point's namespaces and waits while -masq-hold's file
// exists (nothing without it).
func (b *bench) masqWait(ctx context.Context, c *config, pod ns.NetNS, target string) {
	if b.opts.masqHold == "" {
		return
	}
	logf("  masq-hold: pod %s, node %s, remote %s, routed pod %s, target %s, pin dir %s; waiting while %s exists",
		pod.Path(), b.nodeOf(c).Path(), b.hp.remote.Path(), b.hp.routedPod.Path(), target, b.pinOf(c), b.opts.masqHold)
	for {
		if _, err := os.Stat(b.opts.masqHold); err != nil || ctx.Err() != nil {
			return
		}
		time.Sleep(time.Second)
	}
}

// masqRows are the summary rows of the masquerade measurements.
func (r *results) masqRows() []testenv.Row {
	h := r.HostPort
	if h == nil {
		return nil
	}
	var rows []testenv.Row
	for _, cfg := range []string{"ebpf-masq", "ptp-masq"} {
		for _, pt := range h.Masq {
			if pt.Config != cfg {
				continue
			}
			rows = append(rows, connRowVsRouted("new connections/s via masquerade", r.labels[cfg],
				fmt.Sprintf("pod to outside, %s on the node, %d clients, %.0f s", plural(pt.Pods, "pod"), h.Workers, h.ConnSecs),
				pt.ConnSamples, "routed, no masquerade", pt.RoutedSamples, pt.Load1, cfg == "ebpf-masq"))
		}
	}
	return rows
}

// masqMarkdown renders the masquerade section of the report.
func (r *results) masqMarkdown() string {
	h := r.HostPort
	if h == nil || len(h.Masq) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## New connections through masquerade\n\n")
	fmt.Fprintf(&b, "New TCP connections per second from the newest pod of the node to a server outside it (%s, a port of each point's own, on the remote netns, over the node's uplink; dial, read 1 byte until the server's close, close; %d client goroutines, %d runs of %.0f s alternating with the routed baseline: a pod on a node netns of its own with no programs, dialling the same server by plain routing with no masquerade; medians).\n\n", outside4, h.Workers, connRounds, h.ConnSecs)
	fmt.Fprintf(&b, "| config | pods on the node | conn/s | routed conn/s | × routed | CPU µs/conn | routed CPU µs/conn | failed | SYNs retransmitted | SYNs refused by PAWS | load |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	pts := append([]masqPoint(nil), h.Masq...)
	sort.SliceStable(pts, func(i, j int) bool { return pts[i].Pods < pts[j].Pods })
	for _, p := range pts {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.0f | %.2f× | %.1f | %.1f | %d | %d | %d | %.1f |\n", r.labels[p.Config], p.Pods, p.ConnsPerSec, p.RoutedPerSec, p.VsRouted,
			p.CPUPerConn, p.RoutedCPUPerConn, p.ConnErrors, p.SynRetrans, p.PAWS, p.Load1)
	}
	return b.String()
}

// tcpExt reads TcpExt counters of a netns (/proc/net/netstat).
func tcpExt(n ns.NetNS, names ...string) []uint64 {
	var data []byte
	_ = n.Do(func(ns.NetNS) error {
		var err error
		data, err = os.ReadFile("/proc/thread-self/net/netstat") // the thread's netns, not the process's
		return err
	})
	out := make([]uint64, len(names))
	lines := strings.Split(string(data), "\n")
	for i := 0; i+1 < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "TcpExt:") || !strings.HasPrefix(lines[i+1], "TcpExt:") {
			continue
		}
		keys, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		for j := 1; j < len(keys) && j < len(vals); j++ {
			for k, name := range names {
				if keys[j] == name {
					out[k], _ = strconv.ParseUint(vals[j], 10, 64)
				}
			}
		}
	}
	return out
}

// masqProgStat is one program's kernel.bpf_stats_enabled counters.
type masqProgStat struct{ cnt, ns uint64 }

// progStats reads the run counters of every BPF program by name, with
// -bpf-stats on an ebpf-cni configuration (nil otherwise). Node-wide: the
// routed baseline runs no program, so what moves is the measured path's.
func (b *bench) progStats(c *config) map[string]masqProgStat {
	if !b.opts.bpfStats || !c.isEBPF() {
		return nil
	}
	out, err := exec.Command("bpftool", "prog", "show", "-j").Output()
	var progs []struct {
		Name string `json:"name"`
		Cnt  uint64 `json:"run_cnt"`
		Ns   uint64 `json:"run_time_ns"`
	}
	if err == nil {
		err = json.Unmarshal(out, &progs)
	}
	if err != nil {
		logf("  bpf stats: %v", err)
		return nil
	}
	m := map[string]masqProgStat{}
	for _, p := range progs {
		s := m[p.Name]
		m[p.Name] = masqProgStat{s.cnt + p.Cnt, s.ns + p.Ns}
	}
	return m
}

// logProgStats logs what each program ran since before (runs, ns per run).
func (b *bench) logProgStats(c *config, pods int, before map[string]masqProgStat) {
	if before == nil {
		return
	}
	var parts []string
	for name, s := range b.progStats(c) {
		d := masqProgStat{s.cnt - before[name].cnt, s.ns - before[name].ns}
		if d.cnt > 0 && strings.HasPrefix(name, "cni_") {
			parts = append(parts, fmt.Sprintf("%s %d runs %d ns", name, d.cnt, d.ns/d.cnt))
		}
	}
	sort.Strings(parts)
	logf("  bpf stats, %s %d pods (all runs of the point): %s", c.label, pods, strings.Join(parts, "; "))
}
