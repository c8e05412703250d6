// ebpf-agent uninstall under attack: what is not ours survives it (another
// tool's tcx links, cls_bpf filters and cgroup programs, other pin and
// state directories, symlinks planted under ours), whatever path it is
// given.

package integration

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// foreignTool is another program's BPF state on the node: its own pin
// directory under bpffs holding its programs and the links it attached.
type foreignTool struct {
	t   *testing.T
	dir string
	cls *ebpf.Program // a tc program passing every packet on
	skb *ebpf.Program // a cgroup_skb program (lets every packet through)
}

func newForeignTool(t *testing.T) *foreignTool {
	t.Helper()
	f := &foreignTool{t: t, dir: filepath.Join(datapath.BPFFSRoot, testenv.RandName("foreign-"))}
	if err := os.Mkdir(f.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(f.dir) })
	// A co-operative tc program: TCX_NEXT (-1), so the programs after it
	// (ours) still run. One returning TCX_PASS before ours would hide every
	// packet from the datapath (tcx ends the chain there).
	cls, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "foreign_cls", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cls.Close() })
	f.cls = cls
	skb, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "foreign_skb", Type: ebpf.CGroupSKB, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { skb.Close() })
	f.skb = skb
	if err := f.cls.Pin(filepath.Join(f.dir, "prog")); err != nil {
		t.Fatal(err)
	}
	return f
}

// tcx attaches the tc program to a link of the current netns, pinned as name.
func (f *foreignTool) tcx(ifname string, at ebpf.AttachType, name string) {
	f.t.Helper()
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		f.t.Fatal(err)
	}
	tl, err := link.AttachTCX(link.TCXOptions{Interface: l.Attrs().Index, Program: f.cls, Attach: at})
	if err != nil {
		f.t.Fatalf("foreign tcx on %s: %v", ifname, err)
	}
	defer tl.Close()
	if err := tl.Pin(filepath.Join(f.dir, name)); err != nil {
		f.t.Fatal(err)
	}
}

// attached tells whether the foreign tc program runs on tcx at of ifname
// (in the current netns).
func (f *foreignTool) attached(ifname string, at ebpf.AttachType) bool {
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		return false
	}
	info, err := f.cls.Info()
	if err != nil {
		f.t.Fatal(err)
	}
	id, _ := info.ID()
	res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at})
	if err != nil {
		return false
	}
	for _, p := range res.Programs {
		if p.ID == id {
			return true
		}
	}
	return false
}

// pinsLeft fails the test for each of the foreign tool's pins that is gone.
func (f *foreignTool) pinsLeft(names ...string) {
	f.t.Helper()
	for _, n := range append([]string{"prog"}, names...) {
		if _, err := os.Lstat(filepath.Join(f.dir, n)); err != nil {
			f.t.Errorf("another program's pin %s: %v", filepath.Join(f.dir, n), err)
		}
	}
}

// stopped installs through the plugin (no agent: the hostPort ADD sets the
// node hooks up itself), a hostPort pod ADDed and DELeted: the node hooks
// and every pin stay.
func (l *uninstallLab) stopped() {
	l.T.Helper()
	l.install()
	p := l.NewPod()
	l.CleanupDel(p, "once")
	if _, err := l.AddHP(p, "once", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}); err != nil {
		l.T.Fatal(err)
	}
	if err := l.Del(p, "once", "eth0"); err != nil {
		l.T.Fatal(err)
	}
}

// TestUninstallLeavesForeignAlone: another program's tcx links and a
// clsact with a cls_bpf filter on the uplink, its tcx link on a user's veth
// named like a host veth of ours, its program on the cgroup root, a route of
// another protocol and another CNI's conflist are on the node before
// install; install, pods with everything, uninstall: the node is exactly as
// before, those included, and the foreign pins are all there. Then a fresh
// install (agent, hostPort, ipMasq) works with packets and uninstalls
// cleanly again.
func TestUninstallLeavesForeignAlone(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	f := newForeignTool(t)
	userVeth := "ebpf0a1b2c3d4e5" // the shape of state.HostIfName
	err := l.InNode(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: userVeth}, PeerName: "userpeer0"}); err != nil {
			return err
		}
		uv, _ := netlink.LinkByName(userVeth)
		netlink.LinkSetAlias(uv, "a user's veth")
		f.tcx("uplink0", ebpf.AttachTCXIngress, "tcx-uplink-in")
		f.tcx("uplink0", ebpf.AttachTCXEgress, "tcx-uplink-out")
		f.tcx(userVeth, ebpf.AttachTCXIngress, "tcx-user")
		up, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		// clsact and a cls_bpf filter on the uplink and on the user's veth.
		for _, l := range []netlink.Link{up, uv} {
			if err := netlink.QdiscAdd(&netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index,
				Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}); err != nil {
				return err
			}
			if err := netlink.FilterAdd(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index,
				Parent: netlink.HANDLE_MIN_INGRESS, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 7},
				Fd: f.cls.FD(), Name: "foreign-filter", DirectAction: true}); err != nil {
				return err
			}
		}
		_, dst, _ := net.ParseCIDR("10.77.0.0/24")
		return netlink.RouteAdd(&netlink.Route{Dst: dst, LinkIndex: up.Attrs().Index, Protocol: 42})
	})
	if err != nil {
		t.Fatal(err)
	}
	cg, err := link.AttachCgroup(link.CgroupOptions{Path: l.cgroupRoot, Attach: ebpf.AttachCGroupInetIngress, Program: f.skb})
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.Pin(filepath.Join(f.dir, "cgroup")); err != nil {
		t.Fatal(err)
	}
	cg.Close()
	other := filepath.Join(l.confDir, "05-other.conflist")
	if err := os.WriteFile(other, []byte(`{"cniVersion":"1.0.0","name":"othercni","plugins":[{"type":"bridge","bridge":"cni0"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	before := l.snapshot()
	for _, want := range []string{"uplink0 TCXIngress program foreign_cls", "link uplink0 filter bpf foreign-filter", "link " + userVeth + " filter bpf foreign-filter", "proto 42", "cgroup root None program foreign_skb", "05-other.conflist", userVeth} {
		if !strings.Contains(strings.Join(before, "\n"), want) {
			t.Fatalf("the foreign state lacks %q: the test would prove nothing\n%s", want, strings.Join(before, "\n"))
		}
	}

	l.install()
	agent := l.startAgent()
	a, b := l.podsWithEverything()
	if err := l.Del(a, "web", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := l.Del(b, "plain", "eth0"); err != nil {
		t.Fatal(err)
	}
	agent.Stop()
	l.mustChange(before, "install")
	uninstalled := func(when string) {
		t.Helper()
		stdout, stderr, code := l.uninstall()
		if code != 0 {
			t.Fatalf("%s: uninstall: exit %d\n%s\n%s", when, code, stdout, stderr)
		}
		l.assertAsBefore(before, when)
		f.pinsLeft("tcx-uplink-in", "tcx-uplink-out", "tcx-user", "cgroup")
		if _, err := os.Stat(other); err != nil {
			t.Errorf("another CNI's conflist: %v", err)
		}
	}
	uninstalled("after uninstall beside another program's hooks")

	// A fresh install on the uninstalled node: agent, a hostPort pod with
	// ipMasq, proven by packets; then uninstalled again.
	l.install()
	agent = l.startAgent()
	p := l.NewPod()
	l.CleanupDel(p, "again")
	if _, err := l.AddHP(p, "again", testenv.PM{HostPort: 8082, ContainerPort: 80, Protocol: "tcp"}); err != nil {
		t.Fatalf("hostPort ADD after uninstall: %v", err)
	}
	serve(t, p, 80, "again")
	expectServer(t, l.remote, "tcp", hp(uplinkIP4, 8082), "again")
	serve(t, l.remote, 9091, "remote-again")
	if ans := expectServer(t, p, "tcp", hp(remoteIP4, 9091), "remote-again"); !strings.HasPrefix(ans.peer, uplinkIP4.String()+":") {
		t.Errorf("after re-install the remote host saw the pod as %s, want it masqueraded behind %s", ans.peer, uplinkIP4)
	}
	if err := l.Del(p, "again", "eth0"); err != nil {
		t.Fatal(err)
	}
	agent.Stop()
	uninstalled("after the second install's uninstall")
}

// TestUninstallSymlinksPlanted: symlinks planted under the pin directory
// (progs/, node/), the state directory and the conf directory point at
// another program's pins and at files outside; uninstall removes at most
// the symlinks: another program's tcx link stays attached, its pins and the
// files outside stay.
func TestUninstallSymlinksPlanted(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	f := newForeignTool(t)
	l.stopped()
	if err := l.InNode(func() error { f.tcx("uplink0", ebpf.AttachTCXEgress, "link"); return nil }); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	for name, body := range map[string]string{
		"keep":            "not ebpf-cni's",
		"keep.json":       "{}",
		"linked.conflist": `{"cniVersion":"1.0.0","name":"linked","plugins":[{"type":"ebpf-cni","pinDir":"` + l.PinDir + `"}]}`,
	} {
		if err := os.WriteFile(filepath.Join(outside, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		filepath.Join(l.PinDir, "progs", "zz-foreign"):    filepath.Join(f.dir, "prog"),
		filepath.Join(l.PinDir, "node", "zz-foreign"):     filepath.Join(f.dir, "link"),
		filepath.Join(l.StateDir, "zz-elsewhere"):         outside,
		filepath.Join(l.StateDir, l.Name, "zz_eth9.json"): filepath.Join(outside, "keep.json"),
		filepath.Join(l.confDir, "30-linked.conflist"):    filepath.Join(outside, "linked.conflist"),
		filepath.Join(l.StateDir, l.Name, "zz-dir-link"):  outside,
	} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatalf("plant %s: %v", link, err)
		}
	}

	stdout, stderr, code := l.uninstall()
	t.Logf("uninstall: exit %d\n%s\n%s", code, stdout, stderr)
	if code != 0 {
		t.Errorf("uninstall with symlinks planted: exit %d, want 0 (the symlinks removed, not followed)", code)
	}
	if _, err := os.Lstat(l.PinDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("our pin directory after uninstall: %v, want it gone", err)
	}
	var on bool
	l.InNode(func() error { on = f.attached("uplink0", ebpf.AttachTCXEgress); return nil })
	if !on {
		t.Error("uninstall detached another program's tcx link from uplink0 (its program was symlinked into progs/)")
	}
	f.pinsLeft("link")
	for _, n := range []string{"keep", "keep.json", "linked.conflist"} {
		if _, err := os.Stat(filepath.Join(outside, n)); err != nil {
			t.Errorf("a file outside the directories of ebpf-cni, symlinked into them: %v", err)
		}
	}
}

// TestUninstallPinDirDotDot: the pin directory given as <ours>/.. (the
// directory holding it and another program's pins, as /sys/fs/bpf holds
// every tool's) removes nothing of the other program; given as
// <elsewhere>/../<ours> it is ours, and the node is as before install.
func TestUninstallPinDirDotDot(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	parent := filepath.Join(datapath.BPFFSRoot, testenv.RandName("ebpf-cni-test-parent-"))
	if err := os.Mkdir(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	l.PinDir = filepath.Join(parent, "ebpf-cni")
	foreignDir := filepath.Join(parent, "foreign")
	if err := os.Mkdir(foreignDir, 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(filepath.Join(foreignDir, "map")); err != nil {
		t.Fatal(err)
	}
	before := l.snapshot()
	l.stopped()

	stdout, stderr, code := l.uninstall("--pin-dir", l.PinDir+"/..")
	t.Logf("uninstall --pin-dir %s/..: exit %d\n%s\n%s", l.PinDir, code, stdout, stderr)
	if _, err := os.Stat(filepath.Join(foreignDir, "map")); err != nil {
		t.Errorf("another program's pin beside the pin directory, after uninstall --pin-dir <ours>/..: %v", err)
	}
	if _, err := os.Stat(filepath.Join(l.PinDir, "node")); err != nil {
		t.Fatalf("uninstall of <ours>/.. removed our pins: %v", err)
	}

	if code == 0 || !strings.Contains(stderr, "not a pin directory of ebpf-cni") {
		t.Errorf("uninstall --pin-dir <ours>/..: exit %d, want a refusal saying it is not a pin directory of ebpf-cni", code)
	}

	// One of our entries replaced by a symlink to another's pins: refused,
	// nothing loaded or removed through it.
	planted := filepath.Join(l.PinDir, "maps_v999")
	if err := os.Symlink(foreignDir, planted); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = l.uninstall()
	if code == 0 || !strings.Contains(stderr, "maps_v999") {
		t.Errorf("uninstall with maps_v999 a symlink: exit %d, want a refusal naming it\n%s\n%s", code, stdout, stderr)
	}
	if _, err := os.Stat(filepath.Join(foreignDir, "map")); err != nil {
		t.Errorf("another program's pin, symlinked as our maps_v999: %v", err)
	}
	os.Remove(planted)

	stdout, stderr, code = l.uninstall("--pin-dir", filepath.Join(parent, "foreign")+"/../ebpf-cni")
	if code != 0 {
		t.Fatalf("uninstall --pin-dir <elsewhere>/../<ours>: exit %d\n%s\n%s", code, stdout, stderr)
	}
	l.assertAsBefore(before, "after uninstall --pin-dir <elsewhere>/../<ours>")
	if _, err := os.Stat(filepath.Join(foreignDir, "map")); err != nil {
		t.Errorf("another program's pin: %v", err)
	}
}

// TestUninstallStateDirParent: --state-dir given as the directory holding
// the state directory beside other CNIs' data (as /var/lib/cni holds
// host-local's networks/ and libcni's results/) removes none of theirs.
func TestUninstallStateDirParent(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	cniDir := t.TempDir()
	l.StateDir = filepath.Join(cniDir, "ebpf-cni")
	theirs := map[string]string{
		"networks/othernet/10.88.0.5":          "containerid\neth0",
		"networks/othernet/last_reserved_ip.0": "10.88.0.5",
		"results/othernet-abc-eth0":            `{"kind":"cniCacheV1"}`,
		"multus/abc.json":                      `{"theirs":true}`,
	}
	for p, body := range theirs {
		path := filepath.Join(cniDir, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l.stopped()
	stdout, stderr, code := l.uninstall("--state-dir", l.StateDir+"/..")
	t.Logf("uninstall --state-dir %s/..: exit %d\n%s\n%s", l.StateDir, code, stdout, stderr)
	for p := range theirs {
		if _, err := os.Stat(filepath.Join(cniDir, p)); err != nil {
			t.Errorf("another CNI's file beside the state directory: %v", err)
		}
	}
}

// TestUninstallOtherInstallsRecords: another ebpf-cni install on the node
// (its own pin directory, its conflist in a conf dir of its own, as a
// Multus network's is) keeps its records in the same state directory. Our
// uninstall, even --force, leaves its pod, veth and records alone: its veth
// runs none of our programs.
func TestUninstallOtherInstallsRecords(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	l.stopped()
	other := l.Sibling(t)
	other.StateDir = l.StateDir
	op := other.NewPod()
	other.CleanupDel(op, "theirs")
	other.Add(op, "theirs")

	stdout, stderr, code := l.uninstall("--force")
	t.Logf("uninstall --force: exit %d\n%s\n%s", code, stdout, stderr)
	if code != 0 {
		t.Errorf("uninstall beside another install's pod: exit %d, want 0", code)
	}
	if strings.Contains(stderr, "theirs") {
		t.Errorf("uninstall took another install's pod for ours:\n%s", stderr)
	}
	if _, err := os.Stat(filepath.Join(l.StateDir, other.Name)); err != nil {
		t.Errorf("the other install's records: %v", err)
	}
	host, _ := other.HostVeth("theirs")
	other.HostIfindex(host) // fails the test when gone
	if err := testenv.Ping(op, testenv.NodeIP4, 2); err != nil {
		t.Errorf("the other install's pod after our uninstall: %v", err)
	}
	if err := other.Check(op, "theirs", "eth0"); err != nil {
		t.Errorf("CHECK of the other install's pod after our uninstall: %v", err)
	}
	other.MustDel(op, "theirs")
}

// TestUninstallOnStopKeyValues: the DaemonSet's cleanup mode stops without
// uninstalling for every value of the key but "true" and "force": a
// malformed one ("True", "yes", "force please"), an empty one, and "force"
// flipped back to "false" before the stop (a rolling upgrade after the
// operator changed their mind). The node hooks, pins and conflist stay,
// and the agent says the mode is off.
func TestUninstallOnStopKeyValues(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	l.install()
	mode := filepath.Join(t.TempDir(), "uninstall-on-stop")
	conflist := filepath.Join(l.confDir, "10-ebpf-cni.conflist")
	for _, c := range []struct{ first, atStop string }{
		{"True", "True"}, {"yes", "yes"}, {"force please", "force please"}, {"", ""}, {"force", "false"},
	} {
		if err := os.WriteFile(mode, []byte(c.first+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		a := l.StartAgent(l.confDir, "--cgroup-root", l.cgroupRoot, "--uninstall-on-stop", mode)
		want := "uninstall-on-stop: off"
		if c.first == "force" {
			want = "uninstall-on-stop: force"
		}
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(a.Logs(), want); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("key %q: the agent did not log %q:\n%s", c.first, want, a.Logs())
			}
		}
		if err := os.WriteFile(mode, []byte(c.atStop+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		a.Cmd.Process.Signal(unix.SIGTERM)
		err, ok := a.Exited(30e9)
		if !ok {
			t.Fatalf("the agent did not end within 30s of SIGTERM:\n%s", a.Logs())
		}
		if err != nil {
			t.Errorf("key %q then %q: agent stop: %v\n%s", c.first, c.atStop, err, a.Logs())
		}
		if strings.Contains(a.Logs(), "uninstalling the node") {
			t.Errorf("key %q then %q: the agent uninstalled the node:\n%s", c.first, c.atStop, a.Logs())
		}
		if len(datapath.NodeHookPins(l.PinDir)) == 0 {
			t.Errorf("key %q then %q: the node hooks are gone after the stop", c.first, c.atStop)
		}
		if _, err := os.Stat(conflist); err != nil {
			t.Errorf("key %q then %q: the conflist after the stop: %v", c.first, c.atStop, err)
		}
	}
}

// TestUninstallConfTemplateNameOfAnother: --cni-conf-template names the
// conflist the agent rendered by its base name; a conflist of that name that
// is another CNI's (written there after a switch) stays.
func TestUninstallConfTemplateNameOfAnother(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	l.stopped()
	theirs := filepath.Join(l.confDir, "05-shared.conflist")
	if err := os.WriteFile(theirs, []byte(`{"cniVersion":"1.0.0","name":"othercni","plugins":[{"type":"bridge","bridge":"cni0"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := l.uninstall("--cni-conf-template", filepath.Join(t.TempDir(), "05-shared.conflist"))
	if code != 0 {
		t.Errorf("uninstall: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if _, err := os.Stat(theirs); err != nil {
		t.Errorf("another CNI's conflist named as the template: %v\n%s", err, stdout)
	}
	if _, err := os.Stat(filepath.Join(l.confDir, "10-ebpf-cni.conflist")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("our conflist after uninstall: %v, want it gone", err)
	}
}
