package main

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// runE2E runs e2e.test under the ginkgo CLI (parallel processes) in the
// control-plane namespace, and reads back its JUnit report.
func (c *cluster) runE2E(ctx context.Context) (*results, error) {
	repDir := filepath.Join(c.o.out, "e2e")
	if err := os.MkdirAll(repDir, 0o755); err != nil {
		return nil, err
	}
	junit := filepath.Join(c.o.out, "junit.xml") // ginkgo writes it under --output-dir
	args := []string{"nsenter", "-t", strconv.Itoa(c.cp.cmd.Process.Pid), "-n", "--",
		c.a.path("ginkgo"), "--procs", strconv.Itoa(c.o.procs), "--timeout", c.o.timeout.String(),
		"--focus", c.o.focus, "--skip", c.o.skip, "--no-color", "-v",
		"--junit-report", filepath.Base(junit), "--output-dir", c.o.out,
		c.a.path("e2e.test"), "--",
		"--kubeconfig", c.admin, "--provider", "skeleton", "--num-nodes", strconv.Itoa(numNodes),
		"--kubectl-path", c.a.path("kubectl"), "--report-dir", repDir, "--e2e-output-dir", repDir,
		"--disable-log-dump", "--dns-domain", "cluster.local",
	}
	logf("e2e.test: focus %q, skip %q, %d processes (log: %s)", c.o.focus, c.o.skip, c.o.procs, filepath.Join(c.o.out, "e2e.log"))
	lf, err := os.Create(filepath.Join(c.o.out, "e2e.log"))
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = repDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		// The log whole; on the terminal, ginkgo's one line per finished spec.
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		mark := "" // "• [FAILED] [2.1 seconds]": the spec's name is the next line
		for sc.Scan() {
			l := sc.Text()
			fmt.Fprintln(lf, l)
			switch {
			case mark != "":
				logf("  %s %s", mark, l)
				mark = ""
			case strings.HasPrefix(l, "• "):
				mark = l
			case strings.HasPrefix(l, "Ran "):
				logf("  %s", l)
			}
		}
	}()
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait(); pw.Close() }()
	var runErr error
	select {
	case runErr = <-waitErr:
	case <-ctx.Done():
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) // ginkgo reports what ran so far
		select {
		case <-waitErr:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-waitErr
		}
		runErr = ctx.Err()
	}
	res, err := readJUnit(junit)
	if err != nil {
		if runErr != nil {
			return nil, fmt.Errorf("ginkgo: %v; and no report: %w", runErr, err)
		}
		return nil, err
	}
	res.cni, res.focus, res.skip, res.k8s = c.o.cni, c.o.focus, c.o.skip, c.a.k8sVersion
	if runErr != nil && ctx.Err() != nil {
		return res, runErr
	}
	// ginkgo exits non-zero when a spec failed: the table says which.
	return res, nil
}

type specResult struct {
	Name    string  `json:"name"`
	State   string  `json:"state"` // passed, failed, skipped (at run time, with a reason)
	Seconds float64 `json:"seconds"`
	Message string  `json:"message,omitempty"`
}

type results struct {
	cni, focus, skip, k8s string
	specs                 []specResult
	leaks                 []string
}

type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

var itPrefix = regexp.MustCompile(`^\[It\]\s*`)

// readJUnit keeps the specs that ran (passed, failed, or skipped by the spec
// itself with a reason), not the thousands the focus filtered out, nor
// ginkgo's suite nodes.
func readJUnit(path string) (*results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var j junitSuites
	if err := xml.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r := &results{}
	for _, s := range j.Suites {
		for _, tc := range s.Cases {
			if !strings.HasPrefix(tc.Name, "[It]") {
				if tc.Status == "failed" || tc.Failure != nil {
					// A failed BeforeSuite/AfterSuite fails the run too.
					r.specs = append(r.specs, specResult{Name: tc.Name, State: "failed", Seconds: tc.Time, Message: failureText(tc.Failure, tc.Error)})
				}
				continue
			}
			sr := specResult{Name: itPrefix.ReplaceAllString(tc.Name, ""), Seconds: tc.Time}
			switch {
			case tc.Failure != nil || tc.Error != nil || tc.Status == "failed" || tc.Status == "panicked" || tc.Status == "timedout" || tc.Status == "interrupted":
				sr.State, sr.Message = "failed", failureText(tc.Failure, tc.Error)
			case tc.Skipped != nil || tc.Status == "skipped" || tc.Status == "pending":
				msg := ""
				if tc.Skipped != nil {
					msg = strings.TrimSpace(strings.TrimPrefix(tc.Skipped.Message, "skipped"))
					msg = strings.TrimSpace(strings.TrimPrefix(msg, "-"))
				}
				if msg == "" {
					continue // filtered out by focus/skip
				}
				sr.State, sr.Message = "skipped", msg
			default:
				sr.State = "passed"
			}
			r.specs = append(r.specs, sr)
		}
	}
	sort.Slice(r.specs, func(i, k int) bool { return r.specs[i].Name < r.specs[k].Name })
	return r, nil
}

func failureText(f *struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}, e *struct {
	Message string `xml:"message,attr"`
}) string {
	msg := ""
	if f != nil {
		msg = f.Message
	}
	if msg == "" && e != nil {
		msg = e.Message
	}
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > 400 {
		msg = msg[:400] + "..."
	}
	return msg
}

func (r *results) counts() (p, f, s int) {
	for _, sp := range r.specs {
		switch sp.State {
		case "passed":
			p++
		case "failed":
			f++
		default:
			s++
		}
	}
	if len(r.leaks) > 0 {
		f++
	}
	return
}

func (r *results) write(o options, c *cluster, total time.Duration) error {
	p, f, s := r.counts()
	var md strings.Builder
	fmt.Fprintf(&md, "# sig-network e2e: %s on Kubernetes %s, %d nodes\n\n", r.cni, r.k8s, numNodes)
	fmt.Fprintf(&md, "topology: %s\n\n", o.topology())
	fmt.Fprintf(&md, "%d passed, %d failed, %d skipped; whole run %s (%s).\n\n", p, f, s, total.Round(time.Second), time.Now().Format(time.RFC3339))
	fmt.Fprintf(&md, "focus `%s`\n\nskip `%s`\n\n", r.focus, r.skip)
	md.WriteString("| spec | result | seconds |\n|---|---|---|\n")
	for _, sp := range r.specs {
		res := sp.State
		if sp.Message != "" {
			res += ": " + strings.ReplaceAll(sp.Message, "|", "\\|")
		}
		fmt.Fprintf(&md, "| %s | %s | %.0f |\n", strings.ReplaceAll(sp.Name, "|", "\\|"), res, sp.Seconds)
	}
	if len(r.leaks) > 0 {
		md.WriteString("\n## Left behind after teardown\n\n")
		for _, l := range r.leaks {
			fmt.Fprintf(&md, "- %s\n", l)
		}
	}
	if err := os.WriteFile(filepath.Join(o.out, "summary.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(map[string]any{
		"cni": r.cni, "kubernetes": r.k8s, "nodes": numNodes, "focus": r.focus, "skip": r.skip,
		"topology": o.topology(), "dualStack": o.dualStack,
		"passed": p, "failed": f, "skipped": s, "seconds": int(total.Seconds()),
		"specs": r.specs, "leaks": r.leaks,
	}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "results.json"), js, 0o644); err != nil {
		return err
	}
	logf("results: %s (summary.md, results.json, junit.xml, e2e.log, logs/)", o.out)
	for _, sp := range r.specs {
		if sp.State == "failed" {
			logf("  FAILED %s", sp.Name)
		}
	}
	return nil
}
