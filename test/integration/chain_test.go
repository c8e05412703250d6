// Chains users already have: ebpf-cni followed by the reference meta
// plugins (bandwidth, portmap, tuning, firewall), as containerd's and
// Calico's default templates chain them. Each either works, with traffic,
// or is refused at ADD (7) naming the plugin and what to use instead,
// leaving nothing behind; with and without the agent running.

package integration

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// chainList writes the env's network as a conflist of ebpf-cni (with
// caps) followed by more, in a conf dir of its own the plugin is told of
// (cniConfDir), as a runtime reads it from /etc/cni/net.d.
func chainList(t *testing.T, e *testenv.Env, caps map[string]bool, more ...map[string]any) (*libcni.NetworkConfigList, string) {
	t.Helper()
	dir := t.TempDir()
	ours := e.PluginConf()
	ours["cniConfDir"] = dir
	if caps != nil {
		ours["capabilities"] = caps
	} else {
		delete(ours, "capabilities")
	}
	plugins := []any{ours}
	for _, m := range more {
		plugins = append(plugins, m)
	}
	b, err := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": e.Name, "plugins": plugins})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "10-"+e.Name+".conflist"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return l, dir
}

// Calico's default template (cni_network_config of its calico.yaml
// manifest: calico, portmap with snat, bandwidth) after its main plugin, and
// containerd's (script/setup/install-cni: bridge then portmap).
var (
	calicoTail = []map[string]any{
		{"type": "portmap", "snat": true, "capabilities": map[string]bool{"portMappings": true}},
		{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}},
	}
	containerdTail = []map[string]any{
		{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
	}
)

// TestChainRefused: a chained plugin that cannot work with ebpf-cni makes ADD
// fail with 7 naming it, its place in the conflist and the capability to use
// instead, before anything is made; with the agent running too.
func TestChainRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		caps map[string]bool
		tail []map[string]any
		want []string
	}{
		{"calico template", nil, calicoTail, []string{`plugin "bandwidth"`, "plugins[2]", `"bandwidth" capability on ebpf-cni`}},
		{"bandwidth", map[string]bool{"portMappings": true}, []map[string]any{{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}}}, []string{`plugin "bandwidth"`, `"bandwidth" capability`}},
		{"portmap beside portMappings", map[string]bool{"portMappings": true}, containerdTail, []string{`plugin "portmap"`, `"portMappings" capability`}},
		{"tuning mtu", nil, []map[string]any{{"type": "tuning", "mtu": 1400}}, []string{`plugin "tuning"`, `ebpf-cni's "mtu"`}},
		{"firewall same-bridge", nil, []map[string]any{{"type": "firewall", "ingressPolicy": "same-bridge"}}, []string{`plugin "firewall"`, `same-bridge`}},
	}
	for _, agent := range []bool{false, true} {
		for _, c := range cases {
			name := c.name
			if agent {
				name += " with agent"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := testenv.New(t)
				l, dir := chainList(t, e, c.caps, c.tail...)
				if agent {
					e.StartAgent(dir)
				}
				p := e.NewPod()
				rt := e.RuntimeConfHP(p, "c1", []testenv.PM{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}})
				rt.CapabilityArgs["bandwidth"] = map[string]any{"ingressRate": 1000000, "ingressBurst": 100000}
				_, err := e.AddList(l, rt)
				libcniErr(t, "ADD of "+c.name, err, 7, c.want...)
				if err != nil && !strings.Contains(err.Error(), "instead") && !strings.Contains(err.Error(), "remove") {
					t.Errorf("the error says nothing of what to do: %v", err)
				}
				e.AssertClean()
				// The runtime's DEL after a failed ADD finds nothing and succeeds.
				if err := e.DelList(l, rt); err != nil {
					t.Errorf("DEL after the refused ADD: %v", err)
				}
				e.AssertClean()
			})
		}
	}
}

// TestChainWorks: the chains that work carry traffic: containerd's template
// (portmap's hostPorts from a remote host, the node and 127.0.0.1), tuning
// (a sysctl and a MAC), firewall's default policy; CHECK and DEL of the
// whole chain pass and leave nothing; with and without the agent.
func TestChainWorks(t *testing.T) {
	t.Parallel()
	for _, agent := range []bool{false, true} {
		name := "no agent"
		if agent {
			name = "agent"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHPEnv(t)
			tail := append(append([]map[string]any{}, containerdTail...),
				map[string]any{"type": "tuning", "mac": "0a:58:0a:fa:00:99", "sysctl": map[string]string{"net.ipv4.conf.eth0.arp_ignore": "1"}},
				map[string]any{"type": "firewall", "backend": "iptables"},
			)
			l, dir := chainList(t, h.Env, nil, tail...)
			if agent {
				h.StartAgent(dir)
			}
			p := h.NewPod()
			rt := h.RuntimeConfHP(p, "web", []testenv.PM{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 8080, ContainerPort: 80, Protocol: "udp"}})
			t.Cleanup(func() { _ = h.DelList(l, rt) })
			r, err := h.AddList(l, rt)
			if err != nil {
				t.Fatalf("ADD of ebpf-cni + portmap + tuning + firewall: %v", err)
			}
			q := h.NewPod()
			rq := h.RuntimeConfHP(q, "client", nil)
			t.Cleanup(func() { _ = h.DelList(l, rq) })
			if _, err := h.AddList(l, rq); err != nil {
				t.Fatalf("ADD of a second pod: %v", err)
			}
			serve(t, p, 80, "web")
			v4, v6 := resultIPs(r)

			if mac := podMACOf(t, p, "eth0"); mac.String() != "0a:58:0a:fa:00:99" {
				t.Errorf("tuning's mac: pod has %s", mac)
			}
			var sysctl []byte
			_ = p.Do(func(ns.NetNS) error {
				sysctl, err = os.ReadFile("/proc/sys/net/ipv4/conf/eth0/arp_ignore")
				return err
			})
			if strings.TrimSpace(string(sysctl)) != "1" {
				t.Errorf("tuning's sysctl: arp_ignore is %q", sysctl)
			}
			// Pod to pod (after the MAC change), node to pod, remote to pod.
			for _, ip := range []net.IP{v4, v6} {
				if err := testenv.Ping(q, ip, 2); err != nil {
					t.Errorf("pod to pod %s: %v", ip, err)
				}
				if err := testenv.Ping(h.Node, ip, 2); err != nil {
					t.Errorf("node to pod %s: %v", ip, err)
				}
			}
			// portmap's hostPorts: remote, node, localhost (IPv4: portmap maps
			// 127.0.0.1 only, through route_localnet).
			for _, proto := range []string{"tcp", "udp"} {
				for _, ip := range []net.IP{uplinkIP4, uplinkIP6} {
					expectServer(t, h.remote, proto, hp(ip, 8080), "web")
				}
				for _, ip := range []net.IP{uplinkIP4, uplinkIP6, testenv.NodeIP4, net.ParseIP("127.0.0.1")} {
					expectServer(t, h.Node, proto, hp(ip, 8080), "web")
				}
			}
			if err := h.CheckList(l, rt); err != nil {
				t.Errorf("CHECK of the chain: %v", err)
			}
			for _, rc := range []*libcni.RuntimeConf{rt, rq} {
				if err := h.DelList(l, rc); err != nil {
					t.Fatalf("DEL of the chain: %v", err)
				}
			}
			h.AssertClean()
			if rs := rulesets(t, h.Node); strings.Contains(rs, "web") {
				t.Errorf("portmap or firewall left rules of the pod:\n%s", rs)
			}
		})
	}
}
