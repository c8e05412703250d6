package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// n31Case is one set of CNI inputs as a runtime or a hostile config gives
// them: the network's name, the env (container ID, interface name,
// CNI_ARGS), the config's extra keys, IPAM and runtimeConfig. code 0: ADD
// works fully (CHECK passes, DEL leaves nothing); any other: ADD fails with
// that CNI code, a message holding every msg, and leaves nothing, and a DEL
// after it succeeds.
type n31Case struct {
	name    string
	network string // "" is the env's own
	id      string // "" is a random one
	ifname  string // "" is eth0
	args    string // CNI_ARGS
	extra   map[string]any
	ipam    map[string]any
	rc      map[string]any // runtimeConfig
	result  string         // an IPAM result a fake host-local (first in CNI_PATH) gives ADD
	code    uint
	msg     []string
}

// n31VerbTimeout bounds every verb: a plugin that hangs fails the case.
const n31VerbTimeout = 45 * time.Second

// n31Exec runs the built plugin in the node netns exactly as a runtime
// execs it (env and stdin JSON), killed after n31VerbTimeout.
func n31Exec(t *testing.T, e *testenv.Env, envv map[string]string, stdin []byte) ([]byte, error) {
	t.Helper()
	var out []byte
	var runErr error
	var hung bool
	var stderr string
	// InNode runs f on a goroutine of its own: the test fails after it.
	e.InNode(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), n31VerbTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(testenv.BinDir, "ebpf-cni"))
		for k, v := range envv {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stdin = bytes.NewReader(stdin)
		var b, se bytes.Buffer
		cmd.Stdout, cmd.Stderr = &b, &se
		runErr = cmd.Run()
		out, stderr, hung = b.Bytes(), se.String(), ctx.Err() != nil
		return nil
	})
	if hung {
		t.Fatalf("%s: plugin hung past %v (killed)", envv["CNI_COMMAND"], n31VerbTimeout)
	}
	if strings.Contains(stderr, "panic:") || strings.Contains(string(out), "panic") {
		t.Fatalf("%s: plugin panicked: %s%s", envv["CNI_COMMAND"], out, stderr)
	}
	return out, runErr
}

// n31Run runs one case: ADD, then CHECK and DEL or (ADD failed) DEL; after
// each path, nothing of the attachment is left.
func n31Run(t *testing.T, c n31Case) {
	t.Parallel()
	e := testenv.New(t)
	if c.network != "" {
		e.Name = c.network
	}
	e.Extra, e.IPAM = c.extra, c.ipam
	id, ifname := c.id, c.ifname
	if id == "" {
		id = testenv.RandName("n31")
	}
	if ifname == "" {
		ifname = "eth0"
	}
	pod := e.NewPod()
	envv := pluginEnv("ADD", id, pod, ifname)
	envv["CNI_ARGS"] = c.args
	if c.result != "" {
		dir := t.TempDir()
		script := "#!/bin/sh\ncat >/dev/null\n[ \"$CNI_COMMAND\" = ADD ] && printf '%s\\n' '" + c.result + "'\nexit 0\n"
		must(t, os.WriteFile(filepath.Join(dir, "host-local"), []byte(script), 0o755))
		envv["CNI_PATH"] = dir + ":" + testenv.BinDir
	}
	conf := func(prev json.RawMessage) []byte {
		return e.StdinConf(func(m map[string]any) {
			if c.rc != nil {
				m["runtimeConfig"] = c.rc
			}
			if prev != nil {
				m["prevResult"] = prev
			}
		})
	}
	verb := func(cmd string, prev json.RawMessage) ([]byte, error) {
		envv["CNI_COMMAND"] = cmd
		return n31Exec(t, e, envv, conf(prev))
	}
	t.Cleanup(func() {
		if out, err := verb("DEL", nil); err != nil {
			t.Errorf("DEL in cleanup: %v: %s", err, out)
		}
	})
	out, err := verb("ADD", nil)
	if c.code != 0 {
		wantPluginError(t, "ADD", out, err, c.code, c.msg...)
		e.AssertClean()
		if out, err := verb("DEL", nil); err != nil {
			t.Fatalf("DEL after the failed ADD: %v: %s", err, out)
		}
		e.AssertClean()
		return
	}
	if err != nil {
		t.Fatalf("ADD: %v: %s", err, out)
	}
	if out, err := verb("CHECK", out); err != nil {
		t.Errorf("CHECK: %v: %s", err, out)
	}
	if out, err := verb("DEL", nil); err != nil {
		t.Fatalf("DEL: %v: %s", err, out)
	}
	e.AssertClean()
}

// TestNames31Names (names31): the longest and oddest names the CNI library
// lets through (utils.ValidateNetworkName, ValidateContainerID and
// ValidateInterfaceName: a network name or container ID is
// [a-zA-Z0-9][a-zA-Z0-9_.-]* of any length, an interface name 1-15 bytes
// without "/", ":" or whitespace and not "." or "..").
//
//	go test -count=1 -run 'TestNames31Names$' -v ./test/integration/
func TestNames31Names(t *testing.T) {
	cases := []n31Case{
		// The alias ebpf-cni:<network>/<ID, at least "c...">/<ifname>
		// holds 240 bytes of network and interface name: up to there ADD
		// works, past it ADD refuses the name (it failed setting the
		// alias, 999 "numerical result out of range").
		{name: "net225-if15", network: strings.Repeat("n", 225), ifname: "abcdefghijklmno"},
		{name: "net236-eth0", network: strings.Repeat("n", 236), id: strings.Repeat("x", 5000)},
		{name: "net226-if15", network: strings.Repeat("n", 226), ifname: "abcdefghijklmno", code: types.ErrInvalidNetworkConfig, msg: []string{"name: a network name of 226 bytes", "abcdefghijklmno", "240"}},
		{name: "net255-if15", network: strings.Repeat("n", 255), ifname: "abcdefghijklmno", code: types.ErrInvalidNetworkConfig, msg: []string{"name: a network name of 255 bytes"}},
		{name: "net255-eth0", network: strings.Repeat("n", 255), code: types.ErrInvalidNetworkConfig, msg: []string{"name: a network name of 255 bytes"}},
		{name: "net-dots", network: "a..", ifname: "eth0"},
		{name: "net-odd", network: "0-._.-"},
		{name: "id1", id: "c"},
		{name: "id-long", id: "i" + strings.Repeat("d", 100000)},
		{name: "id-odd", id: "0_.-_.-" + testenv.RandHex(4)},
		{name: "if-dot-dash", ifname: "e.t-h_0@x"},
		{name: "if-symbols", ifname: "#!$&*+=?^~x"},
		{name: "if-utf8", ifname: "ëth0"},
		// A "%" makes the kernel pick the name (eth%d is eth0: ADD
		// worked, CHECK found no eth%d) or refuse it (999 "invalid
		// argument").
		{name: "if-percent-d", ifname: "eth%d", code: types.ErrInvalidEnvironmentVariables, msg: []string{"CNI_IFNAME", "eth%d"}},
		{name: "if-percent-x", ifname: "#!$&*+=?^~%x", code: types.ErrInvalidEnvironmentVariables, msg: []string{"CNI_IFNAME"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { n31Run(t, c) })
	}
}

// n31Caps is the config's capabilities, so runtimeConfig is what a runtime
// passes for them.
var n31Caps = map[string]any{"capabilities": map[string]bool{"portMappings": true, "bandwidth": true}}

// TestNames31Args (names31): CNI_ARGS and runtimeConfig with odd values.
// Red before: CNI_ARGS of no KEY=VALUE pairs failed ADD in host-local (999,
// after the veth was made), and DEL failed likewise on them and on an
// unknown key without IgnoreUnknown, so no retry ever deleted the
// attachment.
//
//	go test -count=1 -run 'TestNames31Args$' -v ./test/integration/
func TestNames31Args(t *testing.T) {
	pm := func(host, ctr int, proto string) map[string]any {
		return map[string]any{"hostPort": host, "containerPort": ctr, "protocol": proto}
	}
	pms := func(p ...map[string]any) map[string]any { return map[string]any{"portMappings": p} }
	bw := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return map[string]any{"bandwidth": m}
	}
	cases := []n31Case{
		{name: "k8s-name253", args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=" + strings.Repeat("s", 63) + ";K8S_POD_NAME=" + strings.Repeat("p", 253)},
		{name: "k8s-name-empty", args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=;K8S_POD_NAME="},
		{name: "k8s-name-huge", args: "IgnoreUnknown=1;K8S_POD_NAME=" + strings.Repeat("p", 60000)},
		// host-local refuses an unknown key (999, its own code) before
		// reserving; DEL failed on it too, every retry (names31).
		{name: "unknown-key", args: "FOO=bar", code: types.ErrInternal, msg: []string{"ARGS: unknown args", "FOO=bar"}},
		{name: "unknown-key-ignored", args: "IgnoreUnknown=1;FOO=bar;=x"},
		{name: "two-equals", args: "IgnoreUnknown=1;a=b=c", code: types.ErrInvalidEnvironmentVariables, msg: []string{"CNI_ARGS", "a=b=c"}},
		{name: "no-equals", args: "foo", code: types.ErrInvalidEnvironmentVariables, msg: []string{"CNI_ARGS", "\"foo\""}},
		{name: "empty-pairs", args: ";;IgnoreUnknown=1;;", code: types.ErrInvalidEnvironmentVariables, msg: []string{"CNI_ARGS", "\"\""}},
		{name: "pm-host0", extra: n31Caps, rc: pms(pm(0, 80, "tcp")), code: types.ErrInvalidNetworkConfig, msg: []string{"portMappings[0].hostPort: 0"}},
		{name: "pm-ctr0", extra: n31Caps, rc: pms(pm(18080, 0, "tcp")), code: types.ErrInvalidNetworkConfig, msg: []string{"portMappings[0].containerPort: 0"}},
		{name: "pm-host65536", extra: n31Caps, rc: pms(pm(65536, 80, "tcp")), code: types.ErrInvalidNetworkConfig, msg: []string{"portMappings[0].hostPort: 65536"}},
		{name: "pm-ctr65536", extra: n31Caps, rc: pms(pm(18081, 65536, "tcp")), code: types.ErrInvalidNetworkConfig, msg: []string{"portMappings[0].containerPort: 65536"}},
		{name: "pm-negative", extra: n31Caps, rc: pms(pm(-1, 80, "tcp")), code: types.ErrInvalidNetworkConfig, msg: []string{"portMappings[0].hostPort: -1"}},
		{name: "pm-dup", extra: n31Caps, rc: pms(pm(18082, 80, "tcp"), pm(18082, 80, "tcp"))},
		{name: "pm-dup-ctr", extra: n31Caps, rc: pms(pm(18083, 80, "tcp"), pm(18083, 81, "tcp")), code: types.ErrInvalidNetworkConfig, msg: []string{"portMappings[1].hostPort: 18083"}},
		{name: "pm-proto-odd", extra: n31Caps, rc: pms(pm(18084, 80, "icmp")), code: types.ErrInvalidNetworkConfig, msg: []string{"portMappings[0].protocol"}},
		{name: "bw-zero", extra: n31Caps, rc: bw("ingressRate", 0, "ingressBurst", 0, "egressRate", 0, "egressBurst", 0)},
		{name: "bw-2^63", extra: n31Caps, rc: bw("ingressRate", json.Number("9223372036854775808"), "ingressBurst", 1000000, "egressRate", json.Number("9223372036854775808"), "egressBurst", 1000000), code: types.ErrInvalidNetworkConfig, msg: []string{"bandwidth.ingressRate: 9223372036854775808"}},
		{name: "bw-2^63-1", extra: n31Caps, rc: bw("ingressRate", json.Number("9223372036854775807"), "ingressBurst", json.Number("9223372036854775807"), "egressRate", json.Number("9223372036854775807"), "egressBurst", json.Number("9223372036854775807")), code: types.ErrInvalidNetworkConfig, msg: []string{"bandwidth.ingressRate: 9223372036854775807"}},
		{name: "bw-negative", extra: n31Caps, rc: bw("ingressRate", -1, "ingressBurst", 1000), code: types.ErrInvalidNetworkConfig, msg: []string{"bandwidth.ingressRate: -1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { n31Run(t, c) })
	}
}

// n31V4Only is a host-local IPAM whose ranges are IPv4 only: ebpf-cni
// plans for IPv4 alone (v4Only).
func n31V4Only() map[string]any {
	return map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}}
}

// TestNames31IPAM (names31): IPAM results with no addresses, or with
// addresses of a family the config does not route (a host-local of IPv4
// ranges answering IPv6: a fake host-local first in CNI_PATH).
//
//	go test -count=1 -run 'TestNames31IPAM$' -v ./test/integration/
func TestNames31IPAM(t *testing.T) {
	static := func(addrs ...string) map[string]any {
		as := []map[string]string{}
		for _, a := range addrs {
			as = append(as, map[string]string{"address": a})
		}
		return map[string]any{"type": "static", "addresses": as}
	}
	res := func(ips ...string) string {
		var parts []string
		for _, ip := range ips {
			parts = append(parts, `{"address":"`+ip+`"}`)
		}
		return `{"cniVersion":"1.1.0","ips":[` + strings.Join(parts, ",") + `]}`
	}
	cases := []n31Case{
		// A result ebpf-cni cannot use is the IPAM plugin's fault: 999,
		// naming it, and the reservation released.
		{name: "static-none", ipam: static(), code: types.ErrInternal, msg: []string{`ipam plugin "static" returned no IP addresses`}},
		{name: "static-v6", ipam: static("fd00:250::10/64")},
		{name: "static-two-v4", ipam: static("10.250.0.10/24", "10.250.0.11/24")},
		{name: "v4only-gives-none", ipam: n31V4Only(), result: res(), code: types.ErrInternal, msg: []string{`ipam plugin "host-local" returned no IP addresses`}},
		{name: "v4only-gives-v6", ipam: n31V4Only(), result: res("fd00:250::20/64"), code: types.ErrInternal, msg: []string{"IPv6 address though its configuration has IPv4 subnets only"}},
		{name: "v4only-gives-both", ipam: n31V4Only(), result: res("10.250.0.20/24", "fd00:250::20/64"), code: types.ErrInternal, msg: []string{"IPv6 address though its configuration has IPv4 subnets only"}},
		{name: "gives-v4-slash0", ipam: n31V4Only(), result: res("10.250.0.21/0")},
		{name: "gives-bad-interface", ipam: n31V4Only(), result: `{"cniVersion":"1.1.0","interfaces":[{"name":"x"}],"ips":[{"address":"10.250.0.22/24","interface":7}]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { n31Run(t, c) })
	}
}

// TestNames31GC (names31): GC of attachments with the longest and oddest
// names, its cni.dev/valid-attachments holding them and entries no
// attachment can have (empty, a container ID of 100000 bytes, interface
// names the library refuses or with a "%"). The listed attachments are
// kept whole (CHECK passes), then a GC listing none removes them all.
//
//	go test -count=1 -run 'TestNames31GC$' -v ./test/integration/
func TestNames31GC(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.Name = strings.Repeat("g", 225)
	type att struct {
		id, ifname string
		res        json.RawMessage
	}
	pod := e.NewPod()
	atts := []*att{
		{id: strings.Repeat("x", 5000), ifname: "abcdefghijklmno"},
		{id: "c", ifname: "e.t-h_0@x"},
		{id: "0_.-" + testenv.RandHex(4), ifname: "#!$&*+=?^~x"},
	}
	exec1 := func(cmd string, a *att, conf []byte) ([]byte, error) {
		envv := pluginEnv(cmd, "", nil, "")
		if a != nil {
			envv = pluginEnv(cmd, a.id, pod, a.ifname)
		}
		return n31Exec(t, e, envv, conf)
	}
	stdin := func(edit func(m map[string]any)) []byte { return e.StdinConf(edit) }
	for _, a := range atts {
		a := a
		t.Cleanup(func() { exec1("DEL", a, stdin(nil)) })
		out, err := exec1("ADD", a, stdin(nil))
		if err != nil {
			t.Fatalf("ADD %d-byte ID, %q: %v: %s", len(a.id), a.ifname, err, out)
		}
		a.res = out
	}
	valid := []map[string]string{{}, {"containerID": strings.Repeat("y", 100000), "ifname": "eth0"},
		{"containerID": "c", "ifname": "eth%d"}, {"containerID": "c", "ifname": "a/b"}, {"containerID": "../..", "ifname": ".."}}
	for _, a := range atts {
		valid = append(valid, map[string]string{"containerID": a.id, "ifname": a.ifname})
	}
	gc := func(valid []map[string]string) {
		t.Helper()
		out, err := exec1("GC", nil, stdin(func(m map[string]any) { m["cni.dev/valid-attachments"] = valid }))
		if err != nil {
			t.Fatalf("GC with %d valid attachments: %v: %s", len(valid), err, out)
		}
	}
	gc(valid)
	for _, a := range atts {
		if out, err := exec1("CHECK", a, stdin(func(m map[string]any) { m["prevResult"] = a.res })); err != nil {
			t.Errorf("CHECK %d-byte ID, %q after a GC listing it: %v: %s", len(a.id), a.ifname, err, out)
		}
	}
	gc([]map[string]string{})
	e.AssertClean()
	for _, a := range atts {
		if out, err := exec1("DEL", a, stdin(nil)); err != nil {
			t.Errorf("DEL %d-byte ID, %q after GC: %v: %s", len(a.id), a.ifname, err, out)
		}
	}
	e.AssertClean()
}

// TestNames31DelArgsDiffer: ADD with CNI_ARGS host-local accepts
// ("IgnoreUnknown=1;FOO=bar"), then DEL with ones it refuses ("FOO=bar",
// no IgnoreUnknown): DEL succeeds and releases the ADD's lease (the IPAM
// DEL asked again without CNI_ARGS), leaving nothing.
//
// Red before: names31's first fix took the refusal for "nothing
// reserved", so the DEL succeeded and the lease stayed.
func TestNames31DelArgsDiffer(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	id := testenv.RandName("n31args")
	t.Cleanup(func() { _ = e.Del(pod, id, "eth0") })
	run := func(cmd, args string) ([]byte, error) {
		envv := pluginEnv(cmd, id, pod, "eth0")
		envv["CNI_ARGS"] = args
		return e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), envv, e.StdinConf(nil))
	}
	if out, err := run("ADD", "IgnoreUnknown=1;FOO=bar"); err != nil {
		t.Fatalf("ADD: %v: %s", err, out)
	}
	if len(e.ReservationsOf(id)) == 0 {
		t.Fatalf("ADD reserved nothing for %s", id)
	}
	if out, err := run("DEL", "FOO=bar"); err != nil {
		t.Fatalf("DEL with CNI_ARGS host-local refuses: %v: %s", err, out)
	}
	if res := e.ReservationsOf(id); len(res) > 0 {
		t.Errorf("after DEL: host-local still holds %v for %s", res, id)
	}
	if _, err := os.Stat(e.RecordPath(id, "eth0")); err == nil {
		t.Errorf("after DEL: the record of %s is left", id)
	}
	e.AssertClean()
}
