// Command testlog reads `go test -json` on stdin and prints what a plain
// `go test` prints (each package's result, the whole output of every test
// that failed or never finished, build errors), then the slowest tests: CI
// runs near its time budget, and a plain run tells no test's time.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of test2json's output.
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// timing is one top-level test's time.
type timing struct {
	name    string
	elapsed float64
}

// log gathers a run: each running test's output until it ends.
type log struct {
	out     io.Writer
	pending map[string][]string // package + "\x00" + test: its output so far
	times   []timing
}

func main() {
	l := &log{out: os.Stdout, pending: map[string][]string{}}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Fprintln(l.out, sc.Text()) // not test2json's: as it came
			continue
		}
		l.take(&e)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "testlog: reading stdin: %v\n", err)
	}
	l.unfinished("")
	l.slowest(25)
}

// take handles one event.
func (l *log) take(e *event) {
	if e.Test == "" {
		if e.Output != "" && e.Output != "PASS\n" { // a plain run prints only "ok"
			fmt.Fprint(l.out, e.Output)
		}
		if e.Action == "fail" || e.Action == "pass" || e.Action == "skip" {
			l.unfinished(e.Package)
		}
		return
	}
	key := e.Package + "\x00" + e.Test
	switch e.Action {
	case "output":
		l.pending[key] = append(l.pending[key], e.Output)
	case "fail":
		fmt.Fprint(l.out, strings.Join(l.pending[key], ""))
		delete(l.pending, key)
	case "pass", "skip":
		delete(l.pending, key)
	}
	if (e.Action == "pass" || e.Action == "fail") && !strings.Contains(e.Test, "/") {
		l.times = append(l.times, timing{shortPkg(e.Package) + "." + e.Test, e.Elapsed})
	}
}

// unfinished prints the output of the tests of pkg ("": any) that never
// ended: a timeout's or a crash's, whose stack names the test.
func (l *log) unfinished(pkg string) {
	keys := make([]string, 0, len(l.pending))
	for k := range l.pending {
		if pkg == "" || strings.HasPrefix(k, pkg+"\x00") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(l.out, "testlog: %s did not finish; its output:\n", strings.ReplaceAll(k, "\x00", " "))
		fmt.Fprint(l.out, strings.Join(l.pending[k], ""))
		delete(l.pending, k)
	}
}

// slowest prints the n slowest top-level tests.
func (l *log) slowest(n int) {
	sort.Slice(l.times, func(i, j int) bool { return l.times[i].elapsed > l.times[j].elapsed })
	if len(l.times) < n {
		n = len(l.times)
	}
	if n == 0 {
		return
	}
	total := 0.0
	for _, t := range l.times {
		total += t.elapsed
	}
	fmt.Fprintf(l.out, "\nthe %d slowest of %d tests (all together %.0f s):\n", n, len(l.times), total)
	for _, t := range l.times[:n] {
		fmt.Fprintf(l.out, "%8.1f s  %s\n", t.elapsed, t.name)
	}
}

// shortPkg is the package path after the module's.
func shortPkg(p string) string {
	if i := strings.Index(p, "/ebpf-cni/ebpf-cni/"); i >= 0 {
		return p[i+len("/ebpf-cni/ebpf-cni/"):]
	}
	return p
}
