package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestAttack25TunnelNodeSourcesJudged: what a node may put in the tunnel
// as its own (docs/tunnel.md, check 2: an inner source in its pod CIDRs or
// one of its addresses) still meets the receiving pod's ingress policy,
// and the receiving node's own addresses are not the sender's to claim.
// Pod 1 (node 1, networkPolicy) admits node 2's pod only. Root on node 3,
// a genuine node (outer source, MAC and destination all pass), sends node 1
// VXLAN datagrams to pod 1 whose inner source is:
//   - node 3's own address, and its tunnel device's (its pod CIDR's
//     network address, docs/tunnel.md): pass the trust rule, and must be
//     denied by pod 1's rules (another node is no "node's traffic" of node
//     1's), counted drop_policy ingress on pod 1's host veth;
//   - node 1's address and node 1's tunnel device address (IPv4, IPv6):
//     node 1's own traffic passes every pod's policy, so these must stop at
//     the trust rule (not node 3's), counted drop_tunnel_source;
//   - node 2's pod, the one peer pod 1 admits: the trust rule again.
//
// Before any policy is written pod 1 is pending ("only the node's traffic
// passes"): node 1 reaches it, node 3's own sources do not.
// Controls: node 2's pod reaches pod 1; once pod 1 also admits node 3's
// two addresses, the same datagrams with those sources arrive (the path
// delivers; the denial above was the policy's).
func TestAttack25TunnelNodeSourcesJudged(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	n1.Extra["networkPolicy"] = true
	startTunAgents(t, lab)
	pods, a4, a6 := lab.podPerNode(t, "t25n")
	p1, p2 := pods[0], pods[1]
	m1 := n1.Maps()
	_, idx1 := n1.HostVeth("t25n1")
	idxT, _, _ := tunDevice(t, n1)
	w := m1.Policy().Writer()
	const port = 9725
	// The network address of node i's pod CIDR: its tunnel device's address.
	tunAddr := func(i, fam int) net.IP {
		p4, p6 := tunPods(i)
		if fam == 4 {
			_, n, _ := net.ParseCIDR(p4)
			return n.IP.To4()
		}
		_, n, _ := net.ParseCIDR(p6)
		return n.IP
	}
	frame := func(src net.IP, dst4, dst6 net.IP, what string) []byte {
		if src.To4() != nil {
			return vxlanFrame(src, dst4, port, []byte(what))
		}
		return a14VXLAN(1, a14InnerDst, 0x86dd, a14IP6UDP(src, dst6, port, []byte(what)))
	}
	got4, got6 := listenUDP4(t, p1, port), listenUDP6(t, p1, port)

	// Pending (no policy programmed yet: "only the node's traffic passes"):
	// node 1 itself reaches pod 1; node 3's own sources through the tunnel
	// are another node's, not this one's, and must not.
	st, ok, err := m1.Policy().StateOf(idx1)
	must(t, err)
	if !ok || st.Mode[0] != maps.PolicyPending || st.Mode[1] != maps.PolicyPending {
		t.Fatalf("pod 1 is not pending before its policy is written: %+v (found %v)", st, ok)
	}
	sendUDPFrom(t, n1.Node, a4[0], port, []byte("pending-node1"))
	pendingSrcs := []net.IP{tunNode[2], tunAddr(2, 4), tunAddr(2, 6)}
	for _, src := range pendingSrcs {
		sendVXLAN(t, n3.Node, tunNode[0], frame(src, a4[0], a6[0], "pending-node3-"+src.String()))
	}
	arrived := append(got4(2*time.Second), got6(200*time.Millisecond)...)
	if len(arrived) != 1 || missing(arrived, []string{"pending-node1"}) != nil {
		t.Errorf("pending pod 1 received %q, want node 1's datagram only (node 3's own sources are no traffic of pod 1's node)", arrived)
	}

	must(t, w.Apply(uint32(idx1), policy.Endpoint{Ingress: isolated(allowAll(host(a4[1])), allowAll(host(a6[1])))}))
	sendUDPFrom(t, p2, a4[0], port, []byte("pod2-v4"))
	sendUDPFrom(t, p2, a6[0], port, []byte("pod2-v6"))
	if arrived := append(got4(2*time.Second), got6(200*time.Millisecond)...); len(missing(arrived, []string{"pod2-v4", "pod2-v6"})) != 0 {
		t.Fatalf("node 2's pod, admitted, did not reach pod 1 through the tunnel: got %q", arrived)
	}

	drops := func(idx int, r maps.Reason) uint64 { return counter(t, m1, idx, maps.DirIngress, r).Packets }

	type forged struct {
		name string
		src  net.IP
	}
	byPolicy := []forged{
		{"node3-address", tunNode[2]},
		{"node3-tunnel-address-v4", tunAddr(2, 4)},
		{"node3-tunnel-address-v6", tunAddr(2, 6)},
	}
	byTrust := []forged{
		{"node1-address", tunNode[0]},
		{"node1-tunnel-address-v4", tunAddr(0, 4)},
		{"node1-tunnel-address-v6", tunAddr(0, 6)},
		{"node2-pod-v4", a4[1]},
		{"node2-pod-v6", a6[1]},
	}
	send := func(fs []forged, round string) {
		for _, f := range fs {
			sendVXLAN(t, n3.Node, tunNode[0], frame(f.src, a4[0], a6[0], fmt.Sprintf("%s-%s", round, f.name)))
		}
	}
	pol0, src0 := drops(idx1, maps.ReasonDropPolicy), drops(idxT, maps.ReasonDropTunSrc)
	send(byPolicy, "denied")
	send(byTrust, "denied")
	if arrived := append(got4(2*time.Second), got6(200*time.Millisecond)...); len(arrived) != 0 {
		t.Errorf("pod 1, admitting node 2's pod only, received from node 3's tunnel: %q", arrived)
	}
	time.Sleep(200 * time.Millisecond)
	if d := drops(idx1, maps.ReasonDropPolicy) - pol0; d != uint64(len(byPolicy)) {
		t.Errorf("drop_policy ingress on pod 1's host veth moved by %d, want %d (node 3's own sources, denied by pod 1's rules)", d, len(byPolicy))
	}
	if d := drops(idxT, maps.ReasonDropTunSrc) - src0; d != uint64(len(byTrust)) {
		t.Errorf("drop_tunnel_source on node 1's tunnel device moved by %d, want %d (node 1's addresses and node 2's pod inside node 3's datagrams)", d, len(byTrust))
	}

	// Control: admitted, node 3's own sources arrive.
	must(t, w.Apply(uint32(idx1), policy.Endpoint{Ingress: isolated(allowAll(host(a4[1])), allowAll(host(a6[1])),
		allowAll(host(tunNode[2])), allowAll(host(tunAddr(2, 4))), allowAll(host(tunAddr(2, 6))))}))
	send(byPolicy, "admitted")
	arrived = append(got4(2*time.Second), got6(500*time.Millisecond)...)
	want := []string{}
	for _, f := range byPolicy {
		want = append(want, "admitted-"+f.name)
	}
	if miss := missing(arrived, want); len(miss) != 0 {
		t.Errorf("once pod 1 admits node 3's addresses, %q did not arrive (got %q): the denial above proves nothing", miss, arrived)
	}
}
