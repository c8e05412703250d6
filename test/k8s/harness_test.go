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

// The agent's routes as checkAgentRoutes reads them (ip route show proto
// 199 lines of both kinds) and as it expects them per -tunnel mode.
func TestPeerRoutes(t *testing.T) {
	for line, want := range map[string]string{
		"10.244.1.0/24 via 10.255.0.12 dev eth0": "10.244.1.0/24 via 10.255.0.12",
		"10.244.1.0/24 encap ip id 1 dst 10.255.1.12 ttl 64 dev ebpf-tun scope link src 10.255.0.11 mtu lock 1430": "10.244.1.0/24 tunnel ebpf-tun to 10.255.1.12",
		"fd00:10:244:1::/64 encap ip id 1 dst 10.255.1.12 ttl 64 dev ebpf-tun metric 1024 pref medium":             "fd00:10:244:1::/64 tunnel ebpf-tun to 10.255.1.12",
		"blackhole 10.244.0.0/24": "",
	} {
		if got := peerRoute(line); got != want {
			t.Errorf("peerRoute(%q) = %q, want %q", line, got, want)
		}
	}
	n1 := &node{name: "node1", ip: "10.255.0.11", ip6: "fd00:255::11"}
	n2 := &node{name: "node2", ip: "10.255.1.12", ip6: "fd00:255:0:1::12", subnet: 1}
	for _, tc := range []struct {
		o          options
		cidr, want string
	}{
		{options{}, "fd00:10:244:1::/64", "fd00:10:244:1::/64 via fd00:255:0:1::12"},
		{options{subnets: true, tunnel: "vxlan"}, "fd00:10:244:1::/64", "fd00:10:244:1::/64 tunnel ebpf-tun to 10.255.1.12"},
		{options{subnets: true, tunnel: "hybrid"}, "10.244.1.0/24", "10.244.1.0/24 tunnel ebpf-tun to 10.255.1.12"},
	} {
		c := &cluster{o: tc.o}
		if got := c.wantPeerRoute(n1, n2, tc.cidr); got != tc.want {
			t.Errorf("%+v: wantPeerRoute = %q, want %q", tc.o, got, tc.want)
		}
	}
}

// -tunnel's flags land in the agent's arguments of deploy/ebpf-cni.yaml.
func TestTunnelArgs(t *testing.T) {
	b, err := os.ReadFile("../../deploy/ebpf-cni.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{o: options{tunnel: "hybrid"}}
	m, err := c.tunnelArgs(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m, "            - --network-policy\n            - --tunnel=vxlan\n            - --tunnel-hybrid\n") {
		t.Fatalf("no --tunnel=vxlan --tunnel-hybrid after --network-policy in the rendered manifest")
	}
}
