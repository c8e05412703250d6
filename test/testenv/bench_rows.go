package testenv

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Row is one line of the combined results table: a figure of one
// configuration with its spread, and its ratio to a reference measured in
// the same run.
type Row struct {
	Section   string    `json:"section"`
	Config    string    `json:"config"`
	Metric    string    `json:"metric"`
	Condition string    `json:"condition,omitempty"`
	Unit      string    `json:"unit"`
	Runs      int       `json:"runs"`
	Median    float64   `json:"median"`
	Min       float64   `json:"min"`
	Max       float64   `json:"max"`
	Samples   []float64 `json:"samples,omitempty"`
	// Reference names what Ratio compares to (its median is RefMedian).
	Reference string  `json:"reference,omitempty"`
	RefMedian float64 `json:"referenceMedian,omitempty"`
	Ratio     float64 `json:"ratio,omitempty"`
	// Target is the performance goal this row is judged by, with the verdict.
	Target string `json:"target,omitempty"`
	Met    *bool  `json:"met,omitempty"`
	// Load is how busy the machine was while it was measured: the 1-minute
	// load average, or for throughput the other runnable tasks.
	Load string `json:"load,omitempty"`
}

// NewRow summarizes samples.
func NewRow(section, config, metric, condition, unit string, samples []float64) Row {
	lo, hi := MinMax(samples)
	return Row{Section: section, Config: config, Metric: metric, Condition: condition, Unit: unit,
		Runs: len(samples), Median: Median(samples), Min: lo, Max: hi, Samples: samples}
}

// Against sets the reference: its label and median.
func (r *Row) Against(label string, refMedian float64) {
	if refMedian == 0 {
		return
	}
	r.Reference, r.RefMedian, r.Ratio = label, refMedian, r.Median/refMedian
}

// Goal records a target and whether it is met.
func (r *Row) Goal(target string, met bool) {
	v := "missed"
	if met {
		v = "met"
	}
	r.Target = target + ": " + v
	r.Met = &met
}

// Num formats a figure with 3 significant digits or so.
func Num(v float64) string {
	a := math.Abs(v)
	switch {
	case a == 0:
		return "0"
	case a < 10:
		return fmt.Sprintf("%.2f", v)
	case a < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// RowsMarkdown renders rows as one table.
func RowsMarkdown(rows []Row) string {
	var b strings.Builder
	b.WriteString("| section | config | metric | condition | runs | median | min | max | unit | × reference | reference | target | load |\n")
	b.WriteString("|---|---|---|---|---:|---:|---:|---:|---|---:|---|---|---:|\n")
	for _, r := range rows {
		ratio, ref := "–", ""
		if r.Reference != "" {
			ratio = fmt.Sprintf("%.2f×", r.Ratio)
			if r.Ratio < 0.01 {
				ratio = "<0.01×"
			}
			ref = fmt.Sprintf("%s (%s)", r.Reference, Num(r.RefMedian))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Section, r.Config, r.Metric, r.Condition, r.Runs, Num(r.Median), Num(r.Min), Num(r.Max), r.Unit,
			ratio, ref, r.Target, r.Load)
	}
	return b.String()
}

// WriteReport prints a report's markdown and stores it as <dir>/<name>-<date>.md
// beside its JSON (v), returning the path without extension.
func WriteReport(dir, name string, started time.Time, md string, v any) (string, error) {
	fmt.Print(md)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base := filepath.Join(dir, name+"-"+started.Format("2006-01-02T150405Z"))
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(base+".md", []byte(md), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(base+".json", append(js, '\n'), 0o644); err != nil {
		return "", err
	}
	return base, nil
}
