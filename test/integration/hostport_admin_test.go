// hostPort administration: bad input, single-stack pods, CHECK and GC, the
// dumps, the agent owning the node hooks.

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestHostPortBadInput: malformed entries are error 7 naming the entry and
// field, and nothing is kept; DEL accepts anything.
func TestHostPortBadInput(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		pms  []testenv.PM
		want []string
	}{
		{"hostPort 0", []testenv.PM{{HostPort: 0, ContainerPort: 80, Protocol: "tcp"}}, []string{"runtimeConfig.portMappings[0].hostPort", "0 is out of range"}},
		{"hostPort too big", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 70000, ContainerPort: 80, Protocol: "tcp"}},
			[]string{"runtimeConfig.portMappings[1].hostPort", "70000 is out of range"}},
		{"containerPort negative", []testenv.PM{{HostPort: 80, ContainerPort: -1, Protocol: "udp"}}, []string{"runtimeConfig.portMappings[0].containerPort", "-1"}},
		{"unknown protocol", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "icmp"}}, []string{"runtimeConfig.portMappings[0].protocol", "icmp"}},
		{"sctp", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "SCTP"}}, []string{"runtimeConfig.portMappings[0].protocol", "sctp", "not supported"}},
		{"bad hostIP", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "tcp", HostIP: "300.1.1.1"}}, []string{"runtimeConfig.portMappings[0].hostIP", "300.1.1.1"}},
		{"multicast hostIP", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "tcp", HostIP: "224.0.0.1"}}, []string{"runtimeConfig.portMappings[0].hostIP"}},
		{"same hostPort twice", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 80, ContainerPort: 81, Protocol: "tcp"}},
			[]string{"runtimeConfig.portMappings[1].hostPort", "portMappings[0]"}},
	}
	e := newHPEnv(t)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.T = t
			p := e.NewPod()
			id := fmt.Sprintf("bad-%d", i)
			e.CleanupDel(p, id)
			_, err := e.AddHP(p, id, c.pms...)
			if code := testenv.ErrCode(err); code != codeInvalidConfig {
				t.Fatalf("ADD: code %d (%v), want %d", code, err, codeInvalidConfig)
			}
			wantErrContains(t, "ADD", err, c.want...)
			e.AssertClean()
			e.AssertNoHostPorts()
			// DEL with the same bad entries still succeeds.
			err = e.InNode(func() error {
				return e.CNI.DelNetworkList(context.Background(), e.ConfList("1.0.0"), e.RuntimeConfHP(p, id, c.pms))
			})
			if err != nil {
				t.Errorf("DEL with bad portMappings: %v", err)
			}
		})
	}
}

// TestHostPortSingleStack: a wildcard mapping of an IPv4-only pod exists for
// IPv4 only; a hostIP of a family the pod lacks is error 7 found after IPAM,
// and the failed ADD undoes everything, the IPAM reservation included.
func TestHostPortSingleStack(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}}
	p := e.NewPod()
	e.MustAddHP(p, "v4", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	serve(t, p, 80, "v4")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "v4")
	expectNoServer(t, e.remote, "tcp", hp(uplinkIP6, 8080))
	hps, _ := e.Maps().HostPorts().List()
	if len(hps) != 1 || hps[0].IPv6 {
		t.Errorf("mappings of an IPv4-only pod: %+v, want one IPv4 entry", hps)
	}

	q := e.NewPod()
	e.CleanupDel(q, "v6-hostip")
	_, err := e.AddHP(q, "v6-hostip", testenv.PM{HostPort: 8081, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP6.String()})
	if code := testenv.ErrCode(err); code != codeInvalidConfig {
		t.Fatalf("IPv6 hostIP for an IPv4-only pod: code %d (%v), want %d", code, err, codeInvalidConfig)
	}
	wantErrContains(t, "IPv6 hostIP for an IPv4-only pod", err, "runtimeConfig.portMappings[0].hostIP", "no IPv6 address")
	e.AssertGone(&testenv.Attachment{Pod: q, ID: "v6-hostip", IfName: "eth0", HostIf: state.HostIfName("v6-hostip", "eth0")})

	e.MustDel(p, "v4")
	e.AssertClean()
	e.AssertNoHostPorts()
}

// TestHostPortCheckAndGC: CHECK verifies the mappings and the node hooks
// and names what is missing; GC removes the mappings and flows of a pod
// whose veth is gone without a DEL, even with its state record lost.
func TestHostPortCheckAndGC(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	p := e.NewPod()
	pms := []testenv.PM{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 8080, ContainerPort: 80, Protocol: "udp", HostIP: uplinkIP4.String()}}
	e.MustAddHP(p, "web", pms...)
	if err := e.CheckHP(p, "web", pms...); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	m := e.Maps()
	if err := e.CheckHP(p, "web", testenv.PM{HostPort: 8080, ContainerPort: 99, Protocol: "tcp"}); err == nil {
		t.Errorf("CHECK with another containerPort passed")
	}
	// Remove the IPv6 wildcard entry by hand.
	hps, _ := m.HostPorts().List()
	for _, h := range hps {
		if h.IPv6 {
			h2 := h
			if err := m.HostPorts().Delete(h2); err != nil {
				t.Fatal(err)
			}
		}
	}
	err := e.CheckHP(p, "web", pms...)
	wantErrContains(t, "CHECK with a mapping removed", err, "cni_hostports", "[*]:8080/tcp")

	// A second pod whose netns disappears without DEL, record lost too.
	q := e.NewPod()
	e.MustAddHP(q, "gone", testenv.PM{HostPort: 9000, ContainerPort: 80, Protocol: "udp"})
	// No server (its sockets would keep the netns alive): a datagram is
	// enough for a flow entry.
	askUDP(e.remote, hp(uplinkIP4, 9000))
	hostIf, goneIdx := e.HostVeth("gone")
	if len(ctOf(t, m, goneIdx)) == 0 {
		t.Fatalf("no flow entry for the datagram to %s", hp(uplinkIP4, 9000))
	}
	destroyPod(t, q)
	e.WaitLinkGone(hostIf)
	if err := removeFile(e.RecordPath("gone", "eth0")); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(types.GCAttachment{ContainerID: "web", IfName: "eth0"}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	hps, _ = m.HostPorts().List()
	for _, h := range hps {
		if h.HostPort == 9000 {
			t.Errorf("GC left the mapping %s of a pod whose veth is gone", h.Listen())
		}
	}
	flows, _ := m.HostPorts().ListCT()
	for _, f := range flows {
		if f.Dialled.Port() == 9000 {
			t.Errorf("GC left the flow %+v of a pod whose veth is gone", f)
		}
	}
	// The live pod's remaining mapping is still there.
	if err := e.CheckHP(p, "web", pms[1]); err != nil {
		t.Errorf("CHECK of the live pod after GC: %v", err)
	}
	e.MustDel(p, "web")
	e.AssertNoHostPorts()
}

// TestHostPortAgentDump: `ebpf-agent dump hostports` and `dump ct` show the
// mappings and flows, as an aligned table and as JSON.
func TestHostPortAgentDump(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	p := e.NewPod()
	e.CleanupDel(p, "web")
	rt := e.RuntimeConfHP(p, "web", []testenv.PM{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 5353, ContainerPort: 53, Protocol: "udp", HostIP: uplinkIP4.String()}})
	rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", "web-0"}}
	var res types.Result
	err := e.InNode(func() error {
		var err error
		res, err = e.CNI.AddNetworkList(context.Background(), e.ConfList("1.0.0"), rt)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := current.NewResultFromResult(res)
	p4, _ := testenv.PodIPs(t, r)
	serve(t, p, 80, "web")
	serve(t, p, 53, "web")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "web")
	expectServer(t, e.remote, "udp", hp(uplinkIP4, 5353), "web")
	expectServer(t, e.Node, "tcp", "127.0.0.1:8080", "web")

	dump := func(what string, args ...string) []byte {
		t.Helper()
		var out []byte
		err := e.InNode(func() error {
			cmd := exec.Command(testenv.BinDir+"/ebpf-agent", append([]string{"dump", what, "--pin-dir", e.PinDir, "--state-dir", e.StateDir}, args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			var err error
			if out, err = cmd.Output(); err != nil {
				return fmt.Errorf("ebpf-agent dump %s %v: %v\n%s", what, args, err, stderr.Bytes())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	var rows []inspect.HostPortRow
	js := dump("hostports", "-o", "json")
	if err := json.Unmarshal(js, &rows); err != nil {
		t.Fatalf("decode: %v\n%s", err, js)
	}
	if len(rows) != 3 { // tcp *:8080 v4+v6, udp hostIP:5353
		t.Errorf("%d hostport rows, want 3:\n%s", len(rows), js)
	}
	hostIf, idx := e.HostVeth("web")
	for _, row := range rows {
		if row.Pod != "default/web-0" || row.Interface != hostIf || row.Ifindex != idx {
			t.Errorf("row %+v: want pod default/web-0 on %s (%d)", row, hostIf, idx)
		}
		if row.HostPort == 5353 && (row.HostIP != uplinkIP4.String() || row.Protocol != "udp" || row.PodIP != p4.String() || row.ContainerPort != 53) {
			t.Errorf("row %+v: want %s:5353/udp -> %s:53", row, uplinkIP4, p4)
		}
	}
	table := string(dump("hostports"))
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "HOST IP") || !strings.Contains(table, "default/web-0") {
		t.Errorf("hostports table:\n%s", table)
	}

	var ct inspect.CTDump
	js = dump("ct", "-o", "json")
	if err := json.Unmarshal(js, &ct); err != nil {
		t.Fatalf("decode: %v\n%s", err, js)
	}
	var nat, sock int
	for _, f := range ct.Flows {
		switch f.Kind {
		case "nat":
			nat++
			if !strings.HasPrefix(f.Client, remoteIP4.String()+":") || f.Interface != hostIf {
				t.Errorf("nat flow %+v: want a client at %s and interface %s", f, remoteIP4, hostIf)
			}
		case "socket":
			sock++
			if f.Dialled != "127.0.0.1:8080" || f.Pod != hp(p4, 80) {
				t.Errorf("socket entry %+v: want 127.0.0.1:8080 -> %s", f, hp(p4, 80))
			}
		}
	}
	if nat < 2 || sock < 1 {
		t.Errorf("ct dump has %d nat flows and %d sockets, want >= 2 and >= 1:\n%s", nat, sock, js)
	}
	if ct.Counters["dnat_uplink"] == 0 || ct.Counters["sock_rewrite"] == 0 {
		t.Errorf("counters %v", ct.Counters)
	}
	table = string(dump("ct"))
	if !strings.HasPrefix(table, "KIND") || !strings.Contains(table, hp(uplinkIP4, 5353)) || !strings.Contains(table, "counters:") {
		t.Errorf("ct table:\n%s", table)
	}
	e.MustDel(p, "web")
	e.AssertNoHostPorts()
}

// TestHostPortAgent: `ebpf-agent run` sets up the node-level hooks before any
// ADD (the plugin then finds them in place), and follows the node's
// addresses: one added later is a hostPort address within moments.
func TestHostPortAgent(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	var (
		cmd  *exec.Cmd
		logs bytes.Buffer
		mu   sync.Mutex
	)
	err := e.InNode(func() error {
		cmd = exec.Command(testenv.BinDir+"/ebpf-agent", "run", "--pin-dir", e.PinDir)
		w := &lockedWriter{mu: &mu, w: &logs}
		cmd.Stdout, cmd.Stderr = w, w
		return cmd.Start()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(unix.SIGTERM)
		cmd.Wait()
	})
	agentLog := func() string { mu.Lock(); defer mu.Unlock(); return logs.String() }
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		// 60 s: the compat build (make test-fallback) costs the verifier
		// seconds at the agent's first load of a node.
		deadline := time.Now().Add(60 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60s; agent log:\n%s", what, agentLog())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("agent sets up the hostPort hooks", func() bool { return strings.Contains(agentLog(), "node hooks (start): cgroup") })
	// status shows the node hooks the agent pinned: socket hooks on the
	// cgroup root, the uplink programs on uplink0.
	out, err := e.AgentCmd("status", "-o", "json", "--pin-dir", e.PinDir)
	var st inspect.StatusReport
	if jerr := json.Unmarshal([]byte(out), &st); jerr != nil {
		t.Fatalf("status: %v, %v\n%s", err, jerr, out)
	}
	hooks := []string{"cgroup_connect4", "cgroup_getpeername6", "uplink_uplink0", "uplink-egress_uplink0"}
	if forced(datapath.FeatTCX) {
		hooks = hooks[:2]
		for _, n := range []string{"uplink0 ingress (cls_bpf)", "uplink0 egress (cls_bpf)"} {
			if !slices.Contains(st.Attachments.UplinkFilters, n) {
				t.Errorf("status does not show the uplink filter %s: %v", n, st.Attachments.UplinkFilters)
			}
		}
	}
	for _, n := range hooks {
		if !slices.Contains(st.Attachments.NodeHooks, n) {
			t.Errorf("status does not show the node hook %s the agent pinned: %v", n, st.Attachments.NodeHooks)
		}
	}

	p := e.NewPod()
	e.MustAddHP(p, "web", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	serve(t, p, 80, "web")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "web")
	expectServer(t, e.Node, "tcp", "127.0.0.1:8080", "web")

	extra := net.ParseIP("198.51.100.9").To4()
	err = e.InNode(func() error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr(extra.String() + "/24")
		return netlink.AddrAdd(l, a)
	})
	if err != nil {
		t.Fatal(err)
	}
	m := e.Maps()
	waitFor("agent adds the new address to cni_node_ips", func() bool {
		ips, _ := m.Node().IPs()
		_, ok := ips[extra.String()]
		return ok
	})
	expectServer(t, e.remote, "tcp", hp(extra, 8080), "web")
	e.MustDel(p, "web")
	e.AssertNoHostPorts()
}
