package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseDepends(t *testing.T) {
	out := `debconf-user
 |Depends: debconf
  Depends: <debconf-2.0>
    cdebconf
  Depends: libc6
  Recommends: bogus
curl
  Depends: libc6
  PreDepends: libcurl4
 |Depends: <awk>
 |Depends: mawk
  Depends: gawk
  Depends: zlib1g:any
`
	got := parseDepends([]byte(out))
	want := []string{"debconf", "libc6", "libc6", "libcurl4", "zlib1g"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parseDepends = %v, want %v (first alternative only, no virtual, no Recommends)", got, want)
	}
}

func TestReadJUnit(t *testing.T) {
	xml := `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="6" failures="2">
  <testsuite name="Kubernetes e2e suite" tests="6">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.5"></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for the cluster [Conformance]" status="passed" time="2.1"></testcase>
    <testcase name="[It] [sig-network] Services should serve multiport endpoints from pods" status="failed" time="130">
      <failure message="service is not reachable within 2m0s timeout on endpoint multi-endpoint-test:80 over TCP protocol" type="failed">long
text</failure>
    </testcase>
    <testcase name="[It] [sig-storage] something filtered out" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-network] Services should work with 3 nodes" status="skipped" time="0.1"><skipped message="skipped - Requires at least 3 nodes (not 2)"></skipped></testcase>
    <testcase name="[SynchronizedAfterSuite]" status="failed" time="0.2"><failure message="cleanup failed"></failure></testcase>
  </testsuite>
</testsuites>`
	f := filepath.Join(t.TempDir(), "junit.xml")
	if err := os.WriteFile(f, []byte(xml), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := readJUnit(f)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range r.specs {
		got[s.Name] = s.State + ": " + s.Message
	}
	want := map[string]string{
		"[SynchronizedAfterSuite]": "failed: cleanup failed",
		"[sig-network] DNS should provide DNS for the cluster [Conformance]": "passed: ",
		"[sig-network] Services should serve multiport endpoints from pods":  "failed: service is not reachable within 2m0s timeout on endpoint multi-endpoint-test:80 over TCP protocol",
		"[sig-network] Services should work with 3 nodes":                    "skipped: Requires at least 3 nodes (not 2)",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("readJUnit:\n got %v\nwant %v", got, want)
	}
	if p, fl, s := r.counts(); p != 1 || fl != 2 || s != 1 {
		t.Fatalf("counts = %d passed, %d failed, %d skipped; want 1, 2, 1", p, fl, s)
	}
	r.leaks = []string{"mount /x"}
	if _, fl, _ := r.counts(); fl != 3 {
		t.Fatalf("a leak must count as a failure: %d failed", fl)
	}
}

func TestDefaultSkipCoversTheBrief(t *testing.T) {
	s := defaultSkip()
	for _, re := range []string{`\[Slow\]`, `\[Serial\]`, `\[Disruptive\]`, `\[Flaky\]`, `\[Feature:`, `LoadBalancer`, `[Cc]loud`} {
		if !strings.Contains(s, re) {
			t.Errorf("default skip %q lacks %q", s, re)
		}
	}
}
