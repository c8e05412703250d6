package main

// The memory benchmark:
//
//   - plugin peak RSS per ADD (and DEL): every plugin binary is reached
//     through a wrapper script in a CNI_PATH of its own, which execs
//     `/usr/bin/time -f %M` on the real binary. %M is ru_maxrss of wait4(),
//     i.e. the larger of the process's own peak and that of the descendants
//     it waited for: for ebpf-cni and ptp that includes the host-local they
//     exec (host-local is wrapped too, so its own peak is reported beside).
//     Pods of ebpf-cni with hostPort + bandwidth, and of the reference chain
//     ptp+portmap+bandwidth with the same runtimeConfig, each in a node netns
//     of its own.
//   - agent RSS: `ebpf-agent run --metrics-addr ""` in the node netns, with 0
//     pods (it loads and pins the datapath itself) and with N pods; VmRSS and
//     VmHWM from /proc/PID/status after it has logged "datapath ready" and run
//     a few more seconds.
//   - map memory: every map pinned in the node's pin directory is opened and
//     its memlock read from fdinfo (cilium/ebpf MapInfo.Memlock; since kernel
//     6.4 this is the map's actual memory use, map_mem_usage), with 0 pods
//     (after the agent pinned the datapath) and with N pods, the maps sized
//     for the default maxPods. Fixed cost = the sum at 0 pods; per pod = (sum
//     at N - sum at 0) / N: the maps that are not preallocated (cni_stats,
//     cni_cidr_refs, the LPM trie) grow with their entries, the others are
//     spent up front (the entries a pod occupies in them, key + value size,
//     value per CPU for per-CPU maps, are reported beside). And the sum
//     extrapolated to 64 and 192 possible CPUs, with the entries of N pods
//     and with every map full, by pkg/maps' model of the kernel's
//     accounting (which TestFootprint checks against the kernel to the byte).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

const (
	gnuTime      = "/usr/bin/time"
	memPortBase  = 30000
	memChainPort = 31000
)

// memResults is the memory part of the JSON results.
type memResults struct {
	Pods        int           `json:"pods"`
	RefPods     int           `json:"referencePods"`
	PluginRSS   []rssSample   `json:"pluginRSS"`
	Agent       []agentSample `json:"agent"`
	Maps        []mapMem      `json:"maps"`
	FixedBytes  uint64        `json:"fixedMapBytes"`
	TotalBytesN uint64        `json:"mapBytesAtN"`
	PerPodBytes float64       `json:"mapBytesPerPod"`
	// PerPodEntryBytes is the key+value bytes of the entries a pod adds.
	PerPodEntryBytes float64 `json:"entryBytesPerPod"`
	CPUs             int     `json:"possibleCPUs"`
	// Projected is the maps' memlock on nodes of other CPU counts.
	Projected []cpuProjection `json:"projected"`
}

// cpuProjection is the sum of the maps' memlock on a node with CPUs
// possible CPUs: with the entries of the N pods, and with every map full.
type cpuProjection struct {
	CPUs      int    `json:"possibleCPUs"`
	AtNBytes  uint64 `json:"bytesAtN"`
	FullBytes uint64 `json:"bytesFull"`
}

type rssSample struct {
	Binary string `json:"binary"`
	Verb   string `json:"verb"`
	MaxKB  int64  `json:"maxRssKB"`
}

type agentSample struct {
	Pods    int     `json:"pods"`
	VmRSSKB int64   `json:"vmRssKB"`
	VmHWMKB int64   `json:"vmHwmKB"`
	Seconds float64 `json:"secondsAfterReady"`
	Samples []int64 `json:"vmRssSamplesKB"`
}

type mapMem struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	KeySize    uint32 `json:"keySize"`
	ValueSize  uint32 `json:"valueSize"`
	MaxEntries uint32 `json:"maxEntries"`
	Flags      uint32 `json:"flags"`
	Memlock0   uint64 `json:"memlockAt0"`
	MemlockN   uint64 `json:"memlockAtN"`
	Entries0   int    `json:"entriesAt0"`
	EntriesN   int    `json:"entriesAtN"`
}

// memEnv is the memory benchmark's configurations.
type memEnv struct {
	ebpf, chain *config
	rssLog      string
}

func (b *bench) setupMemory() (*memEnv, error) {
	if _, err := os.Stat(gnuTime); err != nil {
		return nil, fmt.Errorf("%s is needed for the plugin RSS (apt-get install time; make deps-bench does): %w", gnuTime, err)
	}
	dir := filepath.Join(b.root, "mem")
	e := &memEnv{rssLog: filepath.Join(dir, "rss.log")}
	wrap := filepath.Join(dir, "wrap")
	state := filepath.Join(dir, "state")
	conf := filepath.Join(dir, "net.d")
	for _, d := range []string{wrap, state, conf} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	for _, bin := range []string{"ebpf-cni", "host-local", "ptp", "portmap", "bandwidth"} {
		script := fmt.Sprintf("#!/bin/sh\nexec %s -q -a -o %s -f \"rss %s ${CNI_COMMAND:-none} %%M\" %s \"$@\"\n",
			gnuTime, e.rssLog, bin, filepath.Join(b.binDir, bin))
		if err := os.WriteFile(filepath.Join(wrap, bin), []byte(script), 0o700); err != nil {
			return nil, err
		}
	}
	node, err := b.newNode("mem-ebpf-node")
	if err != nil {
		return nil, err
	}
	refNode, err := b.newNode("mem-chain-node")
	if err != nil {
		return nil, err
	}
	ebpfNet, chainNet := mustCIDR("10.244.0.0/16"), mustCIDR("10.243.0.0/16")
	e.ebpf = &config{key: "mem-ebpf", label: "ebpf-cni +hostPort+bandwidth", netName: "bench-mem-ebpf", subnet: ebpfNet,
		node: node, pinDir: b.newPinDir("mem"), stateDir: state, cniPath: wrap, confDir: conf}
	e.ebpf.list = map[string]any{"plugins": []any{b.ebpfPlugin(ebpfNet, e.ebpf.pinDir, state, "portMappings", "bandwidth")}}
	e.chain = &config{key: "mem-chain", label: "ptp+portmap+bandwidth", netName: "bench-mem-chain", subnet: chainNet,
		node: refNode, cniPath: wrap,
		list: map[string]any{"plugins": []any{
			map[string]any{"type": "ptp", "ipMasq": false, "ipam": b.hostLocal(chainNet)},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
			map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}},
		}}}
	for _, c := range []*config{e.ebpf, e.chain} {
		if err := b.register(c); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// memCapArgs is a pod's runtimeConfig: one hostPort, 100 Mbit/s each way.
func memCapArgs(port int) string {
	return fmt.Sprintf(`{"portMappings":[{"hostPort":%d,"containerPort":80,"protocol":"tcp"}],`+
		`"bandwidth":{"ingressRate":100000000,"ingressBurst":1000000,"egressRate":100000000,"egressBurst":1000000}}`, port)
}

func (b *bench) runMemory(ctx context.Context, start time.Time) error {
	o := b.opts
	e, err := b.setupMemory()
	if err != nil {
		return err
	}
	r := &memResults{Pods: o.memPods, RefPods: o.n, CPUs: possibleCPUs()}
	b.res.Memory = r

	// The agent comes first on this node: it loads and pins the datapath.
	a0, err := b.agentRSS(ctx, e.ebpf, 0)
	if err != nil {
		return err
	}
	r.Agent = append(r.Agent, a0)
	logf("memory: agent with 0 pods: VmRSS %d KiB, VmHWM %d KiB", a0.VmRSSKB, a0.VmHWMKB)
	at0, err := mapMemory(e.ebpf.pinDir)
	if err != nil {
		return err
	}

	pods := make([]ns.NetNS, o.memPods)
	logf("memory: adding %d ebpf-cni pods with a hostPort and a 100 Mbit/s limit each", o.memPods)
	err = parallel(ctx, o.memPods, 2, func(i int) error {
		pod, err := b.newPod()
		if err != nil {
			return err
		}
		pods[i] = pod
		_, out, _, err := b.cnitoolCap(e.ebpf, "add", pod, memCapArgs(memPortBase+i))
		if err != nil {
			return err
		}
		return b.checkAdd(e.ebpf, pod, out)
	})
	if err != nil {
		return err
	}
	atN, err := mapMemory(e.ebpf.pinDir)
	if err != nil {
		return err
	}
	if r.Projected, err = projectMaps(e.ebpf.pinDir, r.CPUs); err != nil {
		return err
	}
	aN, err := b.agentRSS(ctx, e.ebpf, o.memPods)
	if err != nil {
		return err
	}
	r.Agent = append(r.Agent, aN)
	logf("memory: agent with %d pods: VmRSS %d KiB, VmHWM %d KiB", o.memPods, aN.VmRSSKB, aN.VmHWMKB)
	r.summarizeMaps(at0, atN)
	logf("memory: maps %d bytes fixed, %d at %d pods: %.0f bytes per pod (entries: %.0f bytes per pod)",
		r.FixedBytes, r.TotalBytesN, o.memPods, r.PerPodBytes, r.PerPodEntryBytes)

	err = parallel(ctx, o.memPods, 4, func(i int) error {
		if _, _, _, err := b.cnitoolCap(e.ebpf, "del", pods[i], memCapArgs(memPortBase+i)); err != nil {
			return err
		}
		return b.removePod(pods[i])
	})
	if err != nil {
		return err
	}
	if err := b.assertClean(e.ebpf); err != nil {
		return err
	}

	logf("memory: %d ADD+DEL of ptp+portmap+bandwidth", o.n)
	for i := 0; i < o.n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		pod, err := b.newPod()
		if err != nil {
			return err
		}
		capArgs := memCapArgs(memChainPort + i)
		if _, _, _, err := b.cnitoolCap(e.chain, "add", pod, capArgs); err != nil {
			return err
		}
		if _, _, _, err := b.cnitoolCap(e.chain, "del", pod, capArgs); err != nil {
			return err
		}
		if err := b.removePod(pod); err != nil {
			return err
		}
	}
	if err := b.assertClean(e.chain); err != nil {
		return err
	}
	if r.PluginRSS, err = readRSSLog(e.rssLog); err != nil {
		return err
	}
	for _, s := range r.summarizeRSS() {
		logf("memory: %s", s)
	}
	logf("memory: done (%s)", time.Since(start).Round(time.Second))
	return nil
}

// parallel runs f(0..n-1), width at a time, and joins the errors.
func parallel(ctx context.Context, n, width int, f func(i int) error) error {
	sem := make(chan struct{}, width)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			errs <- f(i)
		}(i)
	}
	wg.Wait()
	close(errs)
	var all error
	for e := range errs {
		all = errors.Join(all, e)
	}
	return errors.Join(all, ctx.Err())
}

// agentRSS runs the agent in the configuration's node with its pin, state
// and conf directories until it is ready plus agentSecs, sampling its RSS.
func (b *bench) agentRSS(ctx context.Context, c *config, pods int) (agentSample, error) {
	s := agentSample{Pods: pods, Seconds: b.opts.agentSecs}
	p, err := b.procs.Start(ctx, c.node, filepath.Join(b.binDir, "ebpf-agent"), "run",
		"--metrics-addr", "", "--pin-dir", c.pinDir, "--state-dir", b.stateOf(c),
		"--cni-conf-dir", c.confDir, "--cni-bin-dir", b.binDir)
	if err != nil {
		return s, err
	}
	defer p.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.Stderr.String(), "datapath ready") {
		select {
		case <-p.Done():
			return s, fmt.Errorf("ebpf-agent exited: %v\n%s", p.Err(), testenv.Tail(p.Stderr.String()))
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("ebpf-agent not ready after 30 s:\n%s", testenv.Tail(p.Stderr.String()))
		}
	}
	end := time.Now().Add(time.Duration(b.opts.agentSecs * float64(time.Second)))
	for time.Now().Before(end) {
		rss, hwm, err := procStatusKB(p.Pid())
		if err != nil {
			return s, err
		}
		s.Samples = append(s.Samples, rss)
		s.VmRSSKB, s.VmHWMKB = rss, hwm
		if err := testenv.SleepCtx(ctx, 250*time.Millisecond); err != nil {
			return s, err
		}
	}
	if err := p.Stop(5 * time.Second); err != nil {
		return s, err
	}
	// Output is read after exit: no concurrent writes any more. The agent
	// logs a reconcile only when it removed something or failed: neither
	// may happen to live pods.
	if log := p.Stderr.String(); strings.Contains(log, "reconcile (") {
		return s, fmt.Errorf("ebpf-agent reconciled something away or failed to:\n%s", testenv.Tail(log))
	}
	return s, nil
}

// procStatusKB reads VmRSS and VmHWM of a process.
func procStatusKB(pid int) (rss, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fs[0], 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return rss, hwm, sc.Err()
}

// mapMemory reads the memlock and entry count of every pinned map of the
// datapath (pkg/maps' Usage: fdinfo memlock; arrays count as full).
func mapMemory(pinDir string) (map[string]mapMem, error) {
	m, err := datapath.OpenMaps(pinDir)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	us, err := m.Usage()
	if err != nil {
		return nil, err
	}
	out := map[string]mapMem{}
	for _, u := range us {
		n := u.Entries
		if n < 0 {
			n = int(u.MaxEntries)
		}
		out[u.Name] = mapMem{Name: u.Name, Type: u.Type, KeySize: u.KeySize, ValueSize: u.ValueSize,
			MaxEntries: u.MaxEntries, Flags: u.Flags, Memlock0: u.Memlock, Entries0: n}
	}
	return out, nil
}

func possibleCPUs() int {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return runtime.NumCPU()
	}
	return n
}

func isPerCPU(t string) bool { return strings.Contains(strings.ToLower(t), "percpu") }

func (r *memResults) summarizeMaps(at0, atN map[string]mapMem) {
	var names []string
	for n := range atN {
		names = append(names, n)
	}
	sort.Strings(names)
	var entryBytes float64
	r.Maps, r.FixedBytes, r.TotalBytesN = nil, 0, 0
	for _, n := range names {
		m := atN[n]
		m.MemlockN, m.EntriesN = m.Memlock0, m.Entries0
		m.Memlock0, m.Entries0 = 0, 0
		if z, ok := at0[n]; ok {
			m.Memlock0, m.Entries0 = z.Memlock0, z.Entries0
		}
		r.Maps = append(r.Maps, m)
		r.FixedBytes += m.Memlock0
		r.TotalBytesN += m.MemlockN
		v := float64(m.ValueSize)
		if isPerCPU(m.Type) {
			v *= float64(r.CPUs)
		}
		entryBytes += float64(m.EntriesN-m.Entries0) * (float64(m.KeySize) + v)
	}
	r.PerPodBytes = (float64(r.TotalBytesN) - float64(r.FixedBytes)) / float64(r.Pods)
	r.PerPodEntryBytes = entryBytes / float64(r.Pods)
}

// projectMaps extrapolates the pinned maps' memlock to this node's, 64 and
// 192 CPUs (pkg/maps' model of the kernel's accounting).
func projectMaps(pinDir string, cpus int) ([]cpuProjection, error) {
	m, err := datapath.OpenMaps(pinDir)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	us, err := m.Usage()
	if err != nil {
		return nil, err
	}
	var out []cpuProjection
	for _, c := range []int{cpus, 64, 192} {
		now, full := maps.Footprint(us, c)
		out = append(out, cpuProjection{CPUs: c, AtNBytes: now, FullBytes: full})
		logf("memory: maps on %d CPUs: %.1f MiB with these pods, %.1f MiB with every map full", c, float64(now)/(1<<20), float64(full)/(1<<20))
	}
	return out, nil
}

// readRSSLog parses the wrappers' "rss BINARY VERB KB" lines.
func readRSSLog(path string) ([]rssSample, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []rssSample
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != "rss" {
			continue
		}
		kb, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, rssSample{Binary: f[1], Verb: f[2], MaxKB: kb})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no RSS figures in %s", path)
	}
	return out, nil
}

// rssOf is the KB figures of one binary and verb.
func (r *memResults) rssOf(binary, verb string) []float64 {
	var v []float64
	for _, s := range r.PluginRSS {
		if s.Binary == binary && s.Verb == verb {
			v = append(v, float64(s.MaxKB))
		}
	}
	return v
}

func (r *memResults) summarizeRSS() []string {
	var out []string
	for _, bin := range []string{"ebpf-cni", "ptp", "portmap", "bandwidth", "host-local"} {
		v := r.rssOf(bin, "ADD")
		if len(v) == 0 {
			continue
		}
		lo, hi := testenv.MinMax(v)
		out = append(out, fmt.Sprintf("%-10s ADD peak RSS median %.1f MiB (min %.1f, max %.1f, %d runs)",
			bin, testenv.Median(v)/1024, lo/1024, hi/1024, len(v)))
	}
	return out
}
