package main

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// combined is the one table of every figure the run measured, whichever
// parts it ran: bench-<date>.md and .json beside the parts' detailed reports
// (cni-<date>.* for the plugin parts, bandwidth-<date>.*).
type combined struct {
	Date      string        `json:"date"`
	Kernel    string        `json:"kernel"`
	CPUs      int           `json:"cpus"`
	Go        string        `json:"go"`
	Iperf3    string        `json:"iperf3"`
	Commit    string        `json:"commit"`
	Command   string        `json:"command"`
	Quick     bool          `json:"quick"`
	Parts     []string      `json:"parts"`
	Elapsed   string        `json:"elapsed"`
	LoadStart string        `json:"loadavgStart"`
	LoadEnd   string        `json:"loadavgEnd"`
	Rows      []testenv.Row `json:"rows"`

	started time.Time
}

func newCombined(o *options) *combined {
	now := time.Now().UTC()
	c := &combined{
		Date: now.Format(time.RFC3339), Kernel: testenv.KernelRelease(), CPUs: runtime.NumCPU(),
		Go: testenv.GoVersion(), Iperf3: testenv.IperfVersion(), Commit: testenv.GitCommit(),
		Command: os.Getenv(testenv.CmdlineEnv), Quick: o.quick, LoadStart: testenv.Loadavg(), started: now,
	}
	for _, p := range allParts {
		if o.parts[p] {
			c.Parts = append(c.Parts, p)
		}
	}
	return c
}

func (c *combined) add(rows []testenv.Row) { c.Rows = append(c.Rows, rows...) }

func (c *combined) write(dir string) error {
	c.Elapsed = time.Since(c.started).Round(time.Second).String()
	c.LoadEnd = testenv.Loadavg()
	base, err := testenv.WriteReport(dir, "bench", c.started, c.markdown(), c)
	if err != nil {
		return err
	}
	logf("wrote %s.md and %s.json in %s", base, base, c.Elapsed)
	return nil
}

func (c *combined) markdown() string {
	var b strings.Builder
	mode := "full"
	if c.Quick {
		mode = "quick"
	}
	fmt.Fprintf(&b, "# ebpf-cni benchmarks (%s): %s\n\n", mode, strings.Join(c.Parts, ", "))
	fmt.Fprintf(&b, "- date: %s\n", c.Date)
	fmt.Fprintf(&b, "- kernel: %s (%d CPUs)\n", c.Kernel, c.CPUs)
	fmt.Fprintf(&b, "- go: %s; %s\n", c.Go, c.Iperf3)
	fmt.Fprintf(&b, "- commit: %s\n", c.Commit)
	fmt.Fprintf(&b, "- command: `%s`\n", c.Command)
	fmt.Fprintf(&b, "- total: %s; load average (1/5/15 min) at start: %s; at end: %s\n", c.Elapsed, c.LoadStart, c.LoadEnd)
	fmt.Fprintf(&b, "- reference plugins: containernetworking/plugins and cnitool at the versions go.mod pins, built with `go build`; every plugin driven through cnitool in throwaway namespaces\n")
	fmt.Fprintf(&b, "- median, min and max are over the runs; × reference compares medians of the same run; load is the 1-minute load average when the row was measured (where recorded)\n\n")
	b.WriteString(testenv.RowsMarkdown(c.Rows))
	met, missed := 0, []string{}
	for _, r := range c.Rows {
		if r.Met == nil {
			continue
		}
		if *r.Met {
			met++
		} else {
			missed = append(missed, fmt.Sprintf("%s / %s / %s / %s (%s)", r.Section, r.Config, r.Metric, r.Condition, r.Target))
		}
	}
	fmt.Fprintf(&b, "\nTargets met: %d; missed: %d\n", met, len(missed))
	for _, m := range missed {
		fmt.Fprintf(&b, "- missed: %s\n", m)
	}
	return b.String()
}
