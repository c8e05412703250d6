package integration

import (
	"bytes"
	"context"
	"encoding/json"
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
		out = b.Bytes()
		if ctx.Err() != nil {
			t.Fatalf("%s: plugin hung past %v (killed)", envv["CNI_COMMAND"], n31VerbTimeout)
		}
		if strings.Contains(se.String(), "panic:") || strings.Contains(string(out), "panic") {
			t.Fatalf("%s: plugin panicked: %s%s", envv["CNI_COMMAND"], out, se.String())
		}
		return nil
	})
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
