// ebpf-agent uninstall: a node left as it was found. Each test records the
// node namespace's state before install (links and their tc/tcx programs,
// the programs on its own cgroup2 root, the pin directory, routes,
// neighbours, the state and conf directories), runs pods through the agent
// and the plugin, uninstalls and compares.

package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestUninstallLeavesNodeAsFound: pods with hostPort, ipMasq and bandwidth
// through the agent and the plugin, deleted; the node hooks stay, idle in
// status; uninstall removes everything and says what; the node is as
// before install; a second run finds nothing (exit 0); a new install under
// another pin directory (refused while the first one's hooks stayed) serves
// a hostPort again.
func TestUninstallLeavesNodeAsFound(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	before := l.snapshot()
	l.install()
	agent := l.startAgent()
	a, b := l.podsWithEverything()
	if err := l.Del(a, "web", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := l.Del(b, "plain", "eth0"); err != nil {
		t.Fatal(err)
	}
	l.AssertClean()
	agent.Stop()

	// The node hooks outlive the pods and the agent, shown idle.
	out, err := l.AgentCmd("status", "-o", "json", "--pin-dir", l.PinDir, "--state-dir", l.StateDir)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var st struct {
		Attachments struct {
			NodeHooks     []string `json:"nodeHooks"`
			NodeHooksIdle bool     `json:"nodeHooksIdle"`
		} `json:"attachments"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, out)
	}
	if len(st.Attachments.NodeHooks) == 0 || !st.Attachments.NodeHooksIdle {
		t.Errorf("status after the last pod: node hooks %v, idle %v; want hooks, idle", st.Attachments.NodeHooks, st.Attachments.NodeHooksIdle)
	}
	l.mustChange(before, "install")

	// While the hooks stay, another pin directory is refused on this node.
	other := l.Sibling(t)
	other.Extra = map[string]any{"capabilities": map[string]bool{"portMappings": true}, "cgroupRoot": l.cgroupRoot}
	op := other.NewPod()
	other.CleanupDel(op, "second")
	if _, err := other.AddHP(op, "second", testenv.PM{HostPort: 8081, ContainerPort: 80, Protocol: "tcp"}); err == nil {
		t.Fatal("a second pin directory's hostPort ADD was accepted beside the first one's hooks")
	}

	stdout, stderr, code := l.uninstall()
	if code != 0 {
		t.Fatalf("uninstall: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"conflist", "node hook", "cni_from_uplink", "uplink0", "cgroup", "route", "10.99.0.0/24", "maps", "programs", "locks", "pin directory", "state directory"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("uninstall's report does not mention %q:\n%s", want, stdout)
		}
	}
	t.Logf("uninstall:\n%s", stdout)
	l.assertAsBefore(before, "after uninstall")

	stdout, stderr, code = l.uninstall()
	if code != 0 || !strings.Contains(stdout, "nothing of ebpf-cni found") {
		t.Errorf("second uninstall: exit %d, want 0 and \"nothing ... found\":\n%s\n%s", code, stdout, stderr)
	}

	// The node takes a new install: the other pin directory's hostPort works.
	if _, err := other.AddHP(op, "second", testenv.PM{HostPort: 8081, ContainerPort: 80, Protocol: "tcp"}); err != nil {
		t.Fatalf("hostPort ADD under another pin directory after uninstall: %v", err)
	}
	serve(t, op, 80, "second")
	expectServer(t, l.remote, "tcp", hp(uplinkIP4, 8081), "second")
	other.MustDel(op, "second")
}

// TestUninstallRefusesPodsUnlessForced: with pods present uninstall
// refuses (non-zero, naming them and --force) and changes nothing; with
// --force it warns, tears the pods' interfaces down and leaves the node as
// before install.
func TestUninstallRefusesPodsUnlessForced(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	before := l.snapshot()
	l.install()
	agent := l.startAgent()
	a, _ := l.podsWithEverything()

	stdout, stderr, code := l.uninstall()
	if code == 0 || !strings.Contains(stderr, "agent runs") {
		t.Errorf("uninstall beside a running agent: exit %d, want non-zero naming the agent\n%s\n%s", code, stdout, stderr)
	}
	agent.Stop()
	present := l.snapshot()
	stdout, stderr, code = l.uninstall()
	if code == 0 || !strings.Contains(stderr, "--force") || !strings.Contains(stderr, "web/eth0") || !strings.Contains(stderr, "plain/eth0") {
		t.Errorf("uninstall with pods: exit %d, want non-zero naming the pods and --force\n%s\n%s", code, stdout, stderr)
	}
	if gone, left := diff(present, l.snapshot()); len(gone)+len(left) > 0 {
		t.Errorf("a refused uninstall changed the node: left %v, gone %v", left, gone)
	}
	expectServer(t, l.remote, "tcp", hp(uplinkIP4, 8080), "web")

	stdout, stderr, code = l.uninstall("--force")
	if code != 0 {
		t.Fatalf("uninstall --force: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "warning") || !strings.Contains(stderr, "web/eth0") {
		t.Errorf("uninstall --force did not warn about the pods:\n%s", stderr)
	}
	t.Logf("uninstall --force:\n%s%s", stdout, stderr)
	l.assertAsBefore(before, "after uninstall --force")
	a.Do(func(ns.NetNS) error {
		if _, err := netlink.LinkByName("eth0"); err == nil {
			t.Error("the pod kept its eth0 after uninstall --force")
		}
		return nil
	})
	expectNoServer(t, l.remote, "tcp", hp(uplinkIP4, 8080))
}

// TestUninstallHalfDone: an agent killed while it set the node hooks up
// (uplinks attached, socket hooks not), an ADD with a hostPort killed
// after attaching its host veth, and a pod whose netns went without a DEL,
// leave a half-done install; uninstall
// (without --force: the killed ADD is no pod) leaves the node as before,
// the IPAM reservation released.
func TestUninstallHalfDone(t *testing.T) {
	t.Parallel()
	agentBin, pluginBin := crashAgent(t), crashBinary(t)
	l := newUninstallLab(t)
	before := l.snapshot()
	l.install()

	err := l.InNode(func() error {
		args := append([]string{"run"}, l.AgentArgs(l.confDir)...)
		cmd := exec.Command(agentBin, append(args, "--cgroup-root", l.cgroupRoot)...)
		cmd.Env = append(os.Environ(), "EBPF_CNI_CRASH_AT=nodehooks-uplinks")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			return fmt.Errorf("agent with EBPF_CNI_CRASH_AT=nodehooks-uplinks: %v, want killed by SIGKILL\n%s", err, out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	snap := strings.Join(l.snapshot(), "\n")
	if !strings.Contains(snap, "uplink0 TCXIngress program cni_from_uplink") || strings.Contains(snap, "cgroup root") {
		t.Fatalf("the killed agent did not leave uplinks attached without socket hooks:\n%s", snap)
	}

	pod := l.NewPod()
	envv := pluginEnv("ADD", "killed", pod, "eth0")
	envv["CNI_NETNS"] = pod.Path()
	stdin := l.StdinConf(func(c map[string]any) {
		c["runtimeConfig"] = map[string]any{"portMappings": []testenv.PM{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}}}
	})
	envv["EBPF_CNI_CRASH_AT"] = "host"
	out, err := l.RunPlugin(pluginBin, envv, stdin)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("ADD with EBPF_CNI_CRASH_AT=host: %v, want killed by SIGKILL; stdout %s", err, out)
	}
	// And a pod gone without DEL: its netns destroyed, its record and IPAM
	// reservation left.
	gone := l.NewPod()
	if _, err := l.AddHP(gone, "vanished"); err != nil {
		t.Fatal(err)
	}
	host, _ := l.HostVeth("vanished")
	if err := testenv.RemoveNS(gone); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var lerr error
		l.InNode(func() error { _, lerr = netlink.LinkByName(host); return nil })
		if lerr != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s outlived its pod's netns", host)
		}
	}
	l.mustChange(before, "the killed agent and ADD")
	if len(l.Leftovers()) == 0 {
		t.Fatal("the killed ADD left nothing")
	}
	time.Sleep(10 * time.Millisecond)

	stdout, stderr, code := l.uninstall()
	if code != 0 {
		t.Fatalf("uninstall of a half-done install: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "ADD killed part way") || !strings.Contains(stdout, "vanished/eth0") {
		t.Errorf("uninstall's report does not name the killed ADD's attachment:\n%s", stdout)
	}
	t.Logf("uninstall:\n%s", stdout)
	l.assertAsBefore(before, "after uninstall of a half-done install")
	pod.Do(func(ns.NetNS) error {
		if _, err := netlink.LinkByName("eth0"); err == nil {
			t.Error("eth0 left in the killed ADD's pod")
		}
		return nil
	})
}

// TestUninstallOnAgentStop: the DaemonSet's cleanup mode. An agent run with
// --uninstall-on-stop FILE uninstalls the node when stopped and FILE says
// so: "true" is refused while pods exist (the agent exits non-zero and the
// datapath stays, pods keep their hostPort), "force" takes the pods'
// interfaces too and leaves the node as before install; no FILE content
// leaves everything in place.
func TestUninstallOnAgentStop(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	before := l.snapshot()
	l.install()
	mode := filepath.Join(t.TempDir(), "uninstall-on-stop")
	start := func() *testenv.AgentProc {
		return l.StartAgent(l.confDir, "--cgroup-root", l.cgroupRoot, "--peers", l.peersFile, "--uninstall-on-stop", mode)
	}
	stop := func(a *testenv.AgentProc) error {
		a.Cmd.Process.Signal(syscall.SIGTERM)
		err, ok := a.Exited(30 * time.Second)
		if !ok {
			t.Fatalf("the agent did not end within 30s of SIGTERM:\n%s", a.Logs())
		}
		return err
	}

	a := start()
	l.podsWithEverything()
	if err := stop(a); err != nil { // no file: a plain stop
		t.Fatalf("agent stop without an uninstall mode: %v\n%s", err, a.Logs())
	}
	present := l.snapshot()
	if gone, left := diff(before, present); len(left) == 0 || len(gone) > 0 {
		t.Fatalf("a plain stop changed what install made: left %d, gone %v", len(left), gone)
	}

	os.WriteFile(mode, []byte("true\n"), 0o600)
	a = start()
	if err := stop(a); err == nil || !strings.Contains(a.Logs(), "--force") {
		t.Errorf("agent stop in mode \"true\" with pods present: %v, want a refusal naming --force\n%s", err, a.Logs())
	}
	expectServer(t, l.remote, "tcp", hp(uplinkIP4, 8080), "web")

	os.WriteFile(mode, []byte("force\n"), 0o600)
	a = start()
	if err := stop(a); err != nil {
		t.Fatalf("agent stop in mode \"force\": %v\n%s", err, a.Logs())
	}
	t.Logf("agent:\n%s", a.Logs())
	l.assertAsBefore(before, "after the agent's uninstall on stop")
}

// TestUninstallLeavesOtherPinDirAlone: a second ebpf-cni network on the node
// with a pin directory of its own, its conflist in the same conf dir and its
// records in the same state dir, keeps its pod, veth, pins, records and
// conflist through the first one's uninstall (its pod is not ours: no
// --force needed), and its pod keeps its traffic.
func TestUninstallLeavesOtherPinDirAlone(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	l.install()
	other := l.Sibling(t)
	other.StateDir = l.StateDir
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": other.Name, "plugins": []any{other.PluginConf()}})
	otherConf := filepath.Join(l.confDir, "20-other.conflist")
	if err := os.WriteFile(otherConf, b, 0o600); err != nil {
		t.Fatal(err)
	}
	op := other.NewPod()
	other.CleanupDel(op, "theirs")
	res := other.Add(op, "theirs")
	ip4, _ := testenv.PodIPs(t, res)
	p := l.NewPod()
	l.CleanupDel(p, "mine")
	if _, err := l.AddHP(p, "mine", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Del(p, "mine", "eth0"); err != nil {
		t.Fatal(err)
	}

	stdout, stderr, code := l.uninstall()
	if code != 0 {
		t.Fatalf("uninstall beside another pin directory's pod: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if _, err := os.Stat(l.PinDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("our pin directory: %v, want it gone", err)
	}
	for _, path := range []string{other.PinDir, otherConf, filepath.Join(l.StateDir, other.Name)} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("the other network's %s: %v", path, err)
		}
	}
	host, _ := other.HostVeth("theirs")
	other.HostIfindex(host) // fails the test when gone
	if err := testenv.Ping(op, testenv.NodeIP4, 2); err != nil {
		t.Errorf("the other network's pod after our uninstall: %v", err)
	}
	if err := other.Check(op, "theirs", "eth0"); err != nil {
		t.Errorf("CHECK of the other network's pod after our uninstall: %v", err)
	}
	_ = ip4
	other.MustDel(op, "theirs")
	other.AssertClean()
}

// TestUninstallNothingThere: on a node ebpf-cni never touched (no pin,
// state or conf directory) uninstall finds nothing, says so and exits 0.
func TestUninstallNothingThere(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	out, err := e.AgentCmd("uninstall", "--pin-dir", e.PinDir, "--state-dir", filepath.Join(t.TempDir(), "none"),
		"--cni-conf-dir", filepath.Join(t.TempDir(), "none"))
	if err != nil || !strings.Contains(out, "nothing of ebpf-cni found") {
		t.Errorf("uninstall of nothing: %v, want exit 0 and \"nothing ... found\":\n%s", err, out)
	}
}

// TestUninstallHandedOff: veths DEL handed off to an agent that was stopped
// before it deleted them are deleted by uninstall, and the node is as
// before install.
func TestUninstallHandedOff(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	before := l.snapshot()
	l.install()
	agent := l.startAgent()
	hold := l.HoldVerbs() // the agent leaves the handed-off veth alone
	p := l.NewPod()
	l.CleanupDel(p, "handed")
	if _, err := l.AddHP(p, "handed", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Del(p, "handed", "eth0"); err != nil {
		t.Fatal(err)
	}
	agent.Stop()
	hold()
	if !strings.Contains(strings.Join(l.snapshot(), "\n"), "link ebpz") {
		t.Fatal("DEL handed nothing off: the test would prove nothing")
	}
	stdout, stderr, code := l.uninstall()
	if code != 0 || !strings.Contains(stdout, "handed-off veths") {
		t.Fatalf("uninstall: exit %d, want 0 naming the handed-off veth\n%s\n%s", code, stdout, stderr)
	}
	l.assertAsBefore(before, "after uninstall of a handed-off veth")
}

// TestUninstallKilled: an uninstall --force SIGKILLed after the pods'
// teardown, after the conflists, after detaching the node hooks, after the
// strays, or after removing the records (the pin directory left), is
// finished by the next run: the node is as before install.
func TestUninstallKilled(t *testing.T) {
	t.Parallel()
	bin := crashAgent(t)
	for _, step := range []string{"uninstall-teardown", "uninstall-conflists", "uninstall-hooks", "uninstall-strays", "uninstall-state"} {
		t.Run(step, func(t *testing.T) {
			l := newUninstallLab(t)
			before := l.snapshot()
			l.install()
			agent := l.startAgent()
			l.podsWithEverything()
			agent.Stop()
			err := l.InNode(func() error {
				cmd := exec.Command(bin, "uninstall", "--force", "--pin-dir", l.PinDir, "--state-dir", l.StateDir,
					"--cni-conf-dir", l.confDir, "--cni-bin-dir", testenv.BinDir, "--cgroup-root", l.cgroupRoot)
				cmd.Env = append(os.Environ(), "EBPF_CNI_CRASH_AT="+step)
				out, err := cmd.CombinedOutput()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					return fmt.Errorf("uninstall with EBPF_CNI_CRASH_AT=%s: %v, want killed by SIGKILL\n%s", step, err, out)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			l.mustChange(before, "the killed uninstall")
			stdout, stderr, code := l.uninstall()
			if code != 0 {
				t.Fatalf("uninstall after one killed at %s: exit %d\n%s\n%s", step, code, stdout, stderr)
			}
			l.assertAsBefore(before, "after an uninstall killed at "+step+" and run again")
		})
	}
}
