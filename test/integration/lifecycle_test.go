package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// CNI error codes of the spec (SPEC.md, "Error"), as the types package names them.
const (
	codeIncompatibleVersion = types.ErrIncompatibleCNIVersion      // 1
	codeInvalidEnv          = types.ErrInvalidEnvironmentVariables // 4
	codeDecoding            = types.ErrDecodingFailure             // 6
	codeInvalidConfig       = types.ErrInvalidNetworkConfig        // 7
	codePluginNotAvailable  = uint(50)
)

// --- helpers local to this file -------------------------------------------

// destroyPod closes and unmounts a pod netns, so the kernel destroys it and
// the pod end of the veth (and with it the host end) goes away.
func destroyPod(t *testing.T, pod ns.NetNS) {
	t.Helper()
	if err := pod.Close(); err != nil {
		t.Fatalf("close pod netns: %v", err)
	}
	if err := testutils.UnmountNS(pod); err != nil {
		t.Fatalf("unmount pod netns: %v", err)
	}
}

// wantErrContains fails unless err is non-nil and its message contains every
// substring (case-insensitive).
func wantErrContains(t *testing.T, what string, err error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: succeeded, want an error", what)
	}
	msg := strings.ToLower(err.Error())
	for _, s := range subs {
		if !strings.Contains(msg, strings.ToLower(s)) {
			t.Errorf("%s: error %q does not mention %q", what, err, s)
		}
	}
}

// --- 1. DEL -----------------------------------------------------------------

// TestLifecycleDel: DEL removes every trace, is idempotent, and needs neither
// the pod netns, nor the host veth, nor an earlier ADD.
func TestLifecycleDel(t *testing.T) {
	t.Run("two pods then clean", func(t *testing.T) {
		e := testenv.New(t)
		a, b := e.NewPod(), e.NewPod()
		pa := e.AddAttachment(a, "del-a")
		pb := e.AddAttachment(b, "del-b")
		if len(e.Leftovers()) == 0 {
			t.Fatal("leftovers() sees nothing after two ADDs; the clean check would prove nothing")
		}
		for _, p := range []*testenv.Attachment{pa, pb} {
			if err := e.Del(p.Pod, p.ID, "eth0"); err != nil {
				t.Fatalf("DEL %s: %v", p.ID, err)
			}
		}
		e.AssertGone(pa)
		e.AssertGone(pb)
		e.AssertClean()
		// The pod side is gone too.
		err := a.Do(func(ns.NetNS) error {
			if _, err := netlink.LinkByName("eth0"); err == nil {
				return errors.New("eth0 still exists in the pod after DEL")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}

		// DEL again: success, still clean.
		for _, p := range []*testenv.Attachment{pa, pb} {
			if err := e.Del(p.Pod, p.ID, "eth0"); err != nil {
				t.Fatalf("second DEL %s: %v", p.ID, err)
			}
		}
		e.AssertClean()
	})

	t.Run("pod netns gone", func(t *testing.T) {
		e := testenv.New(t)
		pod := e.NewPod()
		p := e.AddAttachment(pod, "del-nonetns")
		destroyPod(t, pod)
		if err := e.Del(pod, p.ID, "eth0"); err != nil {
			t.Fatalf("DEL after the pod netns is gone: %v", err)
		}
		// Whatever the kernel had not yet reaped, DEL removed; wait for the
		// kernel's side anyway so nothing can appear after the check.
		e.WaitLinkGone(p.HostIf)
		e.AssertGone(p)
		e.AssertClean()
		if err := e.Del(pod, p.ID, "eth0"); err != nil {
			t.Fatalf("second DEL after the pod netns is gone: %v", err)
		}
		e.AssertClean()
	})

	t.Run("host veth deleted by hand", func(t *testing.T) {
		e := testenv.New(t)
		pod := e.NewPod()
		p := e.AddAttachment(pod, "del-noveth")
		err := e.InNode(func() error {
			l, err := netlink.LinkByName(p.HostIf)
			if err != nil {
				return err
			}
			return netlink.LinkDel(l)
		})
		if err != nil {
			t.Fatalf("delete %s by hand: %v", p.HostIf, err)
		}
		if err := e.Del(pod, p.ID, "eth0"); err != nil {
			t.Fatalf("DEL after the host veth was deleted: %v", err)
		}
		e.AssertGone(p)
		e.AssertClean()
	})

	t.Run("never added", func(t *testing.T) {
		// On a node whose datapath was never set up...
		e := testenv.New(t)
		pod := e.NewPod()
		if err := e.Del(pod, "never-added", "eth0"); err != nil {
			t.Fatalf("DEL of a never-added container on an empty node: %v", err)
		}
		if err := e.Del(nil, "never-added", "eth0"); err != nil {
			t.Fatalf("DEL without netns of a never-added container: %v", err)
		}
		e.AssertClean()

		// ...and on one that has other pods, which must not be touched.
		other := e.AddAttachment(e.NewPod(), "del-bystander")
		if err := e.Del(pod, "never-added", "eth0"); err != nil {
			t.Fatalf("DEL of a never-added container next to a pod: %v", err)
		}
		if err := e.Check(other.Pod, other.ID, "eth0"); err != nil {
			t.Fatalf("CHECK of the bystander after an unrelated DEL: %v", err)
		}
		if err := testenv.Ping(other.Pod, testenv.NodeIP4, 1); err != nil {
			t.Fatalf("bystander after an unrelated DEL: %v", err)
		}
		if err := e.Del(other.Pod, other.ID, "eth0"); err != nil {
			t.Fatal(err)
		}
		e.AssertClean()
	})
}

// flood sends UDP datagrams from inside pod to dst as fast as it can until
// the returned stop is called. The socket is created in the pod netns, so the
// packets leave through the pod's veth; send errors (the veth going away, ICMP
// port unreachable) are ignored. It also stops when the test ends.
func flood(t *testing.T, pod ns.NetNS, dst net.IP) (stop func()) {
	t.Helper()
	var conn net.Conn
	err := pod.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.Dial("udp", net.JoinHostPort(dst.String(), "9"))
		return err
	})
	if err != nil {
		t.Fatalf("open flood socket in pod: %v", err)
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		buf := make([]byte, 64)
		for {
			select {
			case <-done:
				return
			default:
			}
			conn.Write(buf)
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			<-finished
			conn.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestLifecycleDelUnderTraffic: a pod that is busy sending when it is deleted
// must leave nothing behind, counters included: nothing may re-create map
// state after DEL has cleared it.
func TestLifecycleDelUnderTraffic(t *testing.T) {
	e := testenv.New(t)
	for i := 0; i < 3; i++ {
		pod := e.NewPod()
		p := e.AddAttachment(pod, fmt.Sprintf("del-busy-%d", i))
		stop := flood(t, pod, testenv.NodeIP4)
		// DEL while the datapath is counting the flood, not before it starts.
		m := e.Maps()
		deadline := time.Now().Add(5 * time.Second)
		for counter(t, m, p.Ifindex, maps.DirEgress, maps.ReasonForward).Packets < 100 {
			if time.Now().After(deadline) {
				stop()
				t.Fatalf("the flood is not flowing: %s", dumpCounters(m, p.Ifindex))
			}
			time.Sleep(5 * time.Millisecond)
		}
		delErr := e.Del(pod, p.ID, "eth0")
		stop()
		if delErr != nil {
			t.Fatalf("DEL of a busy pod: %v", delErr)
		}
		e.AssertGone(p)
		e.AssertClean()
	}
}

// --- 2. CHECK ---------------------------------------------------------------

// TestLifecycleCheck: CHECK passes right after ADD and names each kind of
// damage: a missing route in the pod, a detached program, a missing map entry.
func TestLifecycleCheck(t *testing.T) {
	e := testenv.New(t)
	cases := []struct {
		name   string
		damage func(t *testing.T, p *testenv.Attachment)
		want   func(p *testenv.Attachment) []string // substrings of the CHECK error
	}{
		{
			name: "default route removed in pod",
			damage: func(t *testing.T, p *testenv.Attachment) {
				err := p.Pod.Do(func(ns.NetNS) error {
					routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
					if err != nil {
						return err
					}
					for _, r := range routes {
						if r.Dst == nil || r.Dst.IP.Equal(net.IPv4zero) {
							if ones, _ := maskOnes(r.Dst); ones == 0 {
								return netlink.RouteDel(&r)
							}
						}
					}
					return errors.New("pod has no IPv4 default route")
				})
				if err != nil {
					t.Fatalf("delete default route: %v", err)
				}
			},
			want: func(*testenv.Attachment) []string { return []string{"route", "0.0.0.0", "not found"} },
		},
		{
			name: "ingress program detached",
			damage: func(t *testing.T, p *testenv.Attachment) {
				l, err := link.LoadPinnedLink(datapath.LinkPinPath(e.PinDir, p.HostIf, "ingress"), nil)
				if err != nil {
					t.Fatalf("load pinned ingress link of %s: %v", p.HostIf, err)
				}
				defer l.Close()
				if err := l.Detach(); err != nil {
					t.Fatalf("detach ingress link of %s: %v", p.HostIf, err)
				}
			},
			want: func(p *testenv.Attachment) []string { return []string{"not attached", p.HostIf, "ingress"} },
		},
		{
			name: "endpoint map entry deleted",
			damage: func(t *testing.T, p *testenv.Attachment) {
				if err := e.Maps().DeleteEndpoint(p.IPs[0], 0); err != nil {
					t.Fatalf("delete endpoint %s: %v", p.IPs[0], err)
				}
			},
			want: func(p *testenv.Attachment) []string { return []string{"cni_endpoints", p.IPs[0].String()} },
		},
	}
	var added []*testenv.Attachment
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := e.AddAttachment(e.NewPod(), fmt.Sprintf("check-%d", i))
			added = append(added, p)
			if err := e.Check(p.Pod, p.ID, "eth0"); err != nil {
				t.Fatalf("CHECK right after ADD: %v", err)
			}
			c.damage(t, p)
			err := e.Check(p.Pod, p.ID, "eth0")
			wantErrContains(t, "CHECK after damage", err, c.want(p)...)
		})
	}
	// Damaged or not, DEL cleans up.
	for _, p := range added {
		if err := e.Del(p.Pod, p.ID, "eth0"); err != nil {
			t.Fatalf("DEL %s: %v", p.ID, err)
		}
	}
	e.AssertClean()
}

func maskOnes(n *net.IPNet) (int, int) {
	if n == nil {
		return 0, 0
	}
	return n.Mask.Size()
}

// --- 3. GC ------------------------------------------------------------------

// TestLifecycleGC: GC with one valid attachment removes the two others
// completely and leaves the valid one working. Run once through libcni as a
// runtime would (libcni DELs the stale attachments it has cached, then calls
// the plugin's GC), and once with libcni's cache lost, so the plugin's own
// GC has to find the stale attachments from its records.
func TestLifecycleGC(t *testing.T) {
	for _, lostCache := range []bool{false, true} {
		name := "libcni cache"
		if lostCache {
			name = "plugin records only"
		}
		t.Run(name, func(t *testing.T) {
			e := testenv.New(t)
			var ps []*testenv.Attachment
			for i := 0; i < 3; i++ {
				ps = append(ps, e.AddAttachment(e.NewPod(), fmt.Sprintf("gc-%d", i)))
			}
			keep, stale := ps[1], []*testenv.Attachment{ps[0], ps[2]}
			if lostCache {
				if err := os.RemoveAll(e.CacheDir); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(e.CacheDir, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.GC(types.GCAttachment{ContainerID: keep.ID, IfName: "eth0"}); err != nil {
				t.Fatalf("GC: %v", err)
			}
			for _, p := range stale {
				e.AssertGone(p)
			}
			// Everything of the valid attachment is still in place.
			have := map[string]bool{}
			for _, tr := range e.Traces(keep) {
				have[tr] = true
			}
			want := []string{
				"host veth " + keep.HostIf,
				"link pin " + datapath.LinkPinPath(e.PinDir, keep.HostIf, "ingress"),
				"link pin " + datapath.LinkPinPath(e.PinDir, keep.HostIf, "egress"),
				"state record of " + keep.ID,
				fmt.Sprintf("links map entry %d", keep.Ifindex),
			}
			for _, ip := range keep.IPs {
				want = append(want, "ipam reservation "+ip.String(), "endpoint map entry "+ip.String())
			}
			for _, w := range want {
				if !have[w] {
					t.Errorf("GC removed %s of the valid attachment", w)
				}
			}
			if err := testenv.Ping(keep.Pod, testenv.NodeIP4, 2); err != nil {
				t.Fatalf("valid pod after GC: %v", err)
			}
			if !lostCache {
				// libcni's cached result is still there only in this variant.
				if err := e.Check(keep.Pod, keep.ID, "eth0"); err != nil {
					t.Fatalf("CHECK of the valid pod after GC: %v", err)
				}
			}
			// A second GC changes nothing.
			if err := e.GC(types.GCAttachment{ContainerID: keep.ID, IfName: "eth0"}); err != nil {
				t.Fatalf("second GC: %v", err)
			}
			if err := testenv.Ping(keep.Pod, testenv.NodeIP4, 1); err != nil {
				t.Fatalf("valid pod after second GC: %v", err)
			}
			if err := e.Del(keep.Pod, keep.ID, "eth0"); err != nil {
				t.Fatal(err)
			}
			e.AssertClean()
		})
	}
}

// --- 4. Concurrency ---------------------------------------------------------

// TestLifecycleConcurrent: 20 ADDs at once on a node whose pin directory is
// still empty (so they also race on bootstrapping the datapath) all succeed
// with distinct addresses; the pods talk; 20 DELs at once leave nothing.
func TestLifecycleConcurrent(t *testing.T) {
	const n = 20
	e := testenv.New(t)
	if _, err := os.Stat(e.PinDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pin directory should not exist yet: %v", err)
	}
	pods := make([]ns.NetNS, n)
	ids := make([]string, n)
	for i := range pods {
		pods[i] = e.NewPod()
		ids[i] = fmt.Sprintf("conc-%02d", i)
	}
	results := make([]*current.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			res, err := e.AddV("1.1.0", pods[i], ids[i], "eth0")
			if err == nil {
				results[i], err = current.NewResultFromResult(res)
			}
			errs[i] = err
		}(i)
	}
	close(start)
	wg.Wait()
	failed := false
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent ADD %s: %v", ids[i], err)
			failed = true
		}
	}
	if failed {
		t.FailNow()
	}
	seen := map[string]string{}
	for i, r := range results {
		v4, v6 := testenv.PodIPs(t, r)
		for _, ip := range []net.IP{v4, v6} {
			if other, dup := seen[ip.String()]; dup {
				t.Errorf("%s and %s both got %s", other, ids[i], ip)
			}
			seen[ip.String()] = ids[i]
		}
	}
	if eps, err := e.Maps().ListEndpoints(); err != nil || len(eps) != 2*n {
		t.Errorf("endpoints map has %d entries (err %v), want %d", len(eps), err, 2*n)
	}
	b4, b6 := testenv.PodIPs(t, results[n-1])
	if err := testenv.Ping(pods[0], b4, 2); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Ping(pods[0], b6, 2); err != nil {
		t.Fatal(err)
	}

	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = e.Del(pods[i], ids[i], "eth0")
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent DEL %s: %v", ids[i], err)
		}
	}
	e.AssertClean()
}

// TestLifecycleBootstrapRace repeats the cold start many times: every ADD
// racing on an empty pin directory must succeed and work.
func TestLifecycleBootstrapRace(t *testing.T) {
	const rounds, n = 5, 6
	for r := 0; r < rounds; r++ {
		e := testenv.New(t)
		pods := make([]ns.NetNS, n)
		for i := range pods {
			pods[i] = e.NewPod()
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				_, errs[i] = e.AddV("1.1.0", pods[i], fmt.Sprintf("boot-%d", i), "eth0")
			}(i)
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: cold-start ADD %d: %v", r, i, err)
			}
		}
		for i := 0; i < n; i++ {
			if err := e.Check(pods[i], fmt.Sprintf("boot-%d", i), "eth0"); err != nil {
				t.Fatalf("round %d: CHECK %d after cold start: %v", r, i, err)
			}
		}
		if err := testenv.Ping(pods[0], testenv.NodeIP4, 1); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		for i := 0; i < n; i++ {
			if err := e.Del(pods[i], fmt.Sprintf("boot-%d", i), "eth0"); err != nil {
				t.Fatalf("round %d: DEL %d: %v", r, i, err)
			}
		}
		e.AssertClean()
	}
}

// --- 5. Bad input -----------------------------------------------------------

// TestLifecycleBadInput runs the plugin binary with broken environments and
// configs: each must fail with the spec's error code, a message naming the
// problem, and leave nothing behind.
func TestLifecycleBadInput(t *testing.T) {
	type tc struct {
		name     string
		conf     func(e *testenv.Env, c map[string]any) // edit the otherwise valid config
		stdin    string                                 // raw stdin instead of the config
		envEdit  func(envv map[string]string)
		wantCode uint
		wantMsg  []string
	}
	cases := []tc{
		{name: "bad JSON", stdin: `{"cniVersion": "1.1.0", "name": "x", "type": "ebpf-cni", `, wantCode: codeDecoding},
		{
			name:     "missing ipam",
			conf:     func(e *testenv.Env, c map[string]any) { delete(c, "ipam") },
			wantCode: codeInvalidConfig, wantMsg: []string{"ipam"},
		},
		{
			name: "bad CIDR in ipam.ranges subnet",
			conf: func(e *testenv.Env, c map[string]any) {
				c["ipam"] = map[string]any{
					"type": "host-local", "dataDir": e.DataDir,
					"ranges": [][]map[string]string{{{"subnet": "10.250.0.0/33"}}},
				}
			},
			wantCode: codeInvalidConfig, wantMsg: []string{"ipam.ranges[0][0].subnet", "10.250.0.0/33"},
		},
		{
			name:     "mtu out of range",
			conf:     func(e *testenv.Env, c map[string]any) { c["mtu"] = 10 },
			wantCode: codeInvalidConfig, wantMsg: []string{"mtu"},
		},
		{
			name:     "relative pinDir",
			conf:     func(e *testenv.Env, c map[string]any) { c["pinDir"] = "relative/pins" },
			wantCode: codeInvalidConfig, wantMsg: []string{"pinDir"},
		},
		{
			name:     "unknown attachMode",
			conf:     func(e *testenv.Env, c map[string]any) { c["attachMode"] = "xdp" },
			wantCode: codeInvalidConfig, wantMsg: []string{"attachMode"},
		},
		{
			name:     "unsupported cniVersion",
			conf:     func(e *testenv.Env, c map[string]any) { c["cniVersion"] = "9.9.9" },
			wantCode: codeIncompatibleVersion,
		},
		{
			name:     "missing CNI_NETNS",
			envEdit:  func(envv map[string]string) { delete(envv, "CNI_NETNS") },
			wantCode: codeInvalidEnv, wantMsg: []string{"CNI_NETNS"},
		},
		{
			name:     "ifname too long",
			envEdit:  func(envv map[string]string) { envv["CNI_IFNAME"] = "eth0123456789abcdef" },
			wantCode: codeInvalidEnv, wantMsg: []string{"interface name"},
		},
		{
			name:     "nonexistent netns",
			envEdit:  func(envv map[string]string) { envv["CNI_NETNS"] = "/var/run/netns/" + testenv.RandName("absent-") },
			wantCode: codeInvalidEnv, wantMsg: []string{"CNI_NETNS"},
		},
	}

	setup := func(t *testing.T) (*testenv.Env, ns.NetNS, map[string]string, map[string]any) {
		e := testenv.New(t)
		pod := e.NewPod()
		envv := map[string]string{
			"CNI_COMMAND":     "ADD",
			"CNI_CONTAINERID": testenv.RandName("bad-"),
			"CNI_NETNS":       pod.Path(),
			"CNI_IFNAME":      "eth0",
			"CNI_PATH":        testenv.BinDir,
		}
		c := e.PluginConf()
		c["cniVersion"] = "1.1.0"
		c["name"] = e.Name
		return e, pod, envv, c
	}

	// Control: the unedited config and environment work, so each failure
	// below is caused by its one edit.
	t.Run("control", func(t *testing.T) {
		e, _, envv, c := setup(t)
		stdin, _ := json.Marshal(c)
		out, err := e.ExecPlugin(envv, stdin)
		if err != nil {
			t.Fatalf("ADD with the base config: %v\n%s", err, out)
		}
		envv["CNI_COMMAND"] = "DEL"
		if out, err := e.ExecPlugin(envv, stdin); err != nil {
			t.Fatalf("DEL with the base config: %v\n%s", err, out)
		}
		e.AssertClean()
	})

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, pod, envv, conf := setup(t)
			var stdin []byte
			if c.stdin != "" {
				stdin = []byte(c.stdin)
			} else {
				if c.conf != nil {
					c.conf(e, conf)
				}
				stdin, _ = json.Marshal(conf)
			}
			if c.envEdit != nil {
				c.envEdit(envv)
			}
			out, err := e.ExecPlugin(envv, stdin)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("plugin exit: %v, want a non-zero exit status; stdout: %s", err, out)
			}
			perr := testenv.PluginError(t, out)
			if perr.Code != c.wantCode {
				t.Errorf("error code %d (%q), want %d", perr.Code, perr.Msg, c.wantCode)
			}
			for _, s := range c.wantMsg {
				if !strings.Contains(perr.Msg+" "+perr.Details, s) {
					t.Errorf("error %q (details %q) does not mention %q", perr.Msg, perr.Details, s)
				}
			}
			e.AssertClean()
			pod.Do(func(ns.NetNS) error {
				if _, err := netlink.LinkByName("eth0"); err == nil {
					t.Error("the failed ADD left eth0 in the pod")
				}
				return nil
			})
			if _, err := os.Stat(e.PinDir); err == nil {
				t.Errorf("the failed ADD created the pin directory %s", e.PinDir)
			}
		})
	}
}

// --- 6. Failed ADD part way -------------------------------------------------

// TestLifecycleFailedAdd: an ADD that fails after IPAM reserved an address,
// or because IPAM is exhausted, leaves nothing of its own.
func TestLifecycleFailedAdd(t *testing.T) {
	t.Run("eth0 exists in pod", func(t *testing.T) {
		e := testenv.New(t)
		pod := e.NewPod()
		err := pod.Do(func(ns.NetNS) error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"})
		})
		if err != nil {
			t.Fatalf("create eth0 in the pod: %v", err)
		}
		_, err = e.AddV("1.1.0", pod, "fail-eth0", "eth0")
		wantErrContains(t, "ADD into a pod that has eth0", err, "eth0", "exists")
		e.AssertClean()
		if r := e.ReservationsOf("fail-eth0"); len(r) > 0 {
			t.Errorf("IPAM reservations left: %v", r)
		}
		// The pod's own interfaces are untouched.
		err = pod.Do(func(ns.NetNS) error {
			for _, n := range []string{"eth0", "peer0"} {
				l, err := netlink.LinkByName(n)
				if err != nil {
					return fmt.Errorf("the failed ADD removed the pod's own %s: %w", n, err)
				}
				addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
				if len(addrs) > 0 {
					return fmt.Errorf("the failed ADD left addresses on the pod's %s: %v", n, addrs)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// The runtime's DEL after a failed ADD succeeds and keeps the pod's links.
		if err := e.Del(pod, "fail-eth0", "eth0"); err != nil {
			t.Fatalf("DEL after the failed ADD: %v", err)
		}
		e.AssertClean()
		// Nothing stale blocks a retry once the conflict is gone.
		err = pod.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.LinkDel(l)
		})
		if err != nil {
			t.Fatal(err)
		}
		p := e.AddAttachment(pod, "fail-eth0")
		if err := testenv.Ping(pod, testenv.NodeIP4, 1); err != nil {
			t.Fatal(err)
		}
		if err := e.Del(pod, p.ID, "eth0"); err != nil {
			t.Fatal(err)
		}
		e.AssertClean()
	})

	t.Run("ipam exhausted", func(t *testing.T) {
		e := testenv.New(t)
		e.IPAM = map[string]any{
			"type":    "host-local",
			"dataDir": e.DataDir,
			"ranges": [][]map[string]string{{{
				"subnet": "10.250.0.0/30", "rangeStart": "10.250.0.2", "rangeEnd": "10.250.0.2",
			}}},
		}
		first := e.AddAttachment(e.NewPod(), "only-one")
		if len(first.IPs) != 1 || !first.IPs[0].Equal(net.ParseIP("10.250.0.2")) {
			t.Fatalf("first pod got %v, want [10.250.0.2]", first.IPs)
		}
		pod2 := e.NewPod()
		_, err := e.AddV("1.1.0", pod2, "no-room", "eth0")
		if err == nil {
			t.Fatal("second ADD into a one-address range succeeded")
		}
		t.Logf("second ADD: %v", err)
		second := &testenv.Attachment{Pod: pod2, ID: "no-room", IfName: "eth0", HostIf: state.HostIfName("no-room", "eth0")}
		e.AssertGone(second)
		// Exactly the first pod's state is left.
		eps, err := e.Maps().ListEndpoints()
		if err != nil || len(eps) != 1 || !eps[0].IP.Equal(first.IPs[0]) || int(eps[0].Info.Ifindex) != first.Ifindex {
			t.Errorf("endpoints map after the failed ADD: %+v (err %v), want only %s -> %d", eps, err, first.IPs[0], first.Ifindex)
		}
		var k uint32
		var v maps.LinkInfo
		it := e.Maps().Links.Iterate()
		for it.Next(&k, &v) {
			if int(k) != first.Ifindex {
				t.Errorf("links map has an entry for ifindex %d besides the first pod's %d", k, first.Ifindex)
			}
		}
		if pins := datapath.VethLinkPins(e.PinDir); len(pins) != 2 {
			t.Errorf("link pins after the failed ADD: %d, want the first pod's 2", len(pins))
		}
		if recs, _ := os.ReadDir(filepath.Join(e.StateDir, e.Name)); len(recs) != 1 {
			t.Errorf("state records after the failed ADD: %d, want the first pod's 1", len(recs))
		}
		if r := e.ReservationsOf(first.ID); len(r) != 1 {
			t.Errorf("first pod's reservation after the failed ADD: %v", r)
		}
		pod2.Do(func(ns.NetNS) error {
			if _, err := netlink.LinkByName("eth0"); err == nil {
				t.Error("the failed ADD left eth0 in its pod")
			}
			return nil
		})
		if err := testenv.Ping(first.Pod, testenv.NodeIP4, 1); err != nil {
			t.Fatalf("first pod after the failed ADD: %v", err)
		}
		if err := e.Del(pod2, "no-room", "eth0"); err != nil {
			t.Fatalf("DEL after the failed ADD: %v", err)
		}
		if err := e.Check(first.Pod, first.ID, "eth0"); err != nil {
			t.Fatalf("first pod after DEL of the failed one: %v", err)
		}
		if err := e.Del(first.Pod, first.ID, "eth0"); err != nil {
			t.Fatal(err)
		}
		e.AssertClean()
		// With the address free again, an ADD succeeds.
		again := e.AddAttachment(pod2, "no-room")
		if err := e.Del(pod2, again.ID, "eth0"); err != nil {
			t.Fatal(err)
		}
		e.AssertClean()
	})
}

// --- 7. STATUS --------------------------------------------------------------

// TestLifecycleStatus: STATUS succeeds on a usable node and is error 50 when
// the pin directory is not on bpffs; ADD then fails the same way, cleanly.
func TestLifecycleStatus(t *testing.T) {
	e := testenv.New(t)
	if err := e.Status(); err != nil {
		t.Fatalf("STATUS on a good config: %v", err)
	}

	bad := testenv.New(t)
	bad.PinDir = t.TempDir()
	err := bad.Status()
	if testenv.ErrCode(err) != codePluginNotAvailable {
		t.Fatalf("STATUS with pinDir %s off bpffs: %v (code %d), want code %d", bad.PinDir, err, testenv.ErrCode(err), codePluginNotAvailable)
	}
	wantErrContains(t, "STATUS off bpffs", err, bad.PinDir)

	_, err = bad.AddV("1.1.0", bad.NewPod(), "off-bpffs", "eth0")
	if testenv.ErrCode(err) != codePluginNotAvailable {
		t.Fatalf("ADD with pinDir off bpffs: %v (code %d), want code %d", err, testenv.ErrCode(err), codePluginNotAvailable)
	}
	bad.AssertClean()
	if ents, _ := os.ReadDir(bad.PinDir); len(ents) > 0 {
		t.Errorf("ADD off bpffs wrote into %s: %v", bad.PinDir, ents)
	}
}
