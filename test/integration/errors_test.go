// Errors: bad input, an ADD failing part way, the spec's error codes, STATUS;
// every failure leaves nothing behind.

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
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

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
		eps, err := e.Maps().Endpoints().List()
		if err != nil || len(eps) != 1 || !eps[0].IP.Equal(first.IPs[0]) || int(eps[0].Info.Ifindex) != first.Ifindex {
			t.Errorf("endpoints map after the failed ADD: %+v (err %v), want only %s -> %d", eps, err, first.IPs[0], first.Ifindex)
		}
		links, _ := e.Maps().Links().Ifindexes()
		for _, k := range links {
			if int(k) != first.Ifindex {
				t.Errorf("links map has an entry for ifindex %d besides the first pod's %d", k, first.Ifindex)
			}
		}
		// Without an agent ADD attaches cls_bpf filters (on the veth, gone
		// with it) and pins no link.
		if pins := datapath.VethLinkPins(e.PinDir); len(pins) != 0 {
			t.Errorf("link pins after the failed ADD: %v, want none", pins)
		}
		if st := e.AttachState(first.HostIf); st != datapath.StateTCPending {
			t.Errorf("the first pod's attachment after the failed ADD: %q, want %q", st, datapath.StateTCPending)
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

// failingIPAM writes IPAM plugins that fail without a CNI error: one killed
// by a signal, one exiting 1 with nothing on stdout. Returns their directory.
func failingIPAM(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "crashing-ipam"), []byte("#!/bin/sh\nkill -SEGV $$\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "silent-ipam"), []byte("#!/bin/sh\nexit 1\n"), 0o755))
	return dir
}

// TestIntegrityErrors: failures that used to come back as code 0 (which
// means success), as the wrong code, or only after work was done: each is
// the spec's code, names what is wrong, and leaves nothing.
func TestIntegrityErrors(t *testing.T) {
	t.Parallel()
	add := func(e *testenv.Env, id string) ([]byte, error) {
		return e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("ADD", id, e.NewPod(), "eth0"), e.StdinConf(nil))
	}
	bad := failingIPAM(t)
	cases := []struct {
		name    string
		conf    func(e *testenv.Env, c map[string]any)
		envEdit func(e *testenv.Env, envv map[string]string)
		code    uint
		msg     []string
		noPins  bool // refused before the datapath is touched
		ipamDel bool // the IPAM plugin refuses the DEL itself
	}{
		{name: "IPAM plugin killed by a signal",
			conf:    func(e *testenv.Env, c map[string]any) { c["ipam"] = map[string]any{"type": "crashing-ipam"} },
			envEdit: func(e *testenv.Env, envv map[string]string) { envv["CNI_PATH"] = bad + ":" + testenv.BinDir },
			code:    types.ErrInternal, msg: []string{"crashing-ipam"}, ipamDel: true},
		{name: "IPAM plugin exits with no error",
			conf:    func(e *testenv.Env, c map[string]any) { c["ipam"] = map[string]any{"type": "silent-ipam"} },
			envEdit: func(e *testenv.Env, envv map[string]string) { envv["CNI_PATH"] = bad + ":" + testenv.BinDir },
			code:    types.ErrInternal, msg: []string{"silent-ipam"}, ipamDel: true},
		{name: "CNI_NETNS is the node's netns",
			envEdit: func(e *testenv.Env, envv map[string]string) { envv["CNI_NETNS"] = e.Node.Path() },
			code:    codeInvalidEnv, msg: []string{"CNI_NETNS", "node's own"}, noPins: true, ipamDel: true},
		{name: "CNI_NETNS is a regular file",
			envEdit: func(e *testenv.Env, envv map[string]string) {
				f := filepath.Join(e.T.TempDir(), "not-a-netns")
				os.WriteFile(f, nil, 0o600)
				envv["CNI_NETNS"] = f
			},
			code: codeInvalidEnv, msg: []string{"CNI_NETNS"}, noPins: true},
		{name: "CNI_NETNS is another kind of namespace",
			envEdit: func(e *testenv.Env, envv map[string]string) { envv["CNI_NETNS"] = "/proc/self/ns/uts" },
			code:    codeInvalidEnv, msg: []string{"CNI_NETNS", "not a network namespace"}, noPins: true},
		{name: "mtu below IPv6's minimum with an IPv6 range",
			conf: func(e *testenv.Env, c map[string]any) { c["mtu"] = 1000 },
			code: codeInvalidConfig, msg: []string{"mtu 1000", "1280", "ipam.ranges[1][0].subnet"}, noPins: true},
		{name: "bandwidth rate as a JSON string",
			conf: func(e *testenv.Env, c map[string]any) {
				c["runtimeConfig"] = map[string]any{"bandwidth": map[string]any{"ingressRate": "1000000"}}
			},
			code: codeInvalidConfig, msg: []string{"runtimeConfig.bandwidth.ingressRate", "string"}, noPins: true},
		{name: "bandwidth rate as a non-numeric string",
			conf: func(e *testenv.Env, c map[string]any) {
				c["runtimeConfig"] = map[string]any{"bandwidth": map[string]any{"egressRate": "fast"}}
			},
			code: codeInvalidConfig, msg: []string{"runtimeConfig.bandwidth.egressRate"}, noPins: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := testenv.New(t)
			pod := e.NewPod()
			envv := pluginEnv("ADD", "errs", pod, "eth0")
			if c.envEdit != nil {
				c.envEdit(e, envv)
			}
			stdin := e.StdinConf(func(m map[string]any) {
				if c.conf != nil {
					c.conf(e, m)
				}
			})
			var nodeRoutes []netlink.Route
			e.InNode(func() error { nodeRoutes, _ = netlink.RouteList(nil, netlink.FAMILY_ALL); return nil })
			out, err := e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), envv, stdin)
			wantPluginError(t, "ADD", out, err, c.code, c.msg...)
			e.AssertClean()
			var after []netlink.Route
			e.InNode(func() error { after, _ = netlink.RouteList(nil, netlink.FAMILY_ALL); return nil })
			if fmt.Sprint(after) != fmt.Sprint(nodeRoutes) {
				t.Errorf("the failed ADD changed the node's routes:\n  before %v\n  after  %v", nodeRoutes, after)
			}
			if c.noPins {
				if _, err := os.Stat(e.PinDir); err == nil {
					t.Errorf("the refused ADD created the pin directory")
				}
			}
			// DEL of the failed attachment, with the same input, succeeds
			// (unless the IPAM plugin refuses its part: host-local will not
			// run with the node's netns, the broken ones fail as ever).
			envv["CNI_COMMAND"] = "DEL"
			if out, err := e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), envv, stdin); err != nil && !c.ipamDel {
				t.Errorf("DEL after the refused ADD: %v\n%s", err, out)
			}
			e.AssertClean()
		})
	}

	// A full map names itself and its size; code 11: it has room again
	// once pods go.
	t.Run("full endpoints map", func(t *testing.T) {
		e := testenv.New(t)
		first := e.AddAttachment(e.NewPod(), "first") // sets up the datapath
		e.MustDel(first.Pod, "first")
		m := e.Maps()
		n := int(mapstest.Map(m, "cni_endpoints").MaxEntries())
		keys := make([]maps.EndpointKey, n)
		vals := make([]maps.EndpointInfo, n)
		for i := range keys {
			k, _ := maps.KeyFor(net.IPv4(100, byte(i>>16), byte(i>>8), byte(i)))
			keys[i], vals[i] = k, maps.NewEndpointInfo(1<<30, nil, nil)
		}
		if _, err := mapstest.Map(m, "cni_endpoints").BatchUpdate(keys, vals, nil); err != nil {
			t.Fatalf("fill cni_endpoints: %v", err)
		}
		out, err := add(e, "no-room")
		wantPluginError(t, "ADD with cni_endpoints full", out, err, types.ErrTryAgainLater, "cni_endpoints", "full", fmt.Sprint(n))
		if _, err := mapstest.Map(m, "cni_endpoints").BatchDelete(keys, nil); err != nil {
			t.Fatalf("empty cni_endpoints: %v", err)
		}
		if out, err := e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("DEL", "no-room", nil, "eth0"), e.StdinConf(nil)); err != nil {
			t.Fatalf("DEL: %v\n%s", err, out)
		}
		e.AssertClean()
	})
}

// TestReviewGarbageConfig: configurations a runtime or a human may hand the
// plugin, each refused by ADD with the spec's code naming the field, leaving
// nothing.
func TestReviewGarbageConfig(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	bw := func(k string, v any) func(c map[string]any) {
		return func(c map[string]any) {
			c["runtimeConfig"] = map[string]any{"bandwidth": map[string]any{k: json.RawMessage(fmt.Sprint(v))}}
		}
	}
	for _, c := range []struct {
		name string
		edit func(c map[string]any)
		code uint
		subs []string
	}{
		{"negative rate", bw("ingressRate", -1), codeInvalidConfig, []string{"ingressRate", "negative"}},
		{"rate beyond 64 bits", bw("egressRate", "18446744073709551616"), codeInvalidConfig, []string{"egressRate", "64 bits"}},
		{"rate in exponent notation", bw("ingressRate", "1e6"), codeInvalidConfig, []string{"ingressRate", "whole number"}},
		{"rate below the minimum", bw("ingressRate", 999), codeInvalidConfig, []string{"ingressRate", "minimum"}},
		{"rate beyond 1 Tbit/s", bw("ingressRate", "1000000000001"), codeInvalidConfig, []string{"ingressRate", "maximum"}},
		{"burst without rate", bw("egressBurst", 1000), codeInvalidConfig, []string{"egressBurst", "egressRate"}},
		{"bandwidth not an object", func(c map[string]any) { c["runtimeConfig"] = map[string]any{"bandwidth": 5} }, codeDecoding, []string{"bandwidth"}},
		{"negative mtu", func(c map[string]any) { c["mtu"] = -1 }, codeInvalidConfig, []string{"mtu"}},
		{"mtu as a string", func(c map[string]any) { c["mtu"] = "1500" }, codeDecoding, []string{"mtu"}},
		{"missing name", func(c map[string]any) { delete(c, "name") }, codeInvalidConfig, []string{"name"}},
		{"name with a slash", func(c map[string]any) { c["name"] = "../x" }, codeInvalidConfig, []string{"name"}},
		{"ipam without type", func(c map[string]any) { c["ipam"] = map[string]any{"subnet": "10.250.0.0/24"} }, codeInvalidConfig, []string{"ipam"}},
		{"portMappings port 0", func(c map[string]any) {
			c["runtimeConfig"] = map[string]any{"portMappings": []map[string]any{{"hostPort": 0, "containerPort": 80, "protocol": "tcp"}}}
		}, codeInvalidConfig, []string{"portMappings[0]"}},
	} {
		stdin := e.StdinConf(c.edit)
		out, err := e.ExecPlugin(pluginEnv("ADD", "garbage", pod, "eth0"), stdin)
		wantPluginError(t, c.name, out, err, c.code, c.subs...)
		e.AssertNothingOf("garbage")
	}
}
