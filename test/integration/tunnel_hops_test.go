// The managed neighbour entries the agent makes toward other nodes' next
// hops (pkg/agent/tunnelhops.go, tagged proto 199) go when the node they
// lead to leaves and on uninstall, and nothing else goes with them.

package integration

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// taggedNeighbours is `ip neigh show proto 199` of a node, as "ip dev"
// (iproute2 reads the entries, independently of the agent's code).
func taggedNeighbours(t *testing.T, e *testenv.Env) []string {
	t.Helper()
	var out []string
	must(t, e.InNode(func() error {
		for _, f := range []string{"-4", "-6"} {
			b, err := exec.Command("ip", f, "neigh", "show").CombinedOutput()
			if err != nil {
				return err
			}
			for _, l := range strings.Split(string(b), "\n") {
				if fs := strings.Fields(l); len(fs) > 2 && strings.Contains(l, " proto 199") {
					out = append(out, fs[0]+" "+fs[2])
				}
			}
		}
		return nil
	}))
	return out
}

func hasNeighbour(ns []string, want string) bool {
	for _, n := range ns {
		if n == want {
			return true
		}
	}
	return false
}

// TestTunnelHopsRemoved: node 1's agent makes the router (node 3's next
// hop) and node 2 managed neighbours; node 3 leaves the peer list and the
// router's entry goes (node 2's stays), while a permanent neighbour an
// operator set stays too; node 3 back, it comes back; `ebpf-agent
// uninstall` (agent stopped) removes the rest and names them, and leaves
// the operator's entry.
func TestTunnelHopsRemoved(t *testing.T) {
	lab := newTunLab(t)
	n1 := lab.nodes[0]
	operator := "10.77.1.77"
	must(t, n1.InNode(func() error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		return netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, IP: net.ParseIP(operator),
			HardwareAddr: []byte{2, 0, 0, 0, 0, 0x77}, State: netlink.NUD_PERMANENT})
	}))
	agents := startTunAgents(t, lab, "--reconcile-interval", "1s")
	gw, node2 := tunGWA.String()+" uplink0", tunNode[1].String()+" uplink0"
	waitNeighbours := func(what string, ok func([]string) bool) []string {
		t.Helper()
		var got []string
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			if got = taggedNeighbours(t, n1); ok(got) {
				return got
			}
		}
		t.Fatalf("%s: node 1's proto 199 neighbours %q", what, got)
		return nil
	}
	waitNeighbours("agent started", func(ns []string) bool { return hasNeighbour(ns, gw) && hasNeighbour(ns, node2) })

	all, err := os.ReadFile(lab.peers)
	must(t, err)
	var peers []agent.Peer
	for i := range tunNode[:2] {
		p4, p6 := tunPods(i)
		peers = append(peers, agent.Peer{NodeIP: tunNode[i].String(), PodCIDRs: []string{p4, p6}})
	}
	pj, _ := json.Marshal(peers)
	must(t, os.WriteFile(lab.peers, pj, 0o600))
	waitNeighbours("node 3 left", func(ns []string) bool { return !hasNeighbour(ns, gw) && hasNeighbour(ns, node2) })
	must(t, os.WriteFile(lab.peers, all, 0o600))
	waitNeighbours("node 3 back", func(ns []string) bool { return hasNeighbour(ns, gw) && hasNeighbour(ns, node2) })

	agents[0].Stop()
	out, err := n1.AgentCmd(append([]string{"uninstall"}, n1.AgentArgs(filepath.Join(t.TempDir(), "conf"))...)...)
	if err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	if got := taggedNeighbours(t, n1); len(got) != 0 {
		t.Errorf("after uninstall, node 1 keeps proto 199 neighbours %q", got)
	}
	for _, want := range []string{"neighbour", tunGWA.String(), tunNode[1].String()} {
		if !strings.Contains(out, want) {
			t.Errorf("uninstall's report does not name %q:\n%s", want, out)
		}
	}
	must(t, n1.InNode(func() error {
		b, _ := exec.Command("ip", "neigh", "show", operator).CombinedOutput()
		if !strings.Contains(string(b), "PERMANENT") {
			t.Errorf("the operator's neighbour %s is gone: %q", operator, b)
		}
		return nil
	}))
}
