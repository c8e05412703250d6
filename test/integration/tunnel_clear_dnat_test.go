// A tunnelled peer's pod source in the clear, carried into a pod by a stack
// DNAT at a node address (docs/tunnel.md, check 5): to_container drops it.

package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestTunnelClearForgedSourceThroughStackDNATBoth: the IPv4 and IPv6 twin
// of TestTunnelClearForgedSourceThroughStackDNAT, with the genuine
// traffic that must keep passing the same DNAT. Hybrid VXLAN on the lab
// with the IPv6 underlay; node 1 (rp_filter=2) DNATs port 30080 of its
// addresses (10.77.1.1, fd77:1::1) to its pod's 8080, TCP and UDP, as
// kube-proxy does for a NodePort with externalTrafficPolicy Local. Node
// addresses are cluster CIDRs, so no pod's packet to them is masqueraded.
// Delivered, with the sender's pod address: node 3's pod (through the
// tunnel), node 2's pod (a direct node in hybrid mode: in the clear), the
// stranger as itself. Dropped, counted drop_tunnel_source on node 1's
// uplink (4): the stranger's TCP SYN and UDP datagram claiming node 3's
// pod, each family. Red before to_container judged the source: the
// forgeries reached the pod.
func TestTunnelClearForgedSourceThroughStackDNATBoth(t *testing.T) {
	lab := newTunLab6(t)
	n1 := lab.nodes[0]
	looseRPFilter(t, n1)
	lab.nodesInCluster(true)
	startTunAgents(t, lab, "--tunnel-hybrid")
	pods, v4, v6 := lab.podPerNode(t, "d")
	p1, p2, p3 := pods[0], pods[1], pods[2]
	a1, a2, a3 := v4[0], v4[1], v4[2]
	a16, a26, a36 := v6[0], v6[1], v6[2]
	var rules4, rules6 [][]string
	for _, proto := range []string{"tcp", "udp"} {
		rules4 = append(rules4, []string{"-w", "-t", "nat", "-A", "PREROUTING", "-d", tunNode[0].String(), "-p", proto,
			"--dport", "30080", "-j", "DNAT", "--to-destination", a1.String() + ":8080"})
		rules6 = append(rules6, []string{"-w", "-t", "nat", "-A", "PREROUTING", "-d", tunNode6[0].String(), "-p", proto,
			"--dport", "30080", "-j", "DNAT", "--to-destination", "[" + a16.String() + "]:8080"})
	}
	iptablesIn(t, n1, "iptables-nft", rules4...)
	iptablesIn(t, n1, "ip6tables-nft", rules6...)
	got4, got6 := listenUDP4(t, p1, 8080), listenUDP6(t, p1, 8080)
	up1 := uplinkIndex(t, n1)
	m1 := n1.Maps()
	drops0 := counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunSrc).Packets
	strMAC, n1MAC := linkMAC(t, lab.strang, "uplink0"), linkMAC(t, n1.Node, "uplink0")

	// Genuine: each arrives with its sender's address, none dropped.
	sendUDPFrom(t, p3, tunNode[0], 30080, []byte("pod3-tunnel"))
	sendUDPFrom(t, p3, tunNode6[0], 30080, []byte("pod3-tunnel6"))
	sendUDPFrom(t, p2, tunNode[0], 30080, []byte("pod2-direct"))
	sendUDPFrom(t, p2, tunNode6[0], 30080, []byte("pod2-direct6"))
	sendFrames(t, lab.strang, "uplink0", [][]byte{
		udpFrame(strMAC, n1MAC, tunStrang, 40030, tunNode[0], 30080, []byte("stranger")),
		udpFrame(strMAC, n1MAC, tunStrang6, 40030, tunNode6[0], 30080, []byte("stranger6")),
	})
	arrived := append(got4(3*time.Second), got6(time.Second)...)
	for _, want := range missing(arrived, []string{"pod3-tunnel from " + a3.String() + ":", "pod3-tunnel6 from [" + a36.String() + "]",
		"pod2-direct from " + a2.String() + ":", "pod2-direct6 from [" + a26.String() + "]",
		"stranger from " + tunStrang.String() + ":", "stranger6 from [" + tunStrang6.String() + "]"}) {
		t.Errorf("pod 1 did not receive %q through node 1's DNAT (got %q)", want, arrived)
	}
	if n := counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunSrc).Packets - drops0; n != 0 {
		t.Errorf("node 1's uplink counted %d drop_tunnel_source of genuine traffic", n)
	}

	// The stranger claiming node 3's pod, both families.
	before := podSNMP(t, p1)
	sendFrames(t, lab.strang, "uplink0", append(forgedToPort(strMAC, n1MAC, a3, tunNode[0], 40031, 30080, "forged-dnat"),
		forgedToPort(strMAC, n1MAC, a36, tunNode6[0], 40031, 30080, "forged-dnat")...))
	g := append(got4(2*time.Second), got6(time.Second)...)
	if d := podReceived(before, podSNMP(t, p1)); len(d) != 0 || len(g) != 0 {
		t.Errorf("pod 1 received the stranger's forgeries claiming node 3's pod %s / %s through node 1's DNAT: %v, datagrams %q", a3, a36, d, g)
	}
	if n := counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunSrc).Packets - drops0; n != 4 {
		t.Errorf("node 1's uplink counted %d drop_tunnel_source, want the 4 forgeries", n)
	}

	// Node 3's pod still reaches pod 1 through the DNAT afterwards.
	sendUDPFrom(t, p3, tunNode6[0], 30080, []byte("pod3-again6"))
	if g := got6(3 * time.Second); len(g) != 1 || !strings.HasPrefix(g[0], "pod3-again6 from ["+a36.String()+"]") {
		t.Errorf("pod 1 received %q after the forgeries, want node 3's pod's datagram", g)
	}
}
