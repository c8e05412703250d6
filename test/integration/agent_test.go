// The agent: restart and upgrade without loss, reconcile, the dumps, status
// and metrics, a foreign pin directory refused.

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"

	"bytes"

	current "github.com/containernetworking/cni/pkg/types/100"
)

// TestAgentRestartAndUpgradeWithoutLoss: pings and a TCP stream between two
// pods keep flowing, with zero loss, while the agent is started, killed with
// -9, restarted, and the programs of every attachment are swapped in place.
func TestAgentRestartAndUpgradeWithoutLoss(t *testing.T) {
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "a")
	e.CleanupDel(b, "b")
	e.Add(a, "a")
	rb := e.Add(b, "b")
	b4, _ := testenv.PodIPs(t, rb)
	confDir := e.WriteConfDir()
	_, idxA := e.HostVeth("a")
	before := e.ProgIDs(idxA)

	// 3000 echoes, 2 ms apart: ~6 s of traffic across every step below.
	pingDone := make(chan string, 1)
	go func() {
		var out []byte
		a.Do(func(ns.NetNS) error {
			out, _ = exec.Command("ping", "-c", "3000", "-i", "0.002", "-W", "1", "-q", b4.String()).CombinedOutput()
			return nil
		})
		pingDone <- string(out)
	}()
	tcpDone := make(chan error, 1)
	go func() { tcpDone <- testenv.TCPTransfer(a, b, b4, 64<<20) }()

	// Start, kill and restart the agent while both flows are under way.
	m := e.Maps()
	deadline := time.Now().Add(5 * time.Second)
	for counter(t, m, idxA, maps.DirEgress, maps.ReasonRedirect).Packets < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("traffic between the pods is not flowing: %s", dumpCounters(m, idxA))
		}
		time.Sleep(5 * time.Millisecond)
	}
	ag := e.StartAgent(confDir, "--metrics-addr", "")
	ag.Cmd.Process.Signal(syscall.SIGKILL)
	ag.Exited(10 * time.Second)
	ag = e.StartAgent(confDir, "--metrics-addr", "")
	// ADD without an agent left both pods on cls_bpf waiting for tcx: the
	// agent moves them first (an upgrade in the middle of a move is
	// TestUpgradeSwapsEveryAttachState's), so the swap count below is the
	// 4 tcx links'.
	if !forced(datapath.FeatTCX) {
		for _, id := range []string{"a", "b"} {
			h, _ := e.HostVeth(id)
			e.WaitAttachState(h, datapath.StateTCX, 10*time.Second)
		}
	}
	// The agent attached the node's socket hooks (node/): upgrade moves
	// them along with the host veths' links.
	hooksBefore := e.NodeHookProgIDs()
	if len(hooksBefore) != 8 {
		t.Errorf("node hooks before the upgrade: %v, want the 8 socket hooks", hooksBefore)
	}
	// With tcx forced off (make test-fallback) the host veths carry cls_bpf
	// filters, swapped in place as well.
	wantSwap := []string{"swapped in place: 12"}
	if forced(datapath.FeatTCX) {
		wantSwap = []string{"links: 8, swapped in place: 8", "tc filters: 4, swapped in place: 4"}
	}
	if out, err := e.AgentCmd(append([]string{"upgrade", "--force"}, e.AgentArgs(confDir)...)...); err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	} else {
		for _, w := range wantSwap {
			if !strings.Contains(out, w) {
				t.Errorf("upgrade did not swap the 4 host-veth hooks and the 8 socket hooks (want %q): %s", w, out)
			}
		}
	}
	for name, id := range e.NodeHookProgIDs() {
		if hooksBefore[name] == id {
			t.Errorf("node hook %s still runs program %d after upgrade --force", name, id)
		}
	}
	ag.Stop()

	out := <-pingDone
	if !strings.Contains(out, " 0% packet loss") {
		t.Errorf("packets lost across restart and upgrade:\n%s", out)
	}
	if err := <-tcpDone; err != nil {
		t.Errorf("TCP stream across restart and upgrade: %v", err)
	}
	after := e.ProgIDs(idxA)
	if len(after) != 2 || len(before) != 2 || after[0] == before[0] || after[1] == before[1] {
		t.Errorf("programs were not swapped: before %v, after %v", before, after)
	}
	if err := testenv.Ping(a, b4, 2); err != nil {
		t.Errorf("after upgrade: %v", err)
	}
	if err := e.Check(a, "a", "eth0"); err != nil {
		t.Errorf("CHECK after upgrade: %v", err)
	}
	e.MustDel(a, "a")
	e.MustDel(b, "b")
	e.AssertClean()
}

// TestAgentReconcile: a pod whose netns vanished without DEL leaves a record,
// IPAM reservations, map entries, counters, a limit, a netns entry and link
// pins; the dry run lists each and reconcile removes them all.
func TestAgentReconcile(t *testing.T) {
	e := testenv.New(t)
	// Stale tcx link pins are among what reconcile removes: without an
	// agent only attachMode tcx pins them at ADD.
	e.Extra = map[string]any{"attachMode": "tcx"}
	keep, gone := e.NewPod(), e.NewPod()
	e.CleanupDel(keep, "keep")
	e.Add(keep, "keep")
	if _, err := e.AddBW(gone, "gone", bandwidthArgs(5e6, 5e6)); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Ping(gone, testenv.NodeIP4, 1); err != nil { // counters
		t.Fatal(err)
	}
	// The pod's netns disappears without a DEL (node crash, runtime bug): the veth goes with it.
	gone.Close()
	if err := unmountNS(gone); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e, state.HostIfName("gone", "eth0"))

	confDir := e.WriteConfDir()
	out, err := e.AgentCmd(append([]string{"reconcile", "--dry-run", "-o", "json"}, e.AgentArgs(confDir)...)...)
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	var st []agent.Stale
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("dry run JSON: %v\n%s", err, out)
	}
	kinds := map[string]bool{}
	for _, s := range st {
		kinds[s.Kind] = true
	}
	for _, k := range []string{"attachment"} {
		if !kinds[k] {
			t.Errorf("dry run lists no %s: %+v", k, st)
		}
	}
	if len(e.Leftovers()) == 0 {
		t.Fatal("dry run removed state")
	}

	out, err = e.AgentCmd(append([]string{"reconcile"}, e.AgentArgs(confDir)...)...)
	if err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	t.Logf("reconcile:\n%s", out)
	// Only the live pod remains, and it still works.
	e.MustDel(keep, "keep")
	e.AssertClean()

	// Map-level leftovers with no record at all (a crash between map write and
	// record): an endpoint, counters, a limit and a netns entry of a device that
	// does not exist, found and removed by the same command.
	m := e.Maps()
	stale := e.Add(e.NewPod(), "crash")
	_, idx := e.HostVeth("crash")
	os.Remove(filepath.Join(e.StateDir, e.Name, "crash_eth0.json"))
	if err := m.Bandwidth().PutNetns(424242, 0, 0); err != nil {
		t.Fatal(err)
	}
	e.InNode(func() error { return deleteHostLink(state.HostIfName("crash", "eth0")) })
	out, err = e.AgentCmd(append([]string{"reconcile", "-o", "json"}, e.AgentArgs(confDir)...)...)
	if err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	st = nil
	json.Unmarshal([]byte(out), &st)
	kinds = map[string]bool{}
	for _, s := range st {
		kinds[s.Kind] = true
	}
	for _, k := range []string{"endpoint", "link-entry", "netns", "link-pin"} {
		if !kinds[k] {
			t.Errorf("reconcile removed no %s (ifindex %d, result %v): %s", k, idx, stale.IPs, out)
		}
	}
	// host-local still holds the crashed pod's address: only a DEL or GC (with
	// the container ID) can release that; the record was lost with the crash.
	if err := e.Del(nil, "crash", "eth0"); err != nil {
		t.Fatal(err)
	}
	e.AssertClean()
}

// TestAgentDumpsStatusAndMetrics: every dump and status as JSON, and a scrape
// of the metrics endpoint, reflect two pods that exchanged traffic.
func TestAgentDumpsStatusAndMetrics(t *testing.T) {
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "a")
	e.CleanupDel(b, "b")
	if _, err := e.AddBW(a, "a", bandwidthArgs(50e6, 50e6)); err != nil {
		t.Fatal(err)
	}
	rb := e.Add(b, "b")
	b4, _ := testenv.PodIPs(t, rb)
	if err := testenv.Ping(a, b4, 3); err != nil {
		t.Fatal(err)
	}
	confDir := e.WriteConfDir()
	hostA, idxA := e.HostVeth("a")

	for _, c := range []struct {
		args []string
		into any
		ok   func(any) bool
	}{
		{[]string{"dump", "endpoints"}, &[]inspect.EndpointRow{}, func(v any) bool { return len(*v.(*[]inspect.EndpointRow)) == 4 }},
		{[]string{"dump", "bandwidth"}, &[]inspect.BandwidthRow{}, func(v any) bool { return len(*v.(*[]inspect.BandwidthRow)) == 2 }},
		{[]string{"dump", "stats"}, &[]inspect.StatsRow{}, func(v any) bool {
			for _, r := range *v.(*[]inspect.StatsRow) {
				if r.Interface == hostA && r.Reason == "redirect" && r.Packets >= 3 {
					return true
				}
			}
			return false
		}},
		{[]string{"dump", "attachments"}, &[]inspect.AttachmentRow{}, func(v any) bool {
			rows := *v.(*[]inspect.AttachmentRow)
			found := 0
			for _, r := range rows {
				if r.Network == e.Name && r.IfName == "eth0" && !r.Provisional && len(r.IPs) == 2 &&
					r.HostIf == state.HostIfName(r.ContainerID, "eth0") && (r.ContainerID == "a" || r.ContainerID == "b") {
					found++
				}
			}
			return len(rows) == 2 && found == 2
		}},
		{[]string{"status"}, &inspect.StatusReport{}, func(v any) bool {
			s := v.(*inspect.StatusReport)
			// The bandwidth limit attached the pacing hook, a node hook.
			eps := slices.IndexFunc(s.Maps, func(u maps.Usage) bool { return u.Name == "cni_endpoints" })
			// No agent: both pods on cls_bpf, waiting for tcx, and healthy.
			return s.Healthy && s.Attachments.HostVethLinks == 0 && s.Attachments.HostVeths[datapath.StateTCPending] == 2 &&
				eps >= 0 && s.Maps[eps].Entries == 4 &&
				slices.Contains(s.Attachments.NodeHooks, "cgroup_sock_ops")
		}},
	} {
		out, err := e.AgentCmd(append(append(c.args, "-o", "json"), e.AgentArgs(confDir)...)...)
		if err != nil {
			t.Errorf("%v: %v\n%s", c.args, err, out)
			continue
		}
		if err := json.Unmarshal([]byte(out), c.into); err != nil {
			t.Errorf("%v: bad JSON: %v\n%s", c.args, err, out)
			continue
		}
		if !c.ok(c.into) {
			t.Errorf("%v: unexpected content:\n%s", c.args, out)
		}
	}

	e.StartAgent(confDir, "--metrics-addr", "127.0.0.1:9964")
	var body string
	err := e.InNode(func() error {
		// Dial on this thread: net/http would dial from another goroutine,
		// i.e. from the host netns.
		var c net.Conn
		var err error
		for i := 0; i < 50; i++ { // the listener comes up just after "ready"
			if c, err = net.Dial("tcp", "127.0.0.1:9964"); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			return err
		}
		defer c.Close()
		req, _ := http.NewRequest("GET", "http://127.0.0.1:9964/metrics", nil)
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
		t.Fatalf("scrape: %v", err)
	}
	for _, want := range []string{
		"ebpf_cni_datapath_healthy 1",
		"ebpf_cni_endpoints 4",
		fmt.Sprintf(`ebpf_cni_packets_total{container="a",direction="egress",interface="%s",pod="",reason="redirect"}`, hostA),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q (ifindex %d):\n%s", want, idxA, body)
		}
	}
	e.MustDel(a, "a")
	e.MustDel(b, "b")
	e.AssertClean()
}

// TestAgentRefusesForeignPinDir: a pin directory someone else owns could hold
// programs of theirs; the agent will not run against it.
func TestAgentRefusesForeignPinDir(t *testing.T) {
	e := testenv.New(t)
	if err := os.MkdirAll(e.PinDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(e.PinDir, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	out, err := e.AgentCmd(append([]string{"run", "--metrics-addr", ""}, e.AgentArgs(t.TempDir())...)...)
	if err == nil || !strings.Contains(out, "owned by uid 4242") {
		t.Fatalf("agent ran against a foreign pin dir: %v\n%s", err, out)
	}
	if err := os.Chown(e.PinDir, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(e.PinDir, 0o777); err != nil {
		t.Fatal(err)
	}
	out, err = e.AgentCmd(append([]string{"run", "--metrics-addr", ""}, e.AgentArgs(t.TempDir())...)...)
	if err == nil || !strings.Contains(out, "writable by group or others") {
		t.Fatalf("agent ran against a world-writable pin dir: %v\n%s", err, out)
	}
}

func unmountNS(n ns.NetNS) error {
	if err := unix.Unmount(n.Path(), unix.MNT_DETACH); err != nil {
		return err
	}
	return os.Remove(n.Path())
}

func waitGone(t *testing.T, e *testenv.Env, name string) {
	t.Helper()
	for i := 0; i < 100; i++ {
		gone := false
		e.InNode(func() error {
			_, err := netlinkLinkByName(name)
			gone = err != nil
			return nil
		})
		if gone {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s still exists", name)
}

func netlinkLinkByName(name string) (any, error) { return netlink.LinkByName(name) }

func deleteHostLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkDel(l)
}

// TestDatapathAgentDump runs `ebpf-agent dump endpoints` against a node with
// two pods that exchanged traffic.
func TestDatapathAgentDump(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "pod-a")
	e.CleanupDel(b, "pod-b")
	ra := e.AddK8s(a, "pod-a", "default", "web-a")
	rb := e.AddK8s(b, "pod-b", "default", "web-b")
	a4, a6 := testenv.PodIPs(t, ra)
	b4, b6 := testenv.PodIPs(t, rb)
	for _, ip := range []net.IP{b4, b6, testenv.NodeIP4, testenv.NodeIP6} {
		if err := testenv.Ping(a, ip, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, ip := range []net.IP{a4, a6, testenv.NodeIP4, testenv.NodeIP6} {
		if err := testenv.Ping(b, ip, 1); err != nil {
			t.Fatal(err)
		}
	}

	dump := func(args ...string) []byte {
		t.Helper()
		var out []byte
		err := e.InNode(func() error {
			cmd := exec.Command(filepath.Join(testenv.BinDir, "ebpf-agent"), append([]string{"dump", "endpoints",
				"--pin-dir", e.PinDir, "--state-dir", e.StateDir}, args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			var err error
			out, err = cmd.Output()
			if err != nil {
				return fmt.Errorf("ebpf-agent dump endpoints %v: %v\n%s", args, err, stderr.Bytes())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	var rows []inspect.EndpointRow
	js := dump("-o", "json")
	if err := json.Unmarshal(js, &rows); err != nil {
		t.Fatalf("decode dump JSON: %v\n%s", err, js)
	}
	if len(rows) != 4 {
		t.Errorf("dump has %d rows, want 4 (two IPs per pod):\n%s", len(rows), js)
	}
	byIP := map[string]inspect.EndpointRow{}
	for _, r := range rows {
		byIP[r.IP] = r
	}
	for _, c := range []struct {
		id, pod string
		res     *current.Result
		ips     []net.IP
	}{{"pod-a", "default/web-a", ra, []net.IP{a4, a6}}, {"pod-b", "default/web-b", rb, []net.IP{b4, b6}}} {
		name, idx := e.HostVeth(c.id)
		var podMAC, hostMAC string
		for _, i := range c.res.Interfaces {
			if i.Name == "eth0" {
				podMAC = i.Mac
			} else {
				hostMAC = i.Mac
			}
		}
		for _, ip := range c.ips {
			r, ok := byIP[ip.String()]
			if !ok {
				t.Errorf("%s: IP %s missing from dump:\n%s", c.id, ip, js)
				continue
			}
			if r.Interface != name || r.Ifindex != uint32(idx) {
				t.Errorf("%s %s: interface %q ifindex %d, want %q %d", c.id, ip, r.Interface, r.Ifindex, name, idx)
			}
			if r.Container != c.id || r.Pod != c.pod {
				t.Errorf("%s %s: container %q pod %q, want %q %q", c.id, ip, r.Container, r.Pod, c.id, c.pod)
			}
			if r.PodMAC != podMAC || r.HostMAC != hostMAC {
				t.Errorf("%s %s: MACs pod %s host %s, want %s %s", c.id, ip, r.PodMAC, r.HostMAC, podMAC, hostMAC)
			}
			if r.TxPackets == 0 || r.RxPackets == 0 || r.TxBytes == 0 || r.RxBytes == 0 {
				t.Errorf("%s %s: tx %d/%d rx %d/%d, want traffic both ways", c.id, ip, r.TxPackets, r.TxBytes, r.RxPackets, r.RxBytes)
			}
			for k, v := range r.Drops {
				if v != 0 {
					t.Errorf("%s %s: drops %s=%d, want none", c.id, ip, k, v)
				}
			}
		}
	}

	table := string(dump())
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	if len(lines) != 5 {
		t.Errorf("table has %d lines, want header + 4:\n%s", len(lines), table)
	}
	if f := strings.Fields(lines[0]); len(f) == 0 || f[0] != "IP" || !strings.Contains(lines[0], "INTERFACE") ||
		!strings.Contains(lines[0], "RX PKTS") || !strings.Contains(lines[0], "TX PKTS") {
		t.Errorf("table header %q, want IP ... INTERFACE ... RX PKTS ... TX PKTS", lines[0])
	}
	for _, ip := range []net.IP{a4, a6, b4, b6} {
		found := false
		for _, l := range lines[1:] {
			if f := strings.Fields(l); len(f) > 0 && f[0] == ip.String() {
				found = true
				if !strings.Contains(l, "default/web-") {
					t.Errorf("table row of %s lacks the pod name: %q", ip, l)
				}
			}
		}
		if !found {
			t.Errorf("table lacks a row for %s:\n%s", ip, table)
		}
	}

	e.MustDel(a, "pod-a")
	e.MustDel(b, "pod-b")
	e.AssertClean()
}
