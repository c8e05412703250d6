// Command benchall is `make bench`: the whole benchmark suite in one go,
// test/bench (ADD/DEL latency, at scale, hostPort scale and connections/s,
// throughput, memory) then test/bwbench (bandwidth accuracy and latency
// under load), and one combined table of every figure with its spread and
// its ratio to the reference measured in the same run.
//
// Run from the repository root, as root:
//
//	go run ./test/benchall           # full: about 13-15 minutes on 2 cores
//	go run ./test/benchall -quick    # -quick everywhere: about 4 minutes
//
// It writes results/bench-<date>.md and .json (the combined table, with the
// date, kernel, commit, commands and load averages) and keeps the two
// detailed reports in results/bench-<date>/. Each benchmark cleans up after
// itself (namespaces, pin directories, processes), also on failure and on
// SIGINT/SIGTERM, which this driver passes on.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/internal/benchkit"
)

type step struct {
	Name    string   `json:"name"`
	Command string   `json:"command"`
	Args    []string `json:"-"`
	Elapsed string   `json:"elapsed"`
	Report  string   `json:"report"`
	// LoadStart and LoadEnd are the 1/5/15 min load averages around it.
	LoadStart string `json:"loadavgStart"`
	LoadEnd   string `json:"loadavgEnd"`
}

type combined struct {
	Date      string         `json:"date"`
	Kernel    string         `json:"kernel"`
	CPUs      int            `json:"cpus"`
	Go        string         `json:"go"`
	Iperf3    string         `json:"iperf3"`
	Commit    string         `json:"commit"`
	Command   string         `json:"command"`
	Quick     bool           `json:"quick"`
	Elapsed   string         `json:"elapsed"`
	LoadStart string         `json:"loadavgStart"`
	LoadEnd   string         `json:"loadavgEnd"`
	Steps     []step         `json:"steps"`
	Rows      []benchkit.Row `json:"rows"`
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "benchall: "+format+"\n", a...)
}

func main() {
	fs := flag.NewFlagSet("benchall", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "pass -quick to every benchmark")
	out := fs.String("out", "results", "results directory")
	benchArgs := fs.String("bench-args", "-attach-tc", "extra arguments for test/bench (space-separated)")
	bwArgs := fs.String("bwbench-args", "", "extra arguments for test/bwbench (space-separated)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./test/benchall [flags]   (as root, from the repository root)\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "benchall: must run as root (network namespaces, BPF, mounts)")
		os.Exit(1)
	}
	// Pdeathsig of the children is delivered when the forking thread dies: keep it alive.
	runtime.LockOSThread()
	os.Exit(run(*quick, *out, strings.Fields(*benchArgs), strings.Fields(*bwArgs)))
}

func run(quick bool, out string, benchArgs, bwArgs []string) int {
	start := time.Now()
	now := start.UTC()
	stamp := now.Format("2006-01-02T150405Z")
	c := &combined{
		Date: now.Format(time.RFC3339), Kernel: benchkit.KernelRelease(), CPUs: runtime.NumCPU(),
		Go: benchkit.GoVersion(), Iperf3: benchkit.IperfVersion(), Commit: benchkit.GitCommit(),
		Command: benchkit.CommandLine(), Quick: quick, LoadStart: benchkit.Loadavg(),
	}
	root, err := benchkit.ModuleRoot()
	if err != nil {
		logf("%v", err)
		return 1
	}
	runDir := filepath.Join(out, "bench-"+stamp)
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		logf("%v", err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "ebpfbenchall-")
	if err != nil {
		logf("%v", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	logf("building test/bench and test/bwbench into %s", tmp)
	build := exec.CommandContext(context.Background(), "go", "build", "-o", tmp+"/", "./test/bench", "./test/bwbench")
	build.Dir = root
	if b, err := build.CombinedOutput(); err != nil {
		logf("go build: %v\n%s", err, b)
		return 1
	}
	q := []string{}
	if quick {
		q = append(q, "-quick")
	}
	c.Steps = []step{
		{Name: "bench", Args: append(append(append([]string{}, q...), benchArgs...), "-out", runDir)},
		{Name: "bwbench", Args: append(append(append([]string{}, q...), bwArgs...), "-out", runDir)},
	}
	for i := range c.Steps {
		s := &c.Steps[i]
		s.Command = "go run ./test/" + s.Name + " " + benchkit.Quote(s.Args)
		s.LoadStart = benchkit.Loadavg()
		logf("running %s (load %s)", s.Command, s.LoadStart)
		t := time.Now()
		cmd := exec.Command(filepath.Join(tmp, s.Name), s.Args...)
		cmd.Dir = root
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		code := benchkit.RunRelayed("benchall", cmd, "start "+s.Name)
		s.Elapsed = time.Since(t).Round(time.Second).String()
		s.LoadEnd = benchkit.Loadavg()
		if code != 0 {
			if os.Remove(runDir) == nil { // empty: nothing to keep
				logf("%s failed (exit %d) after %s", s.Name, code, s.Elapsed)
			} else {
				logf("%s failed (exit %d) after %s; the reports written so far are in %s", s.Name, code, s.Elapsed, runDir)
			}
			return code
		}
		logf("%s done in %s", s.Name, s.Elapsed)
	}
	for i, prefix := range []string{"cni-", "bandwidth-"} {
		path, rows, err := readRows(runDir, prefix)
		if err != nil {
			logf("%v", err)
			return 1
		}
		c.Steps[i].Report = path
		c.Rows = append(c.Rows, rows...)
	}
	c.Elapsed = time.Since(start).Round(time.Second).String()
	c.LoadEnd = benchkit.Loadavg()
	md := c.markdown()
	fmt.Print(md)
	base := filepath.Join(out, "bench-"+stamp)
	js, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		logf("%v", err)
		return 1
	}
	if err := os.WriteFile(base+".md", []byte(md), 0o644); err != nil {
		logf("%v", err)
		return 1
	}
	if err := os.WriteFile(base+".json", append(js, '\n'), 0o644); err != nil {
		logf("%v", err)
		return 1
	}
	logf("wrote %s.md and %s.json (details in %s) in %s", base, base, runDir, c.Elapsed)
	return 0
}

// readRows reads the rows of the one JSON report in dir named prefix*.json.
func readRows(dir, prefix string) (string, []benchkit.Row, error) {
	matches, _ := filepath.Glob(filepath.Join(dir, prefix+"*.json"))
	if len(matches) != 1 {
		return "", nil, fmt.Errorf("want one %s*.json in %s, found %d", prefix, dir, len(matches))
	}
	data, err := os.ReadFile(matches[0])
	if err != nil {
		return "", nil, err
	}
	var r struct {
		Rows []benchkit.Row `json:"rows"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return "", nil, fmt.Errorf("%s: %w", matches[0], err)
	}
	return strings.TrimSuffix(matches[0], ".json") + ".md", r.Rows, nil
}

func (c *combined) markdown() string {
	var b strings.Builder
	mode := "full"
	if c.Quick {
		mode = "quick"
	}
	fmt.Fprintf(&b, "# ebpf-cni benchmark suite (%s)\n\n", mode)
	fmt.Fprintf(&b, "- date: %s\n", c.Date)
	fmt.Fprintf(&b, "- kernel: %s (%d CPUs)\n", c.Kernel, c.CPUs)
	fmt.Fprintf(&b, "- go: %s; %s\n", c.Go, c.Iperf3)
	fmt.Fprintf(&b, "- commit: %s\n", c.Commit)
	fmt.Fprintf(&b, "- command: `%s`, which ran:\n", c.Command)
	for _, s := range c.Steps {
		fmt.Fprintf(&b, "  - `%s` (%s; load average %s at start, %s at end; details: %s)\n", s.Command, s.Elapsed, s.LoadStart, s.LoadEnd, s.Report)
	}
	fmt.Fprintf(&b, "- total: %s; load average (1/5/15 min) at start: %s; at end: %s\n", c.Elapsed, c.LoadStart, c.LoadEnd)
	fmt.Fprintf(&b, "- reference plugins: containernetworking/plugins and cnitool at the versions go.mod pins, built with `go build`; every plugin driven through cnitool in throwaway namespaces\n")
	fmt.Fprintf(&b, "- median, min and max are over the runs; × reference compares medians of the same run; load is the 1-minute load average when the row was measured (where recorded)\n\n")
	b.WriteString(benchkit.RowsMarkdown(c.Rows))
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
