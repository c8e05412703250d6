// Routing table 199 shared with another tool (docs/tunnel.md, "Pods to
// other nodes' addresses"): the agent changes and removes only the rules
// and routes it tagged (protocol 199).

package integration

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// foreign199 is another tool's state in table 199: a rule and a route of
// each family, none tagged with the agent's protocol.
var foreign199 = [][]string{
	{"-4", "rule", "add", "from", "192.0.2.0/24", "lookup", "199", "pref", "100"},
	{"-6", "rule", "add", "from", "2001:db8:c0::/64", "lookup", "199", "pref", "100"},
	{"-4", "route", "add", "blackhole", "198.51.100.0/24", "table", "199"},
	{"-6", "route", "add", "blackhole", "2001:db8:c1::/64", "table", "199"},
}

// checkForeign199 reports which of foreign199 node e lost.
func checkForeign199(t *testing.T, e *testenv.Env, when string) {
	t.Helper()
	var rules, routes string
	must(t, e.InNode(func() error {
		for _, fam := range []string{"-4", "-6"} {
			b, _ := exec.Command("ip", fam, "rule", "show").CombinedOutput()
			rules += string(b)
			b, _ = exec.Command("ip", fam, "route", "show", "table", "199").CombinedOutput()
			routes += string(b)
		}
		return nil
	}))
	for _, want := range []string{"100:\tfrom 192.0.2.0/24 lookup 199", "100:\tfrom 2001:db8:c0::/64 lookup 199"} {
		if !strings.Contains(rules, want) {
			t.Errorf("%s: the foreign rule %q is gone:\n%s", when, want, rules)
		}
	}
	for _, want := range []string{"blackhole 198.51.100.0/24", "blackhole 2001:db8:c1::/64"} {
		if !strings.Contains(routes, want) {
			t.Errorf("%s: the foreign route %q of table 199 is gone:\n%s", when, want, routes)
		}
	}
}

// waitPeerSyncs waits until the agent logged n more peer syncs than
// before (its reconcile interval is 1 s).
func waitPeerSyncs(t *testing.T, a *testenv.AgentProc, n int) {
	t.Helper()
	before := strings.Count(a.Logs(), "peer routes")
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if strings.Count(a.Logs(), "peer routes")-before >= n {
			return
		}
	}
	t.Fatalf("the agent did not sync its peers %d times:\n%s", n, a.Logs())
}

// TestTunnelRoutingLeavesForeignTable199: node 1 holds another tool's rule
// `from 192.0.2.0/24 lookup 199 pref 100` (and an IPv6 one) and a route of
// each family in table 199. They survive peer syncs of the agent with the
// tunnel off (the default), with it on (beside the agent's own rules and
// routes, which are there), with it off again (which removes the agent's),
// and `ebpf-agent uninstall`. Red before the agent's rules and routes were
// told apart by their protocol: the tunnel off deleted every rule and route
// of table 199 at each sync, the tunnel on every one not exactly its own.
func TestTunnelRoutingLeavesForeignTable199(t *testing.T) {
	lab := newTunLab(t)
	n1 := lab.nodes[0]
	lab.nodesInCluster(false)
	must(t, n1.InNode(func() error { return ipCmds(foreign199...) }))
	startOff := func() *testenv.AgentProc {
		a := n1.StartAgent(n1.WriteConfDir(), append(lab.agentArgs(n1), "--metrics-addr", "", "--reconcile-interval", "1s")...)
		waitPeerSyncs(t, a, 2)
		return a
	}

	off := startOff()
	checkForeign199(t, n1, "tunnel off")
	off.Stop()

	agents := startTunAgents(t, lab, "--reconcile-interval", "1s")
	p1, _ := n1.RunPod("f199")
	// Nodes 2 and 3's addresses (ours), the two foreign routes.
	table := tunNodeTable(t, n1, 4)
	for _, a := range tunNode[1:] {
		if !strings.Contains(table, a.String()+" ") {
			t.Errorf("tunnel on: node 1's table 199 lacks its route to %s:\n%s", a, table)
		}
	}
	waitPeerSyncs(t, agents[0], 2)
	checkForeign199(t, n1, "tunnel on")
	p4, p6 := tunPods(0)
	rules := tunNodeRules(t, n1)
	for _, c := range []string{p4, p6} {
		found := false
		for _, l := range rules {
			found = found || strings.Contains(l, "from "+c+" lookup 199") && strings.Contains(l, "proto 199")
		}
		if !found {
			t.Errorf("tunnel on: node 1 has no rule from %s to table 199 tagged proto 199: %q", c, rules)
		}
	}
	n1.MustDel(p1, "f199")
	agents[0].Stop()

	off = startOff()
	checkForeign199(t, n1, "tunnel off again")
	if rules := tunNodeRules(t, n1); len(rules) != 2 {
		t.Errorf("tunnel off again: node 1's rules to table 199 are %q, want the two foreign ones", rules)
	}
	tunNodeTable(t, n1, 2)
	off.Stop()

	out, err := n1.AgentCmd(append([]string{"uninstall"}, n1.AgentArgs(filepath.Join(t.TempDir(), "conf"))...)...)
	if err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	checkForeign199(t, n1, "uninstall")
}
