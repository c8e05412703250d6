package main

// The burst part: N pods ADDed at the same instant, then DELed at the same
// instant, each through its own cnitool as N runtime workers would, ebpf-cni
// (with its agent running, see agent.go) beside ptp, configurations
// alternated round by round. The coldstart part: the first ADD on a node,
// which loads and pins the whole datapath when no agent did so before, and
// the same first ADD after `ebpf-agent run` loaded it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// targetBurst: 100 parallel ADDs finish within 1.5x the wall time of 100
// parallel ptp ADDs (issue 17).
const targetBurst = 1.5

type burstResults struct {
	Pods   int          `json:"pods"`
	Rounds int          `json:"rounds"`
	Points []burstPoint `json:"points"`
	Cold   []coldSample `json:"coldStart,omitempty"`
}

// burstPoint is one round of one configuration.
type burstPoint struct {
	Config    string    `json:"config"`
	Round     int       `json:"round"`
	AddWallMs float64   `json:"addWallMs"`
	DelWallMs float64   `json:"delWallMs"`
	AddMs     []float64 `json:"addMs"` // each pod's cnitool wall time
	DelMs     []float64 `json:"delMs"`
	// AddCPUMs, DelCPUMs: the CPU time of the round's verbs, summed
	// (cnitool and the plugins it waited for; not the agent's).
	AddCPUMs float64 `json:"addCpuMs"`
	DelCPUMs float64 `json:"delCpuMs"`
	// AddBgMs, DelBgMs: the agent's background work after the last ADD
	// (moving the pods to tcx) and DEL (deleting the veths) ended.
	AddBgMs float64 `json:"addBackgroundMs,omitempty"`
	DelBgMs float64 `json:"delBackgroundMs,omitempty"`
	Load1   float64 `json:"load1"`
}

// coldSample is one first ADD on a node with a fresh pin directory.
type coldSample struct {
	Agent bool `json:"agentFirst"`
	// Full: a pod with a hostPort and a bandwidth limit (the first such ADD
	// also sets up the node-level hostPort hooks and TCP pacing).
	Full bool `json:"hostPortBandwidth"`
	// AgentReadyMs: agent start to "datapath ready" (agent rounds only).
	AgentReadyMs float64 `json:"agentReadyMs,omitempty"`
	FirstAddMs   float64 `json:"firstAddMs"`
	SecondAddMs  float64 `json:"secondAddMs"`
	// DatapathMs is the first ADD's own "datapath" phase (EBPF_CNI_TRACE).
	DatapathMs float64 `json:"datapathPhaseMs"`
	Load1      float64 `json:"load1"`
}

func (b *bench) burstConfigs() []*config {
	ebpfNet, ptpNet := mustCIDR("10.242.0.0/16"), mustCIDR("10.240.0.0/16")
	pin := b.newPinDir("burst")
	return []*config{
		{key: "burst-ptp", label: "ptp", netName: "bench-burst-ptp", subnet: ptpNet,
			list: map[string]any{"plugins": []any{map[string]any{"type": "ptp", "ipMasq": false, "ipam": b.hostLocal(ptpNet)}}}},
		{key: "burst-ebpf", label: "ebpf-cni", netName: "bench-burst-ebpf", subnet: ebpfNet, pinDir: pin,
			list: map[string]any{"plugins": []any{b.ebpfPlugin(ebpfNet, pin, b.stateFor(pin))}}},
	}
}

func (b *bench) runBurst(ctx context.Context, start time.Time) error {
	o := b.opts
	node, err := b.newNode("node-burst")
	if err != nil {
		return err
	}
	cfgs := b.burstConfigs()
	for _, c := range cfgs {
		c.node = node
	}
	if o.agent {
		node2, err := b.newNode("node-burst-na")
		if err != nil {
			return err
		}
		cfgs = append(cfgs, b.burstNoAgentConfig(node2))
	}
	for _, c := range cfgs {
		if err := b.register(c); err != nil {
			return err
		}
		if c.isEBPF() && o.agent && c.key != burstNoAgentKey {
			if _, _, err := b.startAgent(ctx, node, c.pinDir, b.confDir, true); err != nil {
				return err
			}
		}
	}
	r := &burstResults{Pods: o.burstPods, Rounds: o.burstRounds}
	b.res.Burst = r
	for _, c := range cfgs { // warm-up: page cache, the datapath
		if _, _, err := b.cycle(c, -1); err != nil {
			return fmt.Errorf("burst warm-up: %w", err)
		}
	}
	for round := 0; round < o.burstRounds; round++ {
		for j := range cfgs {
			c := cfgs[(round+j)%len(cfgs)]
			if err := ctx.Err(); err != nil {
				return err
			}
			pt, err := b.burstRound(c, o.burstPods)
			if err != nil {
				return fmt.Errorf("burst %s: %w", c.label, err)
			}
			pt.Round = round
			r.Points = append(r.Points, pt)
			logf("burst round %d: %-22s %d ADDs in %7.0f ms (background %5.0f ms), %d DELs in %7.0f ms (background %5.0f ms) (%s)", round+1, c.label,
				o.burstPods, pt.AddWallMs, pt.AddBgMs, o.burstPods, pt.DelWallMs, pt.DelBgMs, time.Since(start).Round(time.Second))
		}
	}
	return nil
}

// burstRound ADDs n fresh pods at once, checks them, DELs them at once and
// checks nothing is left.
func (b *bench) burstRound(c *config, n int) (burstPoint, error) {
	pt := burstPoint{Config: c.key, Load1: testenv.Load1()}
	pods := make([]ns.NetNS, n)
	for i := range pods {
		p, err := b.newPod()
		if err != nil {
			return pt, err
		}
		pods[i] = p
	}
	outs := make([][]byte, n)
	cpu := make([]time.Duration, n)
	sum := func() (ms float64) {
		for _, d := range cpu {
			ms += float64(d.Microseconds()) / 1000
		}
		return ms
	}
	var err error
	pt.AddMs, pt.AddWallMs, err = atOnce(n, func(i int) (time.Duration, error) {
		r, err := b.cnitoolRun(c, "add", pods[i], c.capArgs)
		outs[i], cpu[i] = r.stdout, r.cpu
		return r.wall, err
	})
	pt.AddCPUMs = sum()
	if err != nil {
		return pt, err
	}
	var w bgWork
	for _, out := range outs {
		w.hostIfs = append(w.hostIfs, hostIfOf(out))
	}
	bg, err := b.settle(c, w)
	if err != nil {
		return pt, err
	}
	pt.AddBgMs = ms(bg)
	var gone bgWork
	for _, h := range w.hostIfs {
		gone.handedOff = append(gone.handedOff, b.ifindexOf(c, h))
	}
	for i, p := range pods {
		if err := b.checkAdd(c, p, outs[i]); err != nil {
			return pt, err
		}
	}
	pt.DelMs, pt.DelWallMs, err = atOnce(n, func(i int) (time.Duration, error) {
		r, err := b.cnitoolRun(c, "del", pods[i], c.capArgs)
		cpu[i] = r.cpu
		return r.wall, err
	})
	pt.DelCPUMs = sum()
	if err != nil {
		return pt, err
	}
	if bg, err = b.settle(c, gone); err != nil {
		return pt, err
	}
	pt.DelBgMs = ms(bg)
	for _, p := range pods {
		if err := b.checkDel(c, p); err != nil {
			return pt, err
		}
		if err := b.removePod(p); err != nil {
			return pt, err
		}
	}
	return pt, b.assertClean(c)
}

// atOnce starts f(0..n-1) at the same instant; it returns each one's own
// duration in ms and the wall time until the last ended.
func atOnce(n int, f func(i int) (time.Duration, error)) ([]float64, float64, error) {
	gate := make(chan struct{})
	each := make([]float64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			d, err := f(i)
			each[i], errs[i] = ms(d), err
		}()
	}
	t := time.Now()
	close(gate)
	wg.Wait()
	return each, ms(time.Since(t)), errors.Join(errs...)
}

// runColdStart times the first ADD on nodes whose pin directory is empty,
// alternating "no agent" and "agent started first" rounds.
func (b *bench) runColdStart(ctx context.Context, start time.Time) error {
	if b.res.Burst == nil {
		b.res.Burst = &burstResults{}
	}
	for i := 0; i < 4*b.opts.coldRounds; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		s, err := b.coldRound(ctx, i, i%2 == 1, i%4 >= 2)
		if err != nil {
			return fmt.Errorf("cold start round %d: %w", i, err)
		}
		b.res.Burst.Cold = append(b.res.Burst.Cold, s)
		logf("cold start %d (agent first: %v, hostPort+bandwidth: %v): agent ready %.0f ms, first ADD %.1f ms (datapath phase %.1f), second ADD %.1f ms (%s)",
			i+1, s.Agent, s.Full, s.AgentReadyMs, s.FirstAddMs, s.DatapathMs, s.SecondAddMs, time.Since(start).Round(time.Second))
	}
	return nil
}

func (b *bench) coldRound(ctx context.Context, i int, agent, full bool) (coldSample, error) {
	s := coldSample{Agent: agent, Full: full, Load1: testenv.Load1()}
	node, err := b.newNode(fmt.Sprintf("node-cold-%d", i))
	if err != nil {
		return s, err
	}
	defer func() {
		delete(b.netnses, node.Path())
		_ = testenv.RemoveNetNS(node)
	}()
	pin := b.newPinDir(fmt.Sprintf("cold%d", i))
	defer os.RemoveAll(pin)
	confDir := filepath.Join(b.root, fmt.Sprintf("cold-conf-%d", i))
	if err := os.MkdirAll(confDir, 0o700); err != nil {
		return s, err
	}
	net := mustCIDR("10.239.0.0/16")
	c := &config{key: fmt.Sprintf("ebpf-cold-%d", i), label: "ebpf-cni first ADD", netName: fmt.Sprintf("bench-cold-%d", i), subnet: net,
		node: node, pinDir: pin, confDir: confDir}
	c.list = map[string]any{"plugins": []any{b.ebpfPlugin(net, pin, b.stateFor(pin))}}
	if full {
		c.list = map[string]any{"plugins": []any{b.ebpfPlugin(net, pin, b.stateFor(pin), "portMappings", "bandwidth")}}
	}
	if err := b.register(c); err != nil {
		return s, err
	}
	if agent {
		// --hostports=false for plain pods: the agent loads and pins the
		// datapath, and attaches nothing to the node's uplinks or cgroups.
		p, ready, err := b.startAgent(ctx, node, pin, confDir, full)
		if err != nil {
			return s, err
		}
		defer func() {
			p.Kill()
			delete(b.agents, pin)
		}()
		s.AgentReadyMs = ms(ready)
	}
	var pods []ns.NetNS
	defer func() {
		for _, p := range pods {
			_, _, _, _ = b.cnitool(c, "del", p)
			_ = b.removePod(p)
		}
	}()
	for k := 0; k < 2; k++ {
		if full {
			c.capArgs = memCapArgs(hostPort + k) // a hostPort each
		}
		pod, d, err := b.addPod(c)
		if pod != nil {
			pods = append(pods, pod)
		}
		if err != nil {
			return s, err
		}
		if k == 0 {
			s.FirstAddMs = ms(d)
			for _, ph := range b.addPhases {
				if ph.Name == "datapath" {
					s.DatapathMs = ph.Ms
				}
			}
		} else {
			s.SecondAddMs = ms(d)
		}
	}
	return s, nil
}

func (r *results) burstRows() []testenv.Row {
	br := r.Burst
	if br == nil {
		return nil
	}
	var rows []testenv.Row
	if len(br.Points) > 0 {
		walls := map[string]map[string][]float64{"ADD": {}, "DEL": {}, opAddBg: {}, opDelBg: {}, opAddCPU: {}, opDelCPU: {}}
		var order []string
		var load []float64
		for _, p := range br.Points {
			load = append(load, p.Load1)
			if _, ok := walls["ADD"][p.Config]; !ok {
				order = append(order, p.Config)
			}
			walls["ADD"][p.Config] = append(walls["ADD"][p.Config], p.AddWallMs)
			walls["DEL"][p.Config] = append(walls["DEL"][p.Config], p.DelWallMs)
			if p.AddCPUMs > 0 {
				walls[opAddCPU][p.Config] = append(walls[opAddCPU][p.Config], p.AddCPUMs)
				walls[opDelCPU][p.Config] = append(walls[opDelCPU][p.Config], p.DelCPUMs)
			}
		}
		for _, p := range br.Points {
			if p.AddBgMs > 0 || p.DelBgMs > 0 {
				walls[opAddBg][p.Config] = append(walls[opAddBg][p.Config], p.AddBgMs)
				walls[opDelBg][p.Config] = append(walls[opDelBg][p.Config], p.DelBgMs)
			}
		}
		for _, op := range []string{"ADD", "DEL", opAddCPU, opDelCPU, opAddBg, opDelBg} {
			for _, cfg := range order {
				if len(walls[op][cfg]) == 0 {
					continue
				}
				if op == opAddCPU || op == opDelCPU {
					verb := strings.Fields(op)[0]
					row := testenv.NewRow(fmt.Sprintf("%d pods at once", br.Pods), r.labels[cfg], op,
						fmt.Sprintf("the %d %ss' CPU time summed (cnitool, the plugins, IPAM; not the agent's)", br.Pods, verb), "ms", walls[op][cfg])
					if cfg != "burst-ptp" && len(walls[op]["burst-ptp"]) > 0 {
						row.Against("ptp", testenv.Median(walls[op]["burst-ptp"]))
					}
					row.Load = loadStr(testenv.Median(load))
					rows = append(rows, row)
					continue
				}
				if op == opAddBg || op == opDelBg {
					row := testenv.NewRow(fmt.Sprintf("%d pods at once", br.Pods), r.labels[cfg], "agent "+bgWhat[op],
						fmt.Sprintf("after the %d %ss, verbs not waiting for it", br.Pods, strings.Fields(op)[0]), "ms", walls[op][cfg])
					row.Load = loadStr(testenv.Median(load))
					rows = append(rows, row)
					continue
				}
				row := testenv.NewRow(fmt.Sprintf("%d pods at once", br.Pods), r.labels[cfg], op+" wall time",
					fmt.Sprintf("%d cnitool %s started together, 0 pods present", br.Pods, op), "ms", walls[op][cfg])
				if cfg != "burst-ptp" {
					row.Against("ptp", testenv.Median(walls[op]["burst-ptp"]))
					if cfg == "burst-ebpf" && op == "ADD" && r.Agent {
						row.Goal(fmt.Sprintf("≤ %.1f× ptp", targetBurst), row.Ratio <= targetBurst)
					}
					// Without -agent, burst-ebpf is the agent-less plugin: issue 30's goal.
					if (cfg == burstNoAgentKey || cfg == "burst-ebpf" && !r.Agent) && op == "ADD" {
						row.Goal(fmt.Sprintf("no agent: ≤ %.1f× ptp", targetBurstNoAgent), row.Ratio <= targetBurstNoAgent)
					}
				}
				row.Load = loadStr(testenv.Median(load))
				rows = append(rows, row)
			}
		}
	}
	for _, full := range []bool{false, true} {
		var first, firstAgent, ready, load []float64
		for _, c := range br.Cold {
			if c.Full != full {
				continue
			}
			load = append(load, c.Load1)
			if c.Agent {
				firstAgent = append(firstAgent, c.FirstAddMs)
				ready = append(ready, c.AgentReadyMs)
			} else {
				first = append(first, c.FirstAddMs)
			}
		}
		if len(first) == 0 {
			continue
		}
		cfg, hp := "ebpf-cni", "false"
		if full {
			cfg, hp = "ebpf-cni +hostPort+bandwidth", "true"
		}
		l := loadStr(testenv.Median(load))
		row := testenv.NewRow("first pod on a node", cfg, "ADD", "no agent: the ADD loads and pins the datapath", "ms", first)
		row.Load = l
		rows = append(rows, row)
		if len(firstAgent) > 0 {
			row := testenv.NewRow("first pod on a node", cfg, "ADD", "after ebpf-agent run loaded it", "ms", firstAgent)
			row.Against("first ADD without agent", testenv.Median(first))
			row.Load = l
			rr := testenv.NewRow("first pod on a node", "ebpf-agent run --hostports="+hp, "start to datapath ready", "empty pin directory", "ms", ready)
			rr.Load = l
			rows = append(rows, row, rr)
		}
	}
	return rows
}
