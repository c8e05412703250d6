package test

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

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// agentProc is a running `ebpf-agent run` in the env's node netns.
type agentProc struct {
	cmd *exec.Cmd
	log *strings.Builder
}

// writeConfDir puts the env's conflist where the agent looks for networks.
func (e *env) writeConfDir() string {
	e.t.Helper()
	dir := e.t.TempDir()
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": e.name, "plugins": []any{e.pluginConf()}})
	if err := os.WriteFile(filepath.Join(dir, "10-test.conflist"), b, 0o600); err != nil {
		e.t.Fatal(err)
	}
	return dir
}

func (e *env) agentArgs(confDir string) []string {
	return []string{"--pin-dir", e.pinDir, "--state-dir", e.stateDir, "--cni-conf-dir", confDir, "--cni-bin-dir", binDir}
}

// startAgent starts the agent and waits until it reports ready.
func (e *env) startAgent(confDir string, extra ...string) *agentProc {
	e.t.Helper()
	a := &agentProc{log: &strings.Builder{}}
	err := e.inNode(func() error {
		a.cmd = exec.Command(filepath.Join(binDir, "ebpf-agent"), append(append([]string{"run"}, e.agentArgs(confDir)...), extra...)...)
		stderr, err := a.cmd.StderrPipe()
		if err != nil {
			return err
		}
		if err := a.cmd.Start(); err != nil {
			return err
		}
		ready := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(stderr)
			once := false
			for sc.Scan() {
				a.log.WriteString(sc.Text() + "\n")
				if !once && strings.Contains(sc.Text(), "datapath ready") {
					once = true
					close(ready)
				}
			}
		}()
		select {
		case <-ready:
			return nil
		case <-time.After(10 * time.Second):
			return fmt.Errorf("agent not ready after 10s:\n%s", a.log)
		}
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { a.cmd.Process.Kill(); a.cmd.Wait() })
	return a
}

// agentCmd runs a one-shot agent command in the node netns.
func (e *env) agentCmd(args ...string) (string, error) {
	var out []byte
	err := e.inNode(func() error {
		var err error
		out, err = exec.Command(filepath.Join(binDir, "ebpf-agent"), args...).CombinedOutput()
		return err
	})
	return string(out), err
}

// progIDs returns the programs attached to both tcx hooks of a host veth.
func (e *env) progIDs(ifindex int) []ebpf.ProgramID {
	e.t.Helper()
	var ids []ebpf.ProgramID
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		err := e.inNode(func() error {
			r, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
			if err != nil {
				return err
			}
			for _, p := range r.Programs {
				ids = append(ids, p.ID)
			}
			return nil
		})
		if err != nil {
			e.t.Fatal(err)
		}
	}
	return ids
}

// nodeHookProgIDs returns the program each pinned node hook link runs,
// and checks that it is the hook's own: an upgrade once swapped
// cni_sock_connect4's link to cni_sock_connect6 (the kernel keeps 15
// characters of a name).
func (e *env) nodeHookProgIDs() map[string]ebpf.ProgramID {
	e.t.Helper()
	want := map[string]string{
		"cgroup_connect4": "cni_sock_connect4", "cgroup_connect6": "cni_sock_connect6",
		"cgroup_sendmsg4": "cni_sock_sendmsg4", "cgroup_sendmsg6": "cni_sock_sendmsg6",
		"cgroup_recvmsg4": "cni_sock_recvmsg4", "cgroup_recvmsg6": "cni_sock_recvmsg6",
		"cgroup_getpeername4": "cni_sock_peer4", "cgroup_getpeername6": "cni_sock_peer6",
		"cgroup_sock_ops": "cni_sock_ops",
	}
	out := map[string]ebpf.ProgramID{}
	for _, p := range datapath.NodeHookPins(e.pinDir) {
		l, err := link.LoadPinnedLink(p.Path, nil)
		if err != nil {
			e.t.Fatalf("node hook %s: %v", p.Name, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			e.t.Fatalf("node hook %s: %v", p.Name, err)
		}
		out[p.Name] = info.Program
		prog, err := ebpf.NewProgramFromID(info.Program)
		if err != nil {
			e.t.Fatalf("program of node hook %s: %v", p.Name, err)
		}
		pi, err := prog.Info()
		prog.Close()
		if err != nil {
			e.t.Fatalf("program of node hook %s: %v", p.Name, err)
		}
		if w, ok := want[p.Name]; ok && pi.Name != w {
			e.t.Errorf("node hook %s runs %s, want %s", p.Name, pi.Name, w)
		}
	}
	return out
}

// TestAgentRestartAndUpgradeWithoutLoss: pings and a TCP stream between two
// pods keep flowing, with zero loss, while the agent is started, killed with
// -9, restarted, and the programs of every attachment are swapped in place.
func TestAgentRestartAndUpgradeWithoutLoss(t *testing.T) {
	e := newEnv(t)
	a, b := e.newPod(), e.newPod()
	e.cleanupDel(a, "a")
	e.cleanupDel(b, "b")
	e.add(a, "a")
	rb := e.add(b, "b")
	b4, _ := podIPs(t, rb)
	confDir := e.writeConfDir()
	_, idxA := e.hostVeth("a")
	before := e.progIDs(idxA)

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
	go func() { tcpDone <- tcpTransfer(a, b, b4, 64<<20) }()

	// Start, kill and restart the agent while both flows are under way.
	m := e.maps()
	deadline := time.Now().Add(5 * time.Second)
	for counter(t, m, idxA, maps.DirEgress, maps.ReasonRedirect).Packets < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("traffic between the pods is not flowing: %s", dumpCounters(m, idxA))
		}
		time.Sleep(5 * time.Millisecond)
	}
	ag := e.startAgent(confDir, "--metrics-addr", "")
	ag.cmd.Process.Signal(syscall.SIGKILL)
	ag.cmd.Wait()
	ag = e.startAgent(confDir, "--metrics-addr", "")
	// The agent attached the node's socket hooks (node/): upgrade moves
	// them along with the host veths' links.
	hooksBefore := e.nodeHookProgIDs()
	if len(hooksBefore) != 8 {
		t.Errorf("node hooks before the upgrade: %v, want the 8 socket hooks", hooksBefore)
	}
	if out, err := e.agentCmd(append([]string{"upgrade", "--force"}, e.agentArgs(confDir)...)...); err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	} else if !strings.Contains(out, "swapped in place: 12") {
		t.Errorf("upgrade did not swap the 4 host-veth links and the 8 socket hooks: %s", out)
	}
	for name, id := range e.nodeHookProgIDs() {
		if hooksBefore[name] == id {
			t.Errorf("node hook %s still runs program %d after upgrade --force", name, id)
		}
	}
	ag.cmd.Process.Signal(syscall.SIGTERM)
	ag.cmd.Wait()

	out := <-pingDone
	if !strings.Contains(out, " 0% packet loss") {
		t.Errorf("packets lost across restart and upgrade:\n%s", out)
	}
	if err := <-tcpDone; err != nil {
		t.Errorf("TCP stream across restart and upgrade: %v", err)
	}
	after := e.progIDs(idxA)
	if len(after) != 2 || len(before) != 2 || after[0] == before[0] || after[1] == before[1] {
		t.Errorf("programs were not swapped: before %v, after %v", before, after)
	}
	if err := ping(a, b4, 2); err != nil {
		t.Errorf("after upgrade: %v", err)
	}
	if err := e.check(a, "a", "eth0"); err != nil {
		t.Errorf("CHECK after upgrade: %v", err)
	}
	e.mustDel(a, "a")
	e.mustDel(b, "b")
	e.assertClean()
}

// TestAgentReconcile: a pod whose netns vanished without DEL leaves a record,
// IPAM reservations, map entries, counters, a limit, a netns entry and link
// pins; the dry run lists each and reconcile removes them all.
func TestAgentReconcile(t *testing.T) {
	e := newEnv(t)
	keep, gone := e.newPod(), e.newPod()
	e.cleanupDel(keep, "keep")
	e.add(keep, "keep")
	if _, err := e.addBW(gone, "gone", bandwidthArgs(5e6, 5e6)); err != nil {
		t.Fatal(err)
	}
	if err := ping(gone, nodeIP4, 1); err != nil { // counters
		t.Fatal(err)
	}
	// The pod's netns disappears without a DEL (node crash, runtime bug): the veth goes with it.
	gone.Close()
	if err := unmountNS(gone); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e, state.HostIfName("gone", "eth0"))

	confDir := e.writeConfDir()
	out, err := e.agentCmd(append([]string{"reconcile", "--dry-run", "-o", "json"}, e.agentArgs(confDir)...)...)
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
	if len(e.leftovers()) == 0 {
		t.Fatal("dry run removed state")
	}

	out, err = e.agentCmd(append([]string{"reconcile"}, e.agentArgs(confDir)...)...)
	if err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	t.Logf("reconcile:\n%s", out)
	// Only the live pod remains, and it still works.
	e.mustDel(keep, "keep")
	e.assertClean()

	// Map-level leftovers with no record at all (a crash between map write and
	// record): an endpoint, counters, a limit and a netns entry of a device that
	// does not exist, found and removed by the same command.
	m := e.maps()
	stale := e.add(e.newPod(), "crash")
	_, idx := e.hostVeth("crash")
	os.Remove(filepath.Join(e.stateDir, e.name, "crash_eth0.json"))
	if err := m.PutNetns(424242, 0, 0); err != nil {
		t.Fatal(err)
	}
	e.inNode(func() error { return deleteHostLink(state.HostIfName("crash", "eth0")) })
	out, err = e.agentCmd(append([]string{"reconcile", "-o", "json"}, e.agentArgs(confDir)...)...)
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
	if err := e.del(nil, "crash", "eth0"); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}

// TestAgentDumpsStatusAndMetrics: every dump and status as JSON, and a scrape
// of the metrics endpoint, reflect two pods that exchanged traffic.
func TestAgentDumpsStatusAndMetrics(t *testing.T) {
	e := newEnv(t)
	a, b := e.newPod(), e.newPod()
	e.cleanupDel(a, "a")
	e.cleanupDel(b, "b")
	if _, err := e.addBW(a, "a", bandwidthArgs(50e6, 50e6)); err != nil {
		t.Fatal(err)
	}
	rb := e.add(b, "b")
	b4, _ := podIPs(t, rb)
	if err := ping(a, b4, 3); err != nil {
		t.Fatal(err)
	}
	confDir := e.writeConfDir()
	hostA, idxA := e.hostVeth("a")

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
				if r.Network == e.name && r.IfName == "eth0" && !r.Provisional && len(r.IPs) == 2 &&
					r.HostIf == state.HostIfName(r.ContainerID, "eth0") && (r.ContainerID == "a" || r.ContainerID == "b") {
					found++
				}
			}
			return len(rows) == 2 && found == 2
		}},
		{[]string{"status"}, &inspect.StatusReport{}, func(v any) bool {
			s := v.(*inspect.StatusReport)
			// The bandwidth limit attached the pacing hook, a node hook.
			return s.Healthy && s.Attachments.HostVethLinks == 4 && s.Maps["cni_endpoints"] == 4 &&
				slices.Contains(s.Attachments.NodeHooks, "cgroup_sock_ops")
		}},
	} {
		out, err := e.agentCmd(append(append(c.args, "-o", "json"), e.agentArgs(confDir)...)...)
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

	e.startAgent(confDir, "--metrics-addr", "127.0.0.1:9964")
	var body string
	err := e.inNode(func() error {
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
	e.mustDel(a, "a")
	e.mustDel(b, "b")
	e.assertClean()
}

// TestAgentRefusesForeignPinDir: a pin directory someone else owns could hold
// programs of theirs; the agent will not run against it.
func TestAgentRefusesForeignPinDir(t *testing.T) {
	e := newEnv(t)
	if err := os.MkdirAll(e.pinDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(e.pinDir, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	out, err := e.agentCmd(append([]string{"run", "--metrics-addr", ""}, e.agentArgs(t.TempDir())...)...)
	if err == nil || !strings.Contains(out, "owned by uid 4242") {
		t.Fatalf("agent ran against a foreign pin dir: %v\n%s", err, out)
	}
	if err := os.Chown(e.pinDir, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(e.pinDir, 0o777); err != nil {
		t.Fatal(err)
	}
	out, err = e.agentCmd(append([]string{"run", "--metrics-addr", ""}, e.agentArgs(t.TempDir())...)...)
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

func waitGone(t *testing.T, e *env, name string) {
	t.Helper()
	for i := 0; i < 100; i++ {
		gone := false
		e.inNode(func() error {
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
