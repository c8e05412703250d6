package bandwidth

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

// Targets of senders the node paces (egress, ingress from a pod of the
// node): the average over the run within 5% of the rate, every 1 s interval
// within 10%.
const (
	avgTolerancePct      = 5.0
	intervalTolerancePct = 10.0
)

// Targets of remote senders (not paced: the ingress queue and the pod's
// window hold them): the average at least 90% of the rate, no 1 s interval
// (the first included) over 110%, ping p90 under load at most 5 ms.
const (
	remoteMinAvgPct      = 90.0
	remoteMaxIntervalPct = 110.0
	remoteMaxPingP90Ms   = 5.0
)

// results is everything a run measured, as written to the JSON file.
type results struct {
	Date          string         `json:"date"`
	Kernel        string         `json:"kernel"`
	Go            string         `json:"go"`
	Iperf3        string         `json:"iperf3"`
	Commit        string         `json:"commit"`
	Command       string         `json:"command"`
	CPUs          int            `json:"cpus"`
	RatesMbps     []uint64       `json:"ratesMbps"`
	SecondsPerRun int            `json:"secondsPerRun"`
	Burst         uint64         `json:"burstBits"`
	Elapsed       string         `json:"elapsed"`
	LoadStart     string         `json:"loadavgStart"`
	LoadEnd       string         `json:"loadavgEnd"`
	Calm          string         `json:"calm"`
	SchFq         string         `json:"schFq"` // whether the kernel has sch_fq (EDT)
	Configs       []configInfo   `json:"configs"`
	Limiters      []limiterEntry `json:"limiters"`
	Runs          []*run         `json:"runs"`
	// Rows is the summary table (the bench command merges these into its combined table).
	Rows []testenv.Row `json:"rows"`

	started time.Time
	labels  map[string]string
	order   []string
}

type configInfo struct {
	Key      string `json:"key"`
	Label    string `json:"label"`
	Conflist string `json:"conflist"`
}

// limiterEntry is what a configuration installed for its limited pod.
type limiterEntry struct {
	Config  string `json:"config"`
	RateBps uint64 `json:"rateBps"`
	Info    string `json:"info"`
}

// interval is one iperf3 -i 1 report.
type interval struct {
	Start       float64 `json:"start"`
	End         float64 `json:"end"`
	Seconds     float64 `json:"seconds"`
	Bytes       uint64  `json:"bytes"`
	Bps         float64 `json:"bitsPerSecond"`
	Retransmits *int64  `json:"retransmits,omitempty"`
}

type pingStats struct {
	Sent     int       `json:"sent"`
	Received int       `json:"received"`
	RTTsMs   []float64 `json:"rttsMs"`
	MedianMs float64   `json:"medianMs"`
	P90Ms    float64   `json:"p90Ms"`
	MinMs    float64   `json:"minMs"`
	MaxMs    float64   `json:"maxMs"`
}

// run is one TCP stream through the limited pod in one direction.
type run struct {
	Config    string `json:"config"`
	RateBps   uint64 `json:"rateBps"`
	Direction string `json:"direction"` // egress: the limited pod sends; ingress: it receives
	Seconds   int    `json:"seconds"`
	Sender    string `json:"sender"`   // iperf3 client
	Receiver  string `json:"receiver"` // iperf3 server
	Started   string `json:"started"`
	LoadAvg   string `json:"loadavg"`

	// The receiver's view: the iperf3 server's own -J output.
	ReceiverIntervals []interval `json:"receiverIntervals"`
	ReceivedBytes     uint64     `json:"receivedBytes"`
	ReceivedSeconds   float64    `json:"receivedSeconds"`
	ReceivedBps       float64    `json:"receivedBitsPerSecond"`
	// The sender's view (iperf3 client -J), for retransmits and reference.
	SenderIntervals      []interval `json:"senderIntervals"`
	SentBytes            uint64     `json:"sentBytes"`
	Retransmits          int64      `json:"retransmits"`
	ClientSumReceivedBps float64    `json:"clientSumReceivedBitsPerSecond"`
	LimiterDrops         uint64     `json:"limiterDrops"`

	PingLoad *pingStats `json:"pingUnderLoad"`
	PingIdle *pingStats `json:"pingIdle"`

	AvgPct            float64 `json:"avgPctOfLimit"`
	FirstSecondBps    float64 `json:"firstSecondBitsPerSecond"`
	FirstSecondPct    float64 `json:"firstSecondPctOfLimit"`
	MinIntervalPct    float64 `json:"minIntervalPctOfLimit"`
	MaxIntervalPct    float64 `json:"maxIntervalPctOfLimit"`
	FullIntervals     int     `json:"fullIntervals"`
	ExcludedIntervals int     `json:"excludedShortIntervals"`
	MeetsAvg          bool    `json:"meetsAvgTarget"`
	MeetsIntervals    bool    `json:"meetsIntervalTarget"`
	MeetsPing         bool    `json:"meetsPingTarget"` // remote rows only
}

func newResults(o *Options) *results {
	now := time.Now().UTC()
	r := &results{
		Date:          now.Format(time.RFC3339),
		Kernel:        testenv.KernelRelease(),
		Go:            testenv.GoVersion(),
		Iperf3:        testenv.IperfVersion(),
		Commit:        testenv.GitCommit(),
		Command:       os.Getenv(testenv.CmdlineEnv),
		CPUs:          runtime.NumCPU(),
		RatesMbps:     o.ratesMb,
		SecondsPerRun: int(o.duration / time.Second),
		Burst:         containerdBurst,
		LoadStart:     testenv.Loadavg(),
		Runs:          []*run{},
		started:       now,
		labels:        map[string]string{},
	}
	if r.Command == "" {
		r.Command = strings.Join(os.Args, " ")
	}
	return r
}

func (r *results) addConfig(c *config, conflist string) {
	r.labels[c.key] = c.label
	r.order = append(r.order, c.key)
	r.Configs = append(r.Configs, configInfo{Key: c.key, Label: c.label, Conflist: conflist})
}

func (r *results) addLimiter(cfg string, rate uint64, info string) {
	r.Limiters = append(r.Limiters, limiterEntry{Config: cfg, RateBps: rate, Info: info})
}

func (s *pingStats) summarize() {
	v := append([]float64(nil), s.RTTsMs...)
	sort.Float64s(v)
	n := len(v)
	s.MinMs, s.MaxMs = v[0], v[n-1]
	if n%2 == 1 {
		s.MedianMs = v[n/2]
	} else {
		s.MedianMs = (v[n/2-1] + v[n/2]) / 2
	}
	s.P90Ms = v[int(math.Ceil(0.9*float64(n)))-1] // nearest rank
}

func (p *pingStats) String() string {
	if p == nil || p.Received == 0 {
		return "no reply"
	}
	s := fmt.Sprintf("%s / %s", fmtMs(p.MedianMs), fmtMs(p.P90Ms))
	if lost := p.Sent - p.Received; lost > 0 {
		s += fmt.Sprintf(" (%d/%d lost)", lost, p.Sent)
	}
	return s
}

func fmtMs(v float64) string {
	if v < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// evaluate derives the percentages of the limit and the verdicts.
func (r *run) evaluate() {
	rate := float64(r.RateBps)
	pct := func(bps float64) float64 { return bps / rate * 100 }
	r.AvgPct = pct(r.ReceivedBps)
	r.FirstSecondBps = r.ReceiverIntervals[0].Bps
	r.FirstSecondPct = pct(r.FirstSecondBps)
	r.MinIntervalPct, r.MaxIntervalPct = math.Inf(1), math.Inf(-1)
	r.FullIntervals, r.ExcludedIntervals = 0, 0
	for _, iv := range r.ReceiverIntervals {
		if iv.Seconds < fullInterval {
			r.ExcludedIntervals++
			continue
		}
		r.FullIntervals++
		r.MinIntervalPct = math.Min(r.MinIntervalPct, pct(iv.Bps))
		r.MaxIntervalPct = math.Max(r.MaxIntervalPct, pct(iv.Bps))
	}
	if r.FullIntervals == 0 {
		r.MinIntervalPct, r.MaxIntervalPct = 0, 0
	}
	if r.Direction == "remote" {
		r.MeetsAvg = r.AvgPct >= remoteMinAvgPct
		r.MeetsIntervals = r.FullIntervals > 0 && r.MaxIntervalPct <= remoteMaxIntervalPct && r.FirstSecondPct <= remoteMaxIntervalPct
		r.MeetsPing = r.PingLoad != nil && r.PingLoad.Received > 0 && r.PingLoad.P90Ms <= remoteMaxPingP90Ms
		return
	}
	r.MeetsAvg = math.Abs(r.AvgPct-100) <= avgTolerancePct
	r.MeetsIntervals = r.FullIntervals > 0 && r.MinIntervalPct >= 100-intervalTolerancePct &&
		r.MaxIntervalPct <= 100+intervalTolerancePct
	r.MeetsPing = true // not a target of these rows
}

func (r *run) meets() bool { return r.MeetsAvg && r.MeetsIntervals && r.MeetsPing }

func (r *run) verdict() string {
	if r.meets() {
		return "yes"
	}
	var missed []string
	if !r.MeetsAvg {
		missed = append(missed, "avg")
	}
	if !r.MeetsIntervals {
		missed = append(missed, "1 s")
	}
	if !r.MeetsPing {
		missed = append(missed, "ping")
	}
	return "no: " + strings.Join(missed, ", ")
}

// goal describes the targets of a run and how it did.
func (r *run) goal() string {
	if r.Direction == "remote" {
		return fmt.Sprintf("%d s avg %.1f%% ≥ %.0f%%, 1 s max %.1f%% and first s %.1f%% ≤ %.0f%%, ping p90 %s ms ≤ %.0f",
			r.Seconds, r.AvgPct, remoteMinAvgPct, r.MaxIntervalPct, r.FirstSecondPct, remoteMaxIntervalPct, fmtPingP90(r.PingLoad), remoteMaxPingP90Ms)
	}
	return fmt.Sprintf("%d s avg %.1f%% within ±%.0f%%, every 1 s within ±%.0f%%", r.Seconds, r.AvgPct, avgTolerancePct, intervalTolerancePct)
}

func fmtPingP90(p *pingStats) string {
	if p == nil || p.Received == 0 {
		return "–"
	}
	return fmtMs(p.P90Ms)
}

func (r *run) summary() string {
	return fmt.Sprintf("%.2f Mbit/s (%.1f%%), 1 s %.1f-%.1f%%, first s %.1f%%, retr %d, drops %d, ping %s ms (idle %s): %s",
		r.ReceivedBps/1e6, r.AvgPct, r.MinIntervalPct, r.MaxIntervalPct, r.FirstSecondPct, r.Retransmits,
		r.LimiterDrops, r.PingLoad, r.PingIdle, r.verdict())
}

func (r *results) find(cfg string, rate uint64, dir string) *run {
	for _, x := range r.Runs {
		if x.Config == cfg && x.RateBps == rate && x.Direction == dir {
			return x
		}
	}
	return nil
}

func rateLabel(bps uint64) string {
	if bps >= 1e9 && bps%1e9 == 0 {
		return fmt.Sprintf("%d Gbit/s", bps/1e9)
	}
	return fmt.Sprintf("%d Mbit/s", bps/1e6)
}

func pct(v float64) string { return fmt.Sprintf("%.1f", v) }

// markdown renders the header and the tables.
func (r *results) markdown() string {
	var b strings.Builder
	secs := r.SecondsPerRun
	fmt.Fprintf(&b, "# ebpf-cni bandwidth limits beside ptp + bandwidth\n\n")
	fmt.Fprintf(&b, "- date: %s\n", r.Date)
	fmt.Fprintf(&b, "- kernel: %s (%d CPUs)\n", r.Kernel, r.CPUs)
	fmt.Fprintf(&b, "- go: %s; %s\n", r.Go, r.Iperf3)
	fmt.Fprintf(&b, "- commit: %s\n", r.Commit)
	fmt.Fprintf(&b, "- command: `%s`\n", r.Command)
	fmt.Fprintf(&b, "- load average (1/5/15 min) at start: %s; at end: %s; total %s; %s\n", r.LoadStart, r.LoadEnd, r.Elapsed, r.Calm)
	fmt.Fprintf(&b, "- sch_fq (EDT) on this kernel: %s\n", r.SchFq)
	fmt.Fprintf(&b, "- method: per configuration a node netns and an unlimited peer pod; per rate a fresh limited pod, "+
		"ADDed through `cnitool` with CAP_ARGS `{\"bandwidth\": {ingressRate, egressRate: the rate; ingressBurst, egressBurst: %d}}` "+
		"(containerd's burst). IPv4, MTU 1500. One TCP stream, `iperf3 -J -i 1 -t %d`: "+
		"egress = client in the limited pod sending to a server in the peer pod (same node); ingress = client in the peer pod sending to a server in the limited pod (same node); "+
		"remote = client in a remote host (a netns routed to the node over an uplink veth, sender's default congestion control) sending to a server in the limited pod. "+
		"Throughput figures are the receiver's (the iperf3 server's own `-J -i 1` output: its end.sum_received and its intervals; TCP payload, i.e. goodput), "+
		"as %% of the configured rate; the average is over the receiver's own duration, which exceeds the sender's when a queue drains after the sender stops; min/max over the receiver's 1 s intervals, each over its own length (a trailing stub shorter than %.1f s is ignored); "+
		"retransmits are the sender's (client end.sum_sent); limiter drops: ebpf-cni's drop_bandwidth counters and its ingress queues' drops, or the tbf qdiscs' drops, during the run. "+
		"Ping: to the limited pod from the peer pod (egress, ingress) or the remote host (remote), `-i 0.2`, %d pings from 1 s into the stream, median / p90 (nearest rank); "+
		"idle: %d pings just before, same path. Targets: egress and ingress: %d s average within %.0f%% of the rate, every 1 s interval within %.0f%%; "+
		"remote: average at least %.0f%%, no 1 s interval and not the first second over %.0f%%, ping p90 under load at most %.0f ms.\n",
		r.Burst, secs, fullInterval, r.pings(false), r.pings(true), secs, avgTolerancePct, intervalTolerancePct,
		remoteMinAvgPct, remoteMaxIntervalPct, remoteMaxPingP90Ms)
	fmt.Fprintf(&b, "- limiters as installed (burst after each plugin's own policy):\n")
	for _, l := range r.Limiters {
		fmt.Fprintf(&b, "  - %s, %s: %s\n", r.labels[l.Config], rateLabel(l.RateBps), l.Info)
	}

	fmt.Fprintf(&b, "\n## Summary\n\n%s", testenv.RowsMarkdown(r.Rows))

	// Side by side.
	fmt.Fprintf(&b, "\n## Side by side (%% of the limit; ping in ms)\n\n")
	fmt.Fprintf(&b, "| rate | direction |")
	for _, k := range r.order {
		l := r.labels[k]
		fmt.Fprintf(&b, " %s %d s avg | %s 1 s min–max | %s first s | %s retr | %s ping load median / p90 | %s meets targets |", l, secs, l, l, l, l, l)
	}
	fmt.Fprintf(&b, "\n|---|---|")
	for range r.order {
		fmt.Fprintf(&b, "---:|---:|---:|---:|---:|---|")
	}
	fmt.Fprintf(&b, "\n")
	for _, rate := range r.RatesMbps {
		for _, dir := range directions {
			fmt.Fprintf(&b, "| %s | %s |", rateLabel(rate*1e6), dir)
			for _, k := range r.order {
				x := r.find(k, rate*1e6, dir)
				if x == nil {
					fmt.Fprintf(&b, " – | – | – | – | – | – |")
					continue
				}
				fmt.Fprintf(&b, " %s | %s–%s | %s | %d | %s | %s |", pct(x.AvgPct), pct(x.MinIntervalPct), pct(x.MaxIntervalPct),
					pct(x.FirstSecondPct), x.Retransmits, x.PingLoad, x.verdict())
			}
			fmt.Fprintf(&b, "\n")
		}
	}
	b.WriteString("\n")
	for _, k := range r.order {
		met, total := 0, 0
		for _, x := range r.Runs {
			if x.Config == k {
				total++
				if x.meets() {
					met++
				}
			}
		}
		fmt.Fprintf(&b, "- %s meets its targets in %d of %d rows\n", r.labels[k], met, total)
	}

	// Per configuration.
	for _, k := range r.order {
		fmt.Fprintf(&b, "\n## %s\n\n", r.labels[k])
		fmt.Fprintf(&b, "| rate | direction | %d s avg Mbit/s | %% of limit | min 1 s %% | max 1 s %% | first s %% | retransmits | limiter drops | ping under load median / p90 ms | idle ping median / p90 ms | meets targets |\n", secs)
		fmt.Fprintf(&b, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, rate := range r.RatesMbps {
			for _, dir := range directions {
				x := r.find(k, rate*1e6, dir)
				if x == nil {
					continue
				}
				fmt.Fprintf(&b, "| %s | %s | %.2f | %s | %s | %s | %s | %d | %d | %s | %s | %s |\n",
					rateLabel(rate*1e6), dir, x.ReceivedBps/1e6, pct(x.AvgPct), pct(x.MinIntervalPct), pct(x.MaxIntervalPct),
					pct(x.FirstSecondPct), x.Retransmits, x.LimiterDrops, x.PingLoad, x.PingIdle, x.verdict())
			}
		}
	}
	fmt.Fprintf(&b, "\nRaw per-interval figures (receiver and sender), every RTT and the conflists: the .json file of the same name.\n")
	return b.String()
}

// pings is how many pings a run sent under load, or idle.
func (r *results) pings(idle bool) int {
	for _, x := range r.Runs {
		p := x.PingLoad
		if idle {
			p = x.PingIdle
		}
		if p != nil {
			return p.Sent
		}
	}
	return 0
}

// write prints the tables and stores bandwidth-<date>.md and .json in dir.
func (r *results) write(dir string) error {
	r.LoadEnd = testenv.Loadavg()
	r.Rows = r.rows()
	md := r.markdown()
	base, err := testenv.WriteReport(dir, "bandwidth", r.started, md, r)
	if err != nil {
		return err
	}
	logf("wrote %s.md and %s.json", base, base)
	return nil
}

// rows is the summary table: per rate and direction, each configuration's
// 1 s intervals as % of the limit and its ping RTTs under load, ebpf-cni's
// against ptp+bandwidth's.
func (r *results) rows() []testenv.Row {
	var rows []testenv.Row
	ref := "chain"
	for _, rate := range r.RatesMbps {
		for _, dir := range directions {
			for _, k := range r.order {
				x := r.find(k, rate*1e6, dir)
				if x == nil {
					continue
				}
				pcts := intervalPcts(x)
				cond := fmt.Sprintf("%s %s, burst %d", rateLabel(rate*1e6), dir, r.Burst)
				if dir == "remote" {
					cond = fmt.Sprintf("%s ingress from a remote host (not paced), burst %d", rateLabel(rate*1e6), r.Burst)
				}
				acc := testenv.NewRow("bandwidth accuracy", r.labels[k], "% of limit, 1 s intervals", cond, "%", pcts)
				if f := strings.Fields(x.LoadAvg); len(f) > 0 {
					acc.Load = f[0] // the 1-minute figure
				}
				if k == ref {
					// The reference is not judged; its average is what to compare.
					acc.Target = fmt.Sprintf("%d s avg %.1f%%", x.Seconds, x.AvgPct)
				} else {
					acc.Goal(x.goal(), x.meets())
				}
				var lat testenv.Row
				if x.PingLoad != nil {
					lat = testenv.NewRow("latency under load", r.labels[k], "ping RTT under load", cond+fmt.Sprintf("; idle median %s ms", fmtMs(x.PingIdle.MedianMs)), "ms", x.PingLoad.RTTsMs)
					lat.Load = acc.Load
				}
				if k != ref {
					if y := r.find(ref, rate*1e6, dir); y != nil {
						acc.Against(r.labels[ref], testenv.Median(intervalPcts(y)))
						if y.PingLoad != nil && x.PingLoad != nil {
							lat.Against(r.labels[ref], y.PingLoad.MedianMs)
						}
					}
				}
				rows = append(rows, acc)
				if x.PingLoad != nil {
					rows = append(rows, lat)
				}
			}
		}
	}
	return rows
}

func intervalPcts(x *run) []float64 {
	var v []float64
	for _, iv := range x.ReceiverIntervals {
		if iv.Seconds >= fullInterval {
			v = append(v, iv.Bps/float64(x.RateBps)*100)
		}
	}
	return v
}
