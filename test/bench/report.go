package main

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// results is everything a run measured, as written to the JSON file.
type results struct {
	Date      string `json:"date"`
	Kernel    string `json:"kernel"`
	Go        string `json:"go"`
	Commit    string `json:"commit"`
	Command   string `json:"command"`
	CPUs      int    `json:"cpus"`
	N         int    `json:"n"`
	Scale     []int  `json:"scale"`
	ScaleReps int    `json:"scaleReps"`
	Elapsed   string `json:"elapsed"`
	LoadStart string `json:"loadavgStart"`
	LoadEnd   string `json:"loadavgEnd"`
	Phases    bool   `json:"ebpfCniTrace"`
	// Agent: ebpf-agent ran on the ebpf-cni nodes (-agent); the goals differ.
	Agent    bool           `json:"agent"`
	Configs  []configInfo   `json:"configs"`
	Warmup   []warmupSample `json:"warmup"`
	Series   []*series      `json:"series"`
	HostPort *hpResults     `json:"hostPort,omitempty"`
	// Throughput, Memory: throughput.go, memory.go.
	Throughput *tputResults  `json:"throughput,omitempty"`
	Memory     *memResults   `json:"memory,omitempty"`
	Burst      *burstResults `json:"burst,omitempty"`
	Iperf3     string        `json:"iperf3"`
	Parts      []string      `json:"parts"`
	PartTimes  []partTime    `json:"partTimes"`
	// Rows is the summary table: every figure with its spread and its
	// ratio to the reference (the bench command merges these into its combined table).
	Rows []testenv.Row `json:"rows"`

	started time.Time
	labels  map[string]string
}

type partTime struct {
	Part    string `json:"part"`
	Elapsed string `json:"elapsed"`
}

type configInfo struct {
	Key      string `json:"key"`
	Label    string `json:"label"`
	CapArgs  string `json:"capArgs,omitempty"`
	Conflist string `json:"conflist"`
}

type warmupSample struct {
	Config    string  `json:"config"`
	AddMs     float64 `json:"addMs"`
	DelMs     float64 `json:"delMs"`
	AddPhases []phase `json:"addPhasesMs,omitempty"`
	DelPhases []phase `json:"delPhasesMs,omitempty"`
}

// phase is one entry of ebpf-cni's EBPF_CNI_TRACE line.
type phase struct {
	Name string  `json:"name"`
	Ms   float64 `json:"ms"`
}

// series is the samples of one configuration, operation and pod count.
type series struct {
	Config  string    `json:"config"`
	Op      string    `json:"op"`
	Pods    int       `json:"podsPresent"`
	Samples []float64 `json:"samplesMs"`
	Median  float64   `json:"medianMs"`
	Min     float64   `json:"minMs"`
	P90     float64   `json:"p90Ms"`
	Max     float64   `json:"maxMs"`
	// Phases holds ebpf-cni's own phase timings per sample (ebpf-cni only).
	Phases [][]phase `json:"phasesMs,omitempty"`
	// PhaseMedians is the median of each phase over Phases.
	PhaseMedians []phase `json:"phaseMediansMs,omitempty"`
}

func newResults(o *options) *results {
	now := time.Now().UTC()
	r := &results{
		Date:      now.Format(time.RFC3339),
		Kernel:    testenv.KernelRelease(),
		Go:        testenv.GoVersion(),
		Commit:    testenv.GitCommit(),
		Command:   os.Getenv(testenv.CmdlineEnv),
		CPUs:      runtime.NumCPU(),
		N:         o.n,
		Scale:     o.scale,
		ScaleReps: o.scaleReps,
		started:   now,
		LoadStart: testenv.Loadavg(),
		Phases:    o.phases,
		Agent:     o.agent,
		Iperf3:    testenv.IperfVersion(),
		labels:    map[string]string{},
	}
	for _, p := range allParts {
		if o.parts[p] {
			r.Parts = append(r.Parts, p)
		}
	}
	if r.Command == "" {
		r.Command = strings.Join(os.Args, " ")
	}
	if r.Scale == nil {
		r.Scale = []int{}
	}
	return r
}

func (r *results) addConfig(c *config, conflist string) {
	r.labels[c.key] = c.label
	r.Configs = append(r.Configs, configInfo{Key: c.key, Label: c.label, CapArgs: c.capArgs, Conflist: conflist})
}

func (r *results) warmup(c *config, add, del time.Duration, addPh, delPh []phase) {
	r.Warmup = append(r.Warmup, warmupSample{Config: c.key, AddMs: ms(add), DelMs: ms(del), AddPhases: addPh, DelPhases: delPh})
}

func (r *results) record(c *config, op string, pods int, d time.Duration, phases []phase) {
	s := r.find(c.key, op, pods)
	if s == nil {
		s = &series{Config: c.key, Op: op, Pods: pods}
		r.Series = append(r.Series, s)
	}
	s.Samples = append(s.Samples, ms(d))
	if phases != nil {
		s.Phases = append(s.Phases, phases)
	}
}

func (s *series) summarize() {
	v := append([]float64(nil), s.Samples...)
	sort.Float64s(v)
	n := len(v)
	s.Min, s.Max = v[0], v[n-1]
	s.Median = testenv.Median(v)
	// Nearest-rank percentile.
	s.P90 = v[int(math.Ceil(0.9*float64(n)))-1]

	s.PhaseMedians = phaseMedians(s.Phases)
}

// phaseMedians is the median of each phase, in the order phases first appear.
func phaseMedians(all [][]phase) []phase {
	var names []string
	byName := map[string][]float64{}
	for _, ps := range all {
		for _, p := range ps {
			if _, ok := byName[p.Name]; !ok {
				names = append(names, p.Name)
			}
			byName[p.Name] = append(byName[p.Name], p.Ms)
		}
	}
	var out []phase
	for _, n := range names {
		out = append(out, phase{n, testenv.Median(byName[n])})
	}
	return out
}

func (r *results) find(cfg, op string, pods int) *series {
	for _, s := range r.Series {
		if s.Config == cfg && s.Op == op && s.Pods == pods {
			return s
		}
	}
	return nil
}

func ratio(s, ref *series) string {
	if ref == nil || ref.Median == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", s.Median/ref.Median)
}

// markdown renders the header and the table.
func (r *results) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# ebpf-cni beside the reference plugins\n\n")
	fmt.Fprintf(&b, "- date: %s\n", r.Date)
	fmt.Fprintf(&b, "- kernel: %s (%d CPUs)\n", r.Kernel, r.CPUs)
	fmt.Fprintf(&b, "- go: %s\n", r.Go)
	fmt.Fprintf(&b, "- commit: %s\n", r.Commit)
	fmt.Fprintf(&b, "- command: `%s`\n", r.Command)
	fmt.Fprintf(&b, "- load average (1/5/15 min) at start: %s; at end: %s\n", r.LoadStart, r.LoadEnd)
	fmt.Fprintf(&b, "- parts: %s;", strings.Join(r.Parts, ", "))
	for _, p := range r.PartTimes {
		fmt.Fprintf(&b, " %s %s;", p.Part, p.Elapsed)
	}
	fmt.Fprintf(&b, " total %s\n", r.Elapsed)
	fmt.Fprintf(&b, "\n## Summary\n\n%s", testenv.RowsMarkdown(r.Rows))
	if len(r.Series) == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, "\n## ADD/DEL latency\n\n")
	scale := "none"
	if len(r.Scale) > 0 {
		var ps []string
		for _, p := range r.Scale {
			ps = append(ps, fmt.Sprint(p))
		}
		scale = fmt.Sprintf("%d ADD+DEL each with %s pods of the same configuration present", r.ScaleReps, strings.Join(ps, ", "))
	}
	fmt.Fprintf(&b, "- runs: n=%d per configuration (interleaved, each round's order a row of a Williams design: every configuration in every place and right after each other one alike, after one uncounted warm-up); at scale: %s; total %s\n", r.N, scale, r.Elapsed)
	fmt.Fprintf(&b, "- method: wall time of `cnitool add|del NET NETNS` run in a private node netns (CNI %s, IPv4 host-local), i.e. cnitool + libcni + every plugin exec, as a runtime sees it; fresh pod netns per sample (not timed); pods present = other pods of the same configuration attached while timing; ratios compare medians at the same op and pods present; p90 is nearest-rank\n\n", cniVersion)

	fmt.Fprintf(&b, "| config | op | pods present | runs | median ms | min ms | p90 ms | max ms | × ptp+portmap+bandwidth | × ptp |\n")
	fmt.Fprintf(&b, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range r.Series {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.2f | %.2f | %.2f | %.2f | %s | %s |\n",
			r.labels[s.Config], s.Op, s.Pods, len(s.Samples), s.Median, s.Min, s.P90, s.Max,
			ratio(s, r.find("chain", s.Op, s.Pods)), ratio(s, r.find("ptp", s.Op, s.Pods)))
	}
	fmt.Fprintf(&b, "\nWarm-up (not counted; ebpf-cni's loads and pins the datapath):")
	for i, w := range r.Warmup {
		sep := ";"
		if i == len(r.Warmup)-1 {
			sep = "."
		}
		fmt.Fprintf(&b, " %s ADD %.2f / DEL %.2f ms%s", r.labels[w.Config], w.AddMs, w.DelMs, sep)
	}
	b.WriteString("\n")

	var phased []*series
	for _, s := range r.Series {
		if len(s.PhaseMedians) > 0 {
			phased = append(phased, s)
		}
	}
	if len(phased) > 0 {
		fmt.Fprintf(&b, "\nebpf-cni's own phase timings (EBPF_CNI_TRACE, medians in ms; inside the plugin process, so they exclude process start-up and cnitool):\n\n")
		for _, s := range phased {
			var parts []string
			for _, p := range s.PhaseMedians {
				parts = append(parts, fmt.Sprintf("%s %.2f", p.Name, p.Ms))
			}
			fmt.Fprintf(&b, "- %s %s, %d pods present (cnitool wall %.2f): %s\n", r.labels[s.Config], s.Op, s.Pods, s.Median, strings.Join(parts, ", "))
		}
		for _, w := range r.Warmup {
			if len(w.AddPhases) > 0 {
				var parts []string
				for _, p := range w.AddPhases {
					parts = append(parts, fmt.Sprintf("%s %.2f", p.Name, p.Ms))
				}
				fmt.Fprintf(&b, "- %s warm-up ADD (cnitool wall %.2f): %s\n", r.labels[w.Config], w.AddMs, strings.Join(parts, ", "))
			}
		}
	}
	return b.String()
}

// sortSeries orders rows: by pods present, then configuration, then op.
func (r *results) sortSeries() {
	order := map[string]int{}
	for i, c := range r.Configs {
		order[c.Key] = i
	}
	sort.SliceStable(r.Series, func(i, j int) bool {
		a, b := r.Series[i], r.Series[j]
		if a.Pods != b.Pods {
			return a.Pods < b.Pods
		}
		if a.Op != b.Op {
			return a.Op == "ADD"
		}
		return order[a.Config] < order[b.Config]
	})
}

// write prints the table and stores latency-<date>.md and .json in dir.
func (r *results) write(dir string) error {
	r.LoadEnd = testenv.Loadavg()
	for _, s := range r.Series {
		s.summarize()
	}
	r.sortSeries()
	r.Rows = r.rows()
	md := r.markdown() + r.hostPortMarkdown() + r.masqMarkdown() + r.throughputMarkdown() + r.memoryMarkdown()
	base, err := testenv.WriteReport(dir, "cni", r.started, md, r)
	if err != nil {
		return err
	}
	logf("wrote %s.md and %s.json", base, base)
	return nil
}
