// Older kernels: each fallback of a kernel feature (docs/compat.md), forced
// on this kernel with EBPF_CNI_FORCE_FALLBACK (CI runs the selected tests a
// second time with EBPF_CNI_FORCE_FALLBACK=all: make test-fallback). The
// tests here assert the path in use either way: tcx links or cls_bpf
// filters on the uplinks, BPF_FIB_LOOKUP_SRC or the uplink's address.

package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// forced tells whether this run forces the fallback of feature name.
func forced(name string) bool {
	for _, f := range strings.Split(os.Getenv(datapath.ForceFallbackEnv), ",") {
		f = strings.TrimSpace(f)
		// One compat build replaces the three helpers: forcing one forces all.
		if f == datapath.FeatTimer || f == datapath.FeatLoop || f == datapath.FeatReadKernel {
			f = "compat"
		}
		if name == datapath.FeatTimer || name == datapath.FeatLoop || name == datapath.FeatReadKernel {
			name = "compat"
		}
		if f == name || f == "all" && name != datapath.FeatRedirectPeer && name != datapath.FeatRedirectNeig &&
			name != datapath.FeatSockAddr {
			return true
		}
	}
	return false
}

// uplinkMode says how uplink ifname carries the uplink programs: "tcx"
// (both pinned links attached to it), "tc" (both cls_bpf filters), or what
// is wrong.
func uplinkMode(t *testing.T, e *testenv.Env, ifname string) string {
	t.Helper()
	idx := e.HostIfindex(ifname)
	var pins, filters int
	for _, p := range []string{"uplink_", "uplink-egress_"} {
		l, err := link.LoadPinnedLink(filepath.Join(e.PinDir, "node", p+ifname), nil)
		if err == nil {
			if info, err := l.Info(); err == nil && info.TCX() != nil && int(info.TCX().Ifindex) == idx {
				pins++
			}
			l.Close()
		}
	}
	_ = e.InNode(func() error {
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			return err
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, _ := netlink.FilterList(l, parent)
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "cni-uplink-") {
					filters++
				}
			}
		}
		return nil
	})
	switch {
	case pins == 2 && filters == 0:
		return "tcx"
	case filters == 2 && pins == 0:
		return "tc"
	}
	return fmt.Sprintf("%d tcx links and %d cls_bpf filters", pins, filters)
}

func wantUplinkMode(t *testing.T, e *testenv.Env, ifname string) {
	t.Helper()
	want := "tcx"
	if forced(datapath.FeatTCX) {
		want = "tc"
	}
	if got := uplinkMode(t, e, ifname); got != want {
		t.Errorf("uplink %s carries the uplink programs as %s, want %s (%s=%q)", ifname, got, want,
			datapath.ForceFallbackEnv, os.Getenv(datapath.ForceFallbackEnv))
	}
}

// TestCompatStatusNamesFeatures: `ebpf-agent status` and the STATUS verb name
// the features in use and the fallbacks; a force of a feature that has no
// fallback is refused, naming it.
func TestCompatStatusNamesFeatures(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := e.NewPod()
	e.CleanupDel(p, "a")
	e.Add(p, "a")
	out, err := e.AgentCmd("status", "-o", "json", "--pin-dir", e.PinDir)
	var st inspect.StatusReport
	if jerr := json.Unmarshal([]byte(out), &st); jerr != nil {
		t.Fatalf("status: %v, %v\n%s", err, jerr, out)
	}
	seen := map[string]datapath.Feature{}
	for _, f := range st.Features {
		seen[f.Name] = f
	}
	for _, n := range []string{datapath.FeatTCX, datapath.FeatFibSrc, datapath.FeatRedirectPeer, datapath.FeatTimer, datapath.FeatLoop,
		datapath.FeatReadKernel, datapath.FeatSockAddr, datapath.FeatNetnsCookie} {
		f, ok := seen[n]
		if !ok {
			t.Errorf("status lists no feature %s: %+v", n, st.Features)
			continue
		}
		if !f.Have {
			t.Errorf("status says this kernel lacks %s: %+v", n, f)
		}
		if f.Forced != forced(n) {
			t.Errorf("status says %s forced=%v, the run forces it: %v", n, f.Forced, forced(n))
		}
	}
	if want := map[bool]string{true: "compat", false: "full"}[forced(datapath.FeatTimer)]; st.Build != want {
		t.Errorf("status says the node runs the %q build, want %q", st.Build, want)
	}
	table, err := e.AgentCmd("status", "--pin-dir", e.PinDir)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, table)
	}
	for _, s := range []string{"KERNEL FEATURE", "tcx", "fibsrc", "bpf_loop"} {
		if !strings.Contains(table, s) {
			t.Errorf("status table lacks %q:\n%s", s, table)
		}
	}

	// STATUS, as a runtime runs it, with a fallback forced and with a name
	// that has none.
	status := func(force string) (stdout, stderr string, err error) {
		var o, s bytes.Buffer
		err = e.InNode(func() error {
			cmd := exec.Command(filepath.Join(testenv.BinDir, "ebpf-cni"))
			cmd.Env = []string{"CNI_COMMAND=STATUS", "CNI_PATH=" + testenv.BinDir, datapath.ForceFallbackEnv + "=" + force}
			cmd.Stdin = bytes.NewReader(e.StdinConf(nil))
			cmd.Stdout, cmd.Stderr = &o, &s
			return cmd.Run()
		})
		return o.String(), s.String(), err
	}
	o, s, err := status("tcx,fibsrc,so_netns_cookie")
	if err != nil || o != "" {
		t.Fatalf("STATUS with fallbacks forced: %v, stdout %q, stderr %q", err, o, s)
	}
	if !strings.Contains(s, "so_netns_cookie (forced), tcx (forced), fibsrc (forced)") || !strings.Contains(s, "in use: redirect_peer") {
		t.Errorf("STATUS does not name the features in use and the fallbacks: %q", s)
	}
	o, _, err = status("tcx,redirect_peer")
	if err == nil {
		t.Fatalf("STATUS forcing redirect_peer (no fallback) succeeded")
	}
	perr := testenv.PluginError(t, []byte(o))
	if perr.Code != 7 || !strings.Contains(perr.Msg, `"redirect_peer" has no fallback`) || !strings.Contains(perr.Msg, datapath.ForceFallbackEnv) {
		t.Errorf("STATUS forcing redirect_peer: %d %q, want 7 naming the variable and redirect_peer", perr.Code, perr.Msg)
	}
}

// TestCompatAttachModeTCXRefused: attachMode tcx where tcx is forced off is
// refused at ADD (7) naming the field, before anything is made.
func TestCompatAttachModeTCXRefused(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := e.NewPod()
	stdin := e.StdinConf(func(c map[string]any) { c["attachMode"] = "tcx" })
	env := pluginEnv("ADD", "c1", p, "eth0")
	env[datapath.ForceFallbackEnv] = "tcx"
	out, err := e.ExecPlugin(env, stdin)
	wantPluginError(t, "ADD with attachMode tcx, tcx forced off", out, err, 7, "attachMode", "tcx", datapath.ForceFallbackEnv)
	e.AssertClean()
}

// TestCompatPacing: a rate-limited pod gets the node's TCP pacing program
// (sock_ops on the cgroup root) where the kernel's sock_ops has
// bpf_get_netns_cookie, and none with it forced off, where its UDP is still
// policed by the token bucket.
func TestCompatPacing(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a := e.NewPod()
	e.CleanupDel(a, "bw")
	const rate = 20e6
	if _, err := e.AddBW(a, "bw", bandwidthArgs(0, rate)); err != nil {
		t.Fatal(err)
	}
	_, pinned := os.Stat(datapath.PacingLinkPin(e.PinDir))
	if off := forced(datapath.FeatSockOpsNetns); off != (pinned != nil) {
		t.Errorf("pacing link pinned: %v, pacing forced off: %v", pinned == nil, off)
	}
	const sendFor = time.Second
	sent, got := udpBlast(t, a, e.Node, testenv.NodeIP4, sendFor, 3*time.Second, 0)
	limit := rate/8*sendFor.Seconds() + rate/8*0.05
	if float64(sent) < 2*limit || float64(got) > 1.1*limit || float64(got) < 0.5*limit {
		t.Errorf("sent %d, received %d bytes in %v at %v bit/s: want about %d", sent, got, sendFor, rate, int64(limit))
	}
	e.MustDel(a, "bw")
	e.AssertClean()
}

// TestCompatNetnsCookie: the node hooks key the node's netns by the cookie
// SO_NETNS_COOKIE reads, or (so_netns_cookie forced, as before 5.14) by the
// one a cgroup connect4 program learns: the same number, which the socket
// hooks' bpf_get_netns_cookie matches (a node-local client reaches the
// hostPort). A pod's cookie is recorded only where something reads it (the
// pacing program) or it costs one getsockopt.
func TestCompatNetnsCookie(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	p := h.NewPod()
	h.CleanupDel(p, "web")
	h.MustAddHP(p, "web", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	serve(t, p, 80, "web")
	truth := func(n ns.NetNS) (c uint64) {
		t.Helper()
		if err := n.Do(func(ns.NetNS) (err error) {
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			c, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	cfg, err := h.Maps().Node().Config()
	if err != nil {
		t.Fatal(err)
	}
	if node := truth(h.Node); cfg.NetnsCookie != node {
		t.Errorf("hostPort hooks key netns cookie %d, the node's is %d (so_netns_cookie forced: %v)", cfg.NetnsCookie, node, forced(datapath.FeatNetnsCookie))
	}
	expectServer(t, h.Node, "tcp", hp(net.ParseIP("127.0.0.1"), 8080), "web")

	rec, err := h.Store().Read("web", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	pod := truth(p)
	want := pod
	if forced(datapath.FeatNetnsCookie) && forced(datapath.FeatSockOpsNetns) {
		want = 0
	}
	if rec.NetnsCookie != want {
		t.Errorf("the record holds netns cookie %d, want %d (the pod's is %d)", rec.NetnsCookie, want, pod)
	}
	if _, err := testenv.LookupNetns(h.Maps(), pod); (err == nil) != (want != 0) {
		t.Errorf("the pod's cni_netns entry: lookup error %v, want an entry: %v", err, want != 0)
	}
	h.MustDel(p, "web")
	h.AssertClean()
}

// noCgroup2Plugin is a plugin binary that runs ebpf-cni in a mount
// namespace of its own without the host's cgroup2 mount (the host keeps it).
func noCgroup2Plugin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ebpf-cni-no-cgroup2")
	script := `#!/bin/sh
exec unshare -m --propagation private sh -c 'for m in /sys/fs/cgroup/unified /sys/fs/cgroup; do
  [ "$(stat -f -c %T "$m" 2>/dev/null)" = cgroup2fs ] && umount -l "$m"; done
  grep -q " - cgroup2 " /proc/self/mountinfo && exit 99; exec "$0"' ` + filepath.Join(testenv.BinDir, "ebpf-cni") + "\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestCompatNetnsCookieNoCgroup2: without SO_NETNS_COOKIE (forced) and
// without a cgroup2 mount the netns cookie cannot be learned: STATUS says so
// (nothing falls back silently); an ADD still works (the pod's cookie only
// serves pacing, which needs cgroup2 too); an ADD with a hostPort fails
// naming cgroup2 (as on any kernel without it) and leaves nothing; and a
// later ADD by a process that has both keys the node hooks with the real
// cookie, so the node's own clients reach the hostPort.
func TestCompatNetnsCookieNoCgroup2(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	bin := noCgroup2Plugin(t)
	force := datapath.ForceFallbackEnv + "=" + datapath.FeatNetnsCookie

	var stderr bytes.Buffer
	err := h.InNode(func() error {
		cmd := exec.Command(bin)
		cmd.Env = []string{"CNI_COMMAND=STATUS", "CNI_PATH=" + testenv.BinDir, force}
		cmd.Stdin = bytes.NewReader(h.StdinConf(nil))
		cmd.Stderr = &stderr
		return cmd.Run()
	})
	if err != nil {
		t.Fatalf("STATUS without cgroup2: %v\n%s", err, stderr.String())
	}
	if s := stderr.String(); !strings.Contains(s, "so_netns_cookie (forced; the fallback fails:") ||
		!strings.Contains(s, "no cgroup2 mount") || !strings.Contains(s, datapath.FeatSockAddr) {
		t.Errorf("STATUS does not name the failing netns cookie fallback: %q", s)
	}

	add := func(p ns.NetNS, id string, pms ...map[string]any) ([]byte, error) {
		env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": id, "CNI_NETNS": p.Path(), "CNI_IFNAME": "eth0",
			"CNI_PATH": testenv.BinDir, datapath.ForceFallbackEnv: datapath.FeatNetnsCookie}
		return h.RunPlugin(bin, env, h.StdinConf(func(c map[string]any) {
			if len(pms) > 0 {
				c["runtimeConfig"] = map[string]any{"portMappings": pms}
			}
		}))
	}
	a := h.NewPod()
	h.CleanupDel(a, "plain")
	if out, err := add(a, "plain"); err != nil {
		t.Fatalf("ADD without cgroup2: %v\n%s", err, out)
	}
	if rec, err := h.Store().Read("plain", "eth0"); err != nil || rec.NetnsCookie != 0 {
		t.Errorf("the record of an ADD that cannot learn the cookie: %+v, %v; want no cookie", rec, err)
	}
	h.MustDel(a, "plain")

	p := h.NewPod()
	h.CleanupDel(p, "web")
	out, err := add(p, "web", map[string]any{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"})
	wantPluginError(t, "ADD with a hostPort without cgroup2", out, err, 50, "cgroup2")
	h.AssertClean()

	// A process that has both (cgroup2, SO_NETNS_COOKIE) keys them.
	h.MustAddHP(p, "web", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	serve(t, p, 80, "web")
	expectServer(t, h.Node, "tcp", hp(net.ParseIP("127.0.0.1"), 8080), "web")
	expectServer(t, h.remote, "tcp", hp(uplinkIP4, 8080), "web")
	if cfg, err := h.Maps().Node().Config(); err != nil || cfg.NetnsCookie == 0 {
		t.Errorf("hostPort config after an ADD with cgroup2: %+v, %v; want the node's cookie", cfg, err)
	}
	h.MustDel(p, "web")
	h.AssertClean()
}
