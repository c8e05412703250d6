// Probe (red): a hostPort's UDP reply that the pod fragments is not
// translated back for the client.

package integration

import (
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelHostPortUDPFragmentedReply: as TestTunnelUDPBeyondPathMTU, but
// pod 3 asks node 1's hostPort (IPv4, IPv6) on a connected socket. Once the
// hostPort pod learns the path MTU (1350) it fragments its 1400-byte
// answers (IP_PMTUDISC_WANT, the default); hostport_from_pod does not
// translate fragments (flow_parse4/6 refuse them), so they leave with the
// pod's own address and port, and a connected client (a DNS resolver)
// drops them: no answer in 20 s, v4 and v6 (pmtu8, 19:12 UTC). An
// unconnected client (TestAttack8TunnelUDPBeyondPathMTU) takes the answer
// from the wrong address, which is why that test passes.
func TestTunnelHostPortUDPFragmentedReply(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	cluster := []string{tunCluster, tunCluster6}
	for i := range tunNode {
		cluster = append(cluster, tunNode[i].String()+"/32", tunNode6[i].String()+"/128")
	}
	for _, e := range lab.nodes {
		e.Extra["clusterCIDRs"] = cluster
	}
	startTunAgents(t, lab)
	p3, _ := n3.RunPod("udpfrag3")
	hp1 := n1.NewPod()
	n1.CleanupDel(hp1, "udpfrag1")
	n1.MustAddHP(hp1, "udpfrag1", testenv.PM{HostPort: 11355, ContainerPort: 5355, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, hp1)
	testenv.WaitIPv6Ready(t, p3)
	const size = 1400
	serveUDPBoth(t, hp1, 5355, size)
	for _, addr := range []string{hp(tunNode[0], 11355), hp(tunNode6[0], 11355)} {
		sent, n, err := askConnectedUDP(p3, addr, 20)
		switch {
		case err != nil:
			t.Errorf("pod 3 asking hostPort %s for %d bytes: %v", addr, size, err)
		case n != size:
			t.Errorf("pod 3 asking hostPort %s: a %d-byte answer, want %d", addr, n, size)
		default:
			t.Logf("%s: answered after %d requests", addr, sent)
		}
	}
}
