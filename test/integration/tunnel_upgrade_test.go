// An agent upgrade on both ends of the tunnel while pods talk across it.

package integration

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelUpgradeUnderTraffic: pods of node 1 and node 3 (the two
// subnets, vxlan) exchange a numbered UDP datagram every 5 ms each way,
// IPv4 and IPv6, and a numbered TCP message over one connection, all
// echoed back, while nodes 1 and 3 are upgraded as a rollout does it: the
// new build's in-place swap of every attachment (`ebpf-agent upgrade
// --force`: pods', uplinks', the tunnel device's programs), then the agent
// replaced (stopped, started again). Not one datagram may be lost and the
// TCP sender must retransmit nothing; the tunnel device's programs must be
// new ones afterwards, or the test would prove nothing about them.
func TestTunnelUpgradeUnderTraffic(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	args := append(lab.agentArgs(n1), "--tunnel", "vxlan", "--metrics-addr", "")
	dirs := make([]string, len(lab.nodes))
	agents := make([]*testenv.AgentProc, len(lab.nodes))
	for i, e := range lab.nodes {
		dirs[i] = e.WriteConfDir()
		agents[i] = e.StartAgent(dirs[i], args...)
	}
	for i, e := range lab.nodes {
		waitTunRoutes(t, e, i)
		_, mtu, _ := tunDevice(t, e)
		e.Extra["mtu"] = mtu
	}
	p1, r1 := n1.RunPod("u1")
	p3, r3 := n3.RunPod("u3")
	a1, a16 := testenv.PodIPs(t, r1)
	a3, a36 := testenv.PodIPs(t, r3)
	echoUDP(t, p1, 7100)
	echoUDP(t, p3, 7100)
	echoTCP(t, p3, 7101)

	const every = 5 * time.Millisecond
	probes := []*seqProbe{
		startProbe(t, "udp4 pod1->pod3", p1, hp(a3, 7100), every),
		startProbe(t, "udp6 pod1->pod3", p1, hp(a36, 7100), every),
		startProbe(t, "udp4 pod3->pod1", p3, hp(a1, 7100), every),
		startProbe(t, "udp6 pod3->pod1", p3, hp(a16, 7100), every),
		startProbeOver(t, "tcp", "tcp4 pod1->pod3", p1, hp(a3, 7101), every),
	}
	for _, p := range probes {
		p.waitAnswered(t)
	}
	time.Sleep(300 * time.Millisecond)

	before := map[int][]string{}
	for _, i := range []int{0, 2} {
		before[i] = tunProgs(t, lab.nodes[i])
	}
	for _, i := range []int{0, 2} {
		e := lab.nodes[i]
		out, err := e.AgentCmd(append([]string{"upgrade", "--force"}, e.AgentArgs(dirs[i])...)...)
		if err != nil {
			t.Fatalf("node %d: upgrade --force: %v\n%s", i+1, err, out)
		}
		agents[i].Stop()
		agents[i] = e.StartAgent(dirs[i], args...)
		waitTunRoutes(t, e, i)
	}
	time.Sleep(500 * time.Millisecond)

	for _, p := range probes {
		sent, lost, retrans := p.finish()
		t.Logf("%s: %d sent, %d lost, %d TCP retransmissions", p.name, sent, len(lost), retrans)
		if len(lost) > 0 {
			t.Errorf("%s: %d of %d lost across the upgrade: %s", p.name, len(lost), sent, span(lost))
		}
		if retrans > 0 {
			t.Errorf("%s: the sender retransmitted %d segments", p.name, retrans)
		}
	}
	for _, i := range []int{0, 2} {
		after := tunProgs(t, lab.nodes[i])
		t.Logf("node %d %s programs: %v before, %v after", i+1, datapath.TunnelDevice, before[i], after)
		if len(after) != 2 {
			t.Errorf("node %d: %s runs %v after the upgrade, want cni_from_tunnel and cni_to_tunnel", i+1, datapath.TunnelDevice, after)
		}
		for _, b := range before[i] {
			for _, a := range after {
				if a == b {
					t.Errorf("node %d: %s still runs program %s: upgrade --force did not swap it", i+1, datapath.TunnelDevice, a)
				}
			}
		}
	}
}

// waitTunRoutes waits for node i's agent to route the other two nodes'
// pod CIDRs, both families.
func waitTunRoutes(t *testing.T, e *testenv.Env, i int) {
	t.Helper()
	var out string
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		e.InNode(func() error {
			b, _ := exec.Command("ip", "route", "show", "proto", "199").CombinedOutput()
			b6, _ := exec.Command("ip", "-6", "route", "show", "proto", "199").CombinedOutput()
			out = string(b) + string(b6)
			return nil
		})
		if strings.Count(out, "\n") == 4 {
			return
		}
	}
	t.Fatalf("node %d: want 4 tunnel routes:\n%s", i+1, out)
}

// tunProgs: the ids of the programs on the node's tunnel device (tcx).
func tunProgs(t *testing.T, e *testenv.Env) []string {
	t.Helper()
	idx, _, _ := tunDevice(t, e)
	var out []string
	for _, id := range e.ProgIDs(idx) {
		out = append(out, fmt.Sprint(id))
	}
	return out
}
