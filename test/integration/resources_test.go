// Shared node resources: maps sized from maxPods, a pod's share of the
// hostPorts, cluster CIDRs that go with their last user, full maps that say
// so and leave nothing half-written, the maps' memory in status and the
// metrics.

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestResourcesHostPortLimitDefault: at the default settings (no sizing
// keys in the network) a pod asking for 1000 hostPorts is refused with 7
// naming the default limit, and leaves nothing; one with 32 gets them.
func TestResourcesHostPortLimitDefault(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.Extra = map[string]any{"capabilities": map[string]bool{"portMappings": true}}
	greedy := e.NewPod()
	e.CleanupDel(greedy, "greedy")
	var pms []testenv.PM
	for p := 20000; p < 21000; p++ {
		pms = append(pms, testenv.PM{HostPort: p, ContainerPort: 80, Protocol: "tcp"})
	}
	_, err := e.AddHP(greedy, "greedy", pms...)
	libcniErr(t, "ADD mapping 1000 hostPorts at the defaults", err, 7, "runtimeConfig.portMappings", "1000 mappings",
		fmt.Sprintf("maxHostPortsPerPod (%d)", maps.DefaultHostPortsPerPod))
	e.AssertNothingOf("greedy")
	if _, err := e.AddHP(greedy, "greedy", pms[:maps.DefaultHostPortsPerPod]...); err != nil {
		t.Fatalf("ADD with %d hostPorts at the defaults: %v", maps.DefaultHostPortsPerPod, err)
	}
	e.MustDel(greedy, "greedy")
	e.AssertNoHostPorts()
	e.AssertClean()
}

// TestResourcesHostPortLimit: a pod mapping hostPorts 1-65535 used to fill
// cni_hostports for the whole node. Now a pod gets maxHostPortsPerPod
// mappings and the map is sized so maxPods honest pods with that many each
// always fit: the greedy ADD is refused (7, naming the limit) leaving
// nothing, and then the node's pods take every entry of the map.
func TestResourcesHostPortLimit(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.Extra = map[string]any{"maxPods": 2, "maxHostPortsPerPod": 3, "capabilities": map[string]bool{"portMappings": true}}

	greedy := e.NewPod()
	e.CleanupDel(greedy, "greedy")
	all := make([]testenv.PM, 0, 65535)
	for p := 1; p <= 65535; p++ {
		all = append(all, testenv.PM{HostPort: p, ContainerPort: 80, Protocol: "tcp"})
	}
	_, err := e.AddHP(greedy, "greedy", all...)
	libcniErr(t, "ADD mapping hostPorts 1-65535", err, 7, "runtimeConfig.portMappings", "65535 mappings", "maxHostPortsPerPod (3)")
	e.AssertNothingOf("greedy")
	_, err = e.AddHP(greedy, "greedy", testenv.PM{HostPort: 1, ContainerPort: 80}, testenv.PM{HostPort: 2, ContainerPort: 80},
		testenv.PM{HostPort: 3, ContainerPort: 80}, testenv.PM{HostPort: 4, ContainerPort: 80})
	libcniErr(t, "ADD with one mapping over the limit", err, 7, "4 mappings", "maxHostPortsPerPod (3)")
	e.AssertNothingOf("greedy")

	// maxPods pods, each with its full share in both families: 12 entries.
	for i, id := range []string{"a", "b"} {
		p := e.NewPod()
		var pms []testenv.PM
		for j := 0; j < 3; j++ {
			pms = append(pms, testenv.PM{HostPort: 8000 + 10*i + j, ContainerPort: 80, Protocol: []string{"tcp", "udp"}[j%2]})
		}
		e.MustAddHP(p, id, pms...)
		defer e.MustDel(p, id)
	}
	m := e.Maps()
	if got := mapstest.Map(m, "cni_hostports").MaxEntries(); got != 2*3*2 {
		t.Fatalf("cni_hostports holds %d entries, want maxPods x maxHostPortsPerPod x 2 families = 12", got)
	}
	hps, err := m.HostPorts().List()
	if err != nil || len(hps) != 12 {
		t.Fatalf("hostPort entries of the two pods: %d (%v), want 12", len(hps), err)
	}
	// A third pod's hostPort finds the map full: the error names it and its
	// size, and the pod's first entries are undone with the rest.
	c := e.NewPod()
	e.CleanupDel(c, "c")
	_, err = e.AddHP(c, "c", testenv.PM{HostPort: 9000, ContainerPort: 80})
	libcniErr(t, "ADD of a pod beyond maxPods with a hostPort", err, 11, "cni_hostports holds at most 12 entries", "maxPods")
	if hps, _ := m.HostPorts().List(); len(hps) != 12 {
		t.Errorf("after the refused ADD: %d hostPort entries, want the 12 of the two pods", len(hps))
	}
	st := status(t, e)
	if !slices.ContainsFunc(st.Warnings, func(w string) bool { return strings.Contains(w, "map cni_hostports is 100% full (12 of 12 entries)") }) {
		t.Errorf("status does not warn that cni_hostports is full: %v", st.Warnings)
	}
	if !st.Healthy {
		t.Errorf("a full map made status unhealthy: %v", st.Problems)
	}
}

// status runs `ebpf-agent status -o json` on the env's node.
func status(t *testing.T, e *testenv.Env) *inspect.StatusReport {
	t.Helper()
	out, err := e.AgentCmd("status", "-o", "json", "--pin-dir", e.PinDir, "--state-dir", e.StateDir)
	var st inspect.StatusReport
	if jerr := json.Unmarshal([]byte(out), &st); jerr != nil {
		t.Fatalf("status: %v, %v\n%s", err, jerr, out)
	}
	return &st
}

// usageOf is one map's row of a status report.
func usageOf(t *testing.T, st *inspect.StatusReport, name string) maps.Usage {
	t.Helper()
	i := slices.IndexFunc(st.Maps, func(u maps.Usage) bool { return u.Name == name })
	if i < 0 {
		t.Fatalf("status lists no map %s", name)
	}
	return st.Maps[i]
}

// TestResourcesMapsFull: with maxPods 1 (two attachments, four addresses)
// the third dual-stack pod finds cni_links full; pre-filled endpoint, limit
// and hostPort tables refuse the pod that needs them. Each error is code 11
// naming the map and its size, and the refused ADD leaves nothing: no veth,
// record, address, map entry, limit or hostPort of its own. status warns
// about a map above 90% full and the metrics export every map's fill.
func TestResourcesMapsFull(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.Extra = map[string]any{"maxPods": 1}
	for _, id := range []string{"a", "b"} {
		p := e.NewPod()
		e.CleanupDel(p, id)
		e.Add(p, id)
	}
	c := e.NewPod()
	e.CleanupDel(c, "c")
	_, err := e.AddV("1.1.0", c, "c", "eth0")
	libcniErr(t, "third pod with maxPods 1", err, 11, "cni_links holds at most 2 entries (its size follows maxPods)")
	e.AssertNothingOfPod("c", 4)

	st := status(t, e)
	for _, name := range []string{"cni_links", "cni_endpoints"} {
		if u := usageOf(t, st, name); u.Fill() != 1 {
			t.Errorf("%s: fill %.2f (%d of %d), want 1", name, u.Fill(), u.Entries, u.MaxEntries)
		}
		if !slices.ContainsFunc(st.Warnings, func(w string) bool { return strings.HasPrefix(w, "map "+name+" is 100% full") }) {
			t.Errorf("status does not warn that %s is full: %v", name, st.Warnings)
		}
	}
	if slices.ContainsFunc(st.Warnings, func(w string) bool { return strings.Contains(w, "cni_stats") }) {
		t.Errorf("status warns about a map that is not full: %v", st.Warnings)
	}
	confDir := e.WriteConfDir()
	e.StartAgent(confDir, "--metrics-addr", "127.0.0.1:9965")
	body := scrape(t, e, "127.0.0.1:9965")
	for _, want := range []string{
		`ebpf_cni_map_fill_ratio{map="cni_links"} 1`,
		`ebpf_cni_map_fill_ratio{map="cni_endpoints"} 1`,
		`ebpf_cni_map_max_entries{map="cni_endpoints"} 4`,
		`ebpf_cni_map_entries{map="cni_endpoints"} 4`,
		`ebpf_cni_map_memlock_bytes{map="cni_stats"}`,
		`ebpf_cni_maps_memlock_full_bytes`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	e.MustDel(nil, "b")

	// Room for one pod again in cni_links, but cni_endpoints is full (two
	// entries of another network's pod behind lo, alive): the pod's link
	// entry goes with the refused ADD.
	m := e.Maps()
	for _, ip := range []string{"10.98.0.1", "fd00:98::1"} {
		must(t, m.Endpoints().Insert(net.ParseIP(ip), maps.NewEndpointInfo(1, nil, nil), func(int) bool { return true }))
	}
	_, err = e.AddV("1.1.0", c, "c", "eth0")
	libcniErr(t, "ADD, cni_endpoints full", err, 11, "cni_endpoints holds at most 4 entries (its size follows maxPods)")
	e.AssertNothingOfPod("c", 4)
	if n := countLinks(t, m); n != 1 {
		t.Errorf("%d entries in cni_links, want a's alone", n)
	}
	for _, ip := range []string{"10.98.0.1", "fd00:98::1"} {
		must(t, m.Endpoints().Delete(net.ParseIP(ip), 1))
	}

	// The limit and hostPort tables full (entries of interfaces that do
	// not exist, as a leak would leave).
	for i := 0; m.Bandwidth().PutLimit(100000+i, maps.DirEgress, maps.Limit{RateBps: 1e6, BurstBits: 1e5}) == nil; i++ {
	}
	_, err = e.AddBW(c, "c", bandwidthArgs(5e6, 5e6))
	libcniErr(t, "ADD with a limit, cni_bandwidth full", err, 11, "cni_bandwidth holds at most 4 entries")
	e.AssertNothingOfPod("c", 2)
	for _, l := range mustLimits(t, m) {
		if l.Ifindex < 100000 {
			t.Errorf("a limit of the refused pod was left: %+v", l)
		}
	}
	for _, l := range mustLimits(t, m) {
		must(t, m.Bandwidth().DeleteLimits(int(l.Ifindex)))
	}

	// cni_hostports holds 1 x 32 x 2 = 64 entries: 63 taken, the pod wants
	// two (IPv4 and IPv6): the first goes in, the second does not, and the
	// first is undone.
	for i := 0; i < 63; i++ {
		must(t, m.HostPorts().Insert(maps.HostPort{Proto: maps.ProtoTCP, HostPort: uint16(20000 + i), PodIP: net.ParseIP("10.99.0.1").To4(), PodPort: 80, Ifindex: 100000}))
	}
	e.Extra["capabilities"] = map[string]bool{"portMappings": true}
	_, err = e.AddHP(c, "c", testenv.PM{HostPort: 8080, ContainerPort: 80})
	libcniErr(t, "ADD with a hostPort, cni_hostports full", err, 11, "cni_hostports holds at most 64 entries")
	e.AssertNothingOfPod("c", 2)
	hps, _ := m.HostPorts().List()
	for _, h := range hps {
		if h.HostPort == 8080 {
			t.Errorf("hostPort entry of the refused pod left: %s", h.Listen())
		}
	}
	if len(hps) != 63 {
		t.Errorf("%d hostPort entries, want the 63 put there", len(hps))
	}
	for _, h := range hps {
		must(t, m.HostPorts().Delete(h))
	}
	e.MustDel(nil, "a")
	e.AssertClean()
}

func countLinks(t *testing.T, m *maps.Maps) int {
	t.Helper()
	links, err := m.Links().Ifindexes()
	must(t, err)
	return len(links)
}

func mustLimits(t *testing.T, m *maps.Maps) []maps.LimitEntry {
	t.Helper()
	ls, err := m.Bandwidth().ListLimits()
	must(t, err)
	return ls
}

// scrape reads the agent's metrics, dialling from the node netns.
func scrape(t *testing.T, e *testenv.Env, addr string) string {
	t.Helper()
	var body string
	err := e.InNode(func() error {
		var (
			c   net.Conn
			err error
		)
		for i := 0; i < 50; i++ { // the listener comes up just after "ready"
			if c, err = net.Dial("tcp", addr); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			return err
		}
		defer c.Close()
		req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
		if err := req.Write(c); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err
	})
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return body
}

// TestResourcesSizing: the maps are sized from maxPods once, by whoever
// pins them first; an ADD whose network asks for other sizes, or an agent
// whose flags do, is refused naming both, and the agent takes the
// networks' sizing when given none. The footprint status reports is the
// kernel's own figure, and on a 64-CPU node at the default sizing every
// map full stays within 32 MiB.
func TestResourcesSizing(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.Extra = map[string]any{"maxPods": 250}
	a := e.NewPod()
	e.CleanupDel(a, "a")
	e.Add(a, "a")
	if err := testenv.Ping(a, testenv.NodeIP4, 2); err != nil { // counters: entries of cni_stats
		t.Fatal(err)
	}
	st := status(t, e)
	if st.Sizing == nil || *st.Sizing != (maps.Sizing{MaxPods: 250, HostPortsPerPod: maps.DefaultHostPortsPerPod}) {
		t.Fatalf("status: sized for %+v, want maxPods 250", st.Sizing)
	}
	if u := usageOf(t, st, "cni_links"); u.MaxEntries != 500 {
		t.Errorf("cni_links holds %d entries with maxPods 250, want 500", u.MaxEntries)
	}
	var sum uint64
	for _, u := range st.Maps {
		sum += u.Memlock + u.InnerMemlock // a map of maps counts its tables (cni_stack_flow_parts)
	}
	if sum != st.Memory.MemlockBytes || sum == 0 || st.Memory.FullBytes < sum {
		t.Errorf("memory: %d now, %d full; the maps sum to %d", st.Memory.MemlockBytes, st.Memory.FullBytes, sum)
	}
	if u := usageOf(t, st, "cni_stats"); u.Entries < 2 || u.Flags&1 == 0 {
		t.Errorf("cni_stats: %d entries, flags %d: want the pod's counters in a map that is not preallocated", u.Entries, u.Flags)
	}

	b := e.NewPod()
	e.CleanupDel(b, "b")
	e.Extra = map[string]any{"maxPods": 110}
	_, err := e.AddV("1.1.0", b, "b", "eth0")
	libcniErr(t, "ADD asking for maxPods 110 of a datapath sized for 250", err, 7,
		"sized for maxPods 250, maxHostPortsPerPod 32", "asks for maxPods 110, maxHostPortsPerPod 32", "must agree")
	e.AssertNothingOfPod("b", 2)
	libcniErr(t, "CHECK with maxPods 110 of a datapath sized for 250", e.Check(a, "a", "eth0"), 7, "sized for maxPods 250")
	if err := e.Del(a, "a", "eth0"); err != nil { // DEL works whatever the network's sizing says
		t.Errorf("DEL with another maxPods: %v", err)
	}

	e.Extra = map[string]any{"maxPods": 250}
	confDir := e.WriteConfDir()
	out, err := e.AgentCmd(append([]string{"run", "--metrics-addr", "", "--max-pods", "100"}, e.AgentArgs(confDir)...)...)
	if err == nil || !strings.Contains(out, "the agent's flags size the datapath") || !strings.Contains(out, "maxPods 250") {
		t.Errorf("agent with --max-pods 100 beside networks of 250: %v\n%s", err, out)
	}
	// An agent with no network to follow, whose flags disagree with the
	// pins: refused naming both; the pins keep their size.
	out, err = e.AgentCmd(append([]string{"run", "--metrics-addr", "", "--max-pods", "100"}, e.AgentArgs(t.TempDir())...)...)
	if err == nil || !strings.Contains(out, "was sized for maxPods 250") || !strings.Contains(out, "asks for maxPods 100") {
		t.Errorf("agent with --max-pods 100 and no network, over pins of 250: %v\n%s", err, out)
	}
	if u := usageOf(t, status(t, e), "cni_links"); u.MaxEntries != 500 {
		t.Errorf("cni_links holds %d entries after the refused agent, want 500", u.MaxEntries)
	}
	ag := e.StartAgent(confDir, "--metrics-addr", "")
	if !strings.Contains(ag.Log.String(), "sized for maxPods 250, maxHostPortsPerPod 32") {
		t.Errorf("the agent did not take the networks' sizing:\n%s", ag.Log)
	}
	e.AssertClean()
}
