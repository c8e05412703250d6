// A pod's traffic to another node's address under a source-checking
// underlay (docs/tunnel.md, "Pods to other nodes' addresses"): it keeps the
// pod's address, so it goes through the tunnel, as pod to pod does.

package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// tunNodeTable is `ip route show table 199` (and -6) of a node, once it
// lists want routes (within the agent's 2 s tick: the cluster CIDRs that
// decide them come with the first ADD).
func tunNodeTable(t *testing.T, e *testenv.Env, want int) string {
	t.Helper()
	var out string
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		must(t, e.InNode(func() error {
			tbl := fmt.Sprint(agent.TunnelNodeTable)
			b, _ := exec.Command("ip", "-d", "route", "show", "table", tbl).CombinedOutput()
			b6, _ := exec.Command("ip", "-6", "-d", "route", "show", "table", tbl).CombinedOutput()
			out = string(b) + string(b6)
			return nil
		}))
		if strings.Count(out, "\n") == want {
			break
		}
	}
	if n := strings.Count(out, "\n"); n != want {
		t.Errorf("table %d: %d routes, want %d:\n%s", agent.TunnelNodeTable, n, want, out)
	}
	return out
}

// TestTunnelPodToNodeSourceChecked: the router checks sources (IPv4
// rp_filter=1, IPv6 rpfilter in ip6tables) and knows no pod CIDR. A pod of
// node 1 reaches, keeping its address (node addresses are cluster CIDRs,
// as the agent following Nodes makes them), node 3's hostNetwork server at
// its IPv4 and IPv6 address, node 3's hostPort at both (the IPv6 reply
// into the tunnel by tun_redirect), and a ClusterIP whose
// endpoint is node 3's address (the API server's case; kube-proxy's DNAT
// on node 1), TCP and UDP; node 3's uplink drops none of it as a forged
// pod source. Before the pods' packets to node addresses were routed into
// the tunnel (table 199), all of them crossed the router with pod 1's
// source and timed out.
func TestTunnelPodToNodeSourceChecked(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	must(t, lab.router.Do(func(ns.NetNS) error {
		if err := tunSysctl("net.ipv4.conf.all.rp_filter", "1"); err != nil {
			return err
		}
		if out, err := exec.Command("ip6tables", "-t", "raw", "-A", "PREROUTING", "-m", "rpfilter", "--invert", "-j", "DROP").CombinedOutput(); err != nil {
			return fmt.Errorf("ip6tables rpfilter: %v: %s", err, out)
		}
		return nil
	}))
	lab.nodesInCluster(true)
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("pn1")
	a1, a16 := testenv.PodIPs(t, r1)
	// Nodes 2 and 3, two addresses each.
	table := tunNodeTable(t, n1, 4)
	for _, a := range []net.IP{tunNode[2], tunNode6[2]} {
		found := false
		for _, l := range strings.Split(table, "\n") {
			f := strings.Fields(l)
			found = found || len(f) > 1 && f[1] == a.String() && strings.Contains(l, " dst "+tunNode[2].String()+" ")
		}
		if !found {
			t.Errorf("node 1's table %d lacks %s into the tunnel to node 3:\n%s", agent.TunnelNodeTable, a, table)
		}
	}
	hp3 := n3.NewPod()
	n3.MustAddHP(hp3, "hpn3", testenv.PM{HostPort: 11303, ContainerPort: 8080, Protocol: "tcp"},
		testenv.PM{HostPort: 11303, ContainerPort: 8080, Protocol: "udp"})
	serve(t, hp3, 8080, "hpn3")
	serve(t, n3.Node, 8081, "node3")
	cip := net.ParseIP("10.96.25.10").To4()
	proxyModes[0].install(t, n1.Node, 4, tunCluster, []net.IP{tunNode[0]}, []svcPort{
		{name: "tonode-tcp", proto: "tcp", clusterIP: cip, port: 443, backend: tunNode[2], target: 8081},
		{name: "tonode-udp", proto: "udp", clusterIP: cip, port: 443, backend: tunNode[2], target: 8081},
	})
	_, _, tx0 := tunDevice(t, n1)

	for _, proto := range []string{"tcp", "udp"} {
		mustAsk(t, p1, proto, hp(tunNode[2], 8081), 0, "node3", a1)
		mustAsk(t, p1, proto, hp(tunNode6[2], 8081), 0, "node3", a16)
		mustAsk(t, p1, proto, hp(tunNode[2], 11303), 0, "hpn3", a1)
		mustAsk(t, p1, proto, hp(tunNode6[2], 11303), 0, "hpn3", a16)
		mustAsk(t, p1, proto, hp(cip, 443), 0, "node3", a1)
	}
	if _, _, tx := tunDevice(t, n1); tx-tx0 < 10 {
		t.Errorf("node 1's ebpf-tun sent %d packets, want the 10 exchanges' requests", tx-tx0)
	}
	if c := counter(t, n3.Maps(), uplinkIndex(t, n3), maps.DirIngress, maps.ReasonDropTunSrc); c.Packets != 0 {
		t.Errorf("node 3's uplink dropped %d packets as drop_tunnel_source", c.Packets)
	}
}

// tunNodeRules is node e's `ip rule` lines (both families) that consult
// table 199.
func tunNodeRules(t *testing.T, e *testenv.Env) []string {
	t.Helper()
	var out []string
	must(t, e.InNode(func() error {
		for _, fam := range []string{"-4", "-6"} {
			b, _ := exec.Command("ip", fam, "rule", "show").CombinedOutput()
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, fmt.Sprintf("lookup %d", agent.TunnelNodeTable)) {
					out = append(out, strings.TrimSpace(l))
				}
			}
		}
		return nil
	}))
	return out
}

// TestTunnelPodToNodeLifecycle: hybrid mode. Node 1's table 199 holds node
// 3's address (tunnelled) and not node 2's (direct: its pods and its
// address are reached in the clear), and its rules name node 1's two pod
// CIDRs; pod 1 reaches both nodes' hostNetwork servers with its own
// address. Node 3 leaves the peer list: its route goes, and its pod CIDR
// leaves cni_tun_cidrs; back, both return. `ebpf-agent uninstall` (agent
// stopped) leaves no rule and no route of table 199.
func TestTunnelPodToNodeLifecycle(t *testing.T) {
	lab := newTunLab(t)
	n1, n2, n3 := lab.nodes[0], lab.nodes[1], lab.nodes[2]
	lab.nodesInCluster(false)
	agents := startTunAgents(t, lab, "--tunnel-hybrid", "--reconcile-interval", "1s")
	p1, r1 := n1.RunPod("lc1")
	a1, _ := testenv.PodIPs(t, r1)
	table := tunNodeTable(t, n1, 1)
	if !strings.Contains(table, tunNode[2].String()+" ") || strings.Contains(table, tunNode[1].String()+" ") {
		t.Errorf("node 1's table %d: want node 3's address only (node 2 is direct):\n%s", agent.TunnelNodeTable, table)
	}
	p4, p6 := tunPods(0)
	rules := strings.Join(tunNodeRules(t, n1), "\n")
	for _, c := range []string{p4, p6} {
		if !strings.Contains(rules, "from "+c+" lookup") {
			t.Errorf("node 1 has no rule from %s to table %d:\n%s", c, agent.TunnelNodeTable, rules)
		}
	}
	serve(t, n2.Node, 8082, "node2")
	serve(t, n3.Node, 8082, "node3")
	for _, proto := range []string{"tcp", "udp"} {
		mustAsk(t, p1, proto, hp(tunNode[1], 8082), 0, "node2", a1)
		mustAsk(t, p1, proto, hp(tunNode[2], 8082), 0, "node3", a1)
	}

	hasCIDR3 := func() bool {
		rs, err := n1.Maps().Tunnel().Routes()
		must(t, err)
		for _, r := range rs {
			if r.PodCIDR.String() == "10.78.3.0/24" {
				return true
			}
		}
		return false
	}
	all, err := os.ReadFile(lab.peers)
	must(t, err)
	var peers []agent.Peer
	for i := range tunNode[:2] {
		p4, p6 := tunPods(i)
		peers = append(peers, agent.Peer{NodeIP: tunNode[i].String(), PodCIDRs: []string{p4, p6}})
	}
	pj, _ := json.Marshal(peers)
	must(t, os.WriteFile(lab.peers, pj, 0o600))
	tunNodeTable(t, n1, 0)
	if hasCIDR3() {
		t.Errorf("node 3 left, but node 1's cni_tun_cidrs still holds its pod CIDR")
	}
	must(t, os.WriteFile(lab.peers, all, 0o600))
	tunNodeTable(t, n1, 1)
	if !hasCIDR3() {
		t.Errorf("node 3 is back, but node 1's cni_tun_cidrs lacks its pod CIDR")
	}

	n1.MustDel(p1, "lc1")
	agents[0].Stop()
	out, err := n1.AgentCmd(append([]string{"uninstall"}, n1.AgentArgs(filepath.Join(t.TempDir(), "conf"))...)...)
	if err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	if rules := tunNodeRules(t, n1); len(rules) != 0 {
		t.Errorf("after uninstall, node 1 keeps rules to table %d: %q", agent.TunnelNodeTable, rules)
	}
	tunNodeTable(t, n1, 0)
}
