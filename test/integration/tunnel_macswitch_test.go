// --tunnel-mac-check=false: the switch for underlays where the outer-MAC
// check (docs/tunnel.md, check 1) drops genuine datagrams, because they
// come from another MAC than the next hop's (ECMP toward a node, VRRP or
// HSRP routers forwarding from their physical MAC). Weaker, by design.

package integration

import (
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelMACCheckOff: with the check off, a datagram claiming node 3's
// address from a MAC that is not node 1's next hop toward node 3 (here the
// stranger's, standing for a VRRP router's physical MAC) is delivered and
// counted as no drop_tunnel_mac; the trust rule still holds (the stranger
// with its own address is drop_tunnel_not_node). Turned back on (a
// restart without the flag), the same datagram is dropped again.
func TestTunnelMACCheckOff(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	must(t, lab.strang.Do(func(ns.NetNS) error { return tunSysctl("net.ipv4.conf.all.arp_ignore", "1") }))
	agents := startTunAgents(t, lab, "--tunnel-mac-check=false")
	p1, r1 := n1.RunPod("mo1")
	_, r3 := n3.RunPod("mo3")
	a1, _ := testenv.PodIPs(t, r1)
	a3, _ := testenv.PodIPs(t, r3)
	up1 := uplinkIndex(t, n1)
	idx1, _, _ := tunDevice(t, n1)
	m1 := n1.Maps()

	got := listenUDP4(t, p1, 9982)
	sendVXLANAs(t, lab.strang, tunNode[2], tunNode[0], vxlanFrame(a3, a1, 9982, []byte("other-mac")))
	if arrived := got(3 * time.Second); len(arrived) != 1 {
		t.Errorf("pod 1 received %q, want node 3's datagram from another MAC (the check is off)", arrived)
	}
	if n := counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunMAC).Packets; n != 0 {
		t.Errorf("%d drop_tunnel_mac with the check off", n)
	}
	notNode := counter(t, m1, idx1, maps.DirIngress, maps.ReasonDropTunNode).Packets
	sendVXLAN(t, lab.strang, tunNode[0], vxlanFrame(a3, a1, 9982, []byte("stranger")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q from a host that is no node", arrived)
	}
	waitIngress(t, m1, idx1, maps.ReasonDropTunNode, notNode+1)

	// Back on: node 1's agent restarted without the flag.
	agents[0].Stop()
	n1.StartAgent(n1.WriteConfDir(), append(lab.agentArgs(n1), "--tunnel", "vxlan", "--metrics-addr", "")...)
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if c, err := n1.Maps().Node().Config(); err == nil {
			if _, _, on := c.Tunnel(); on {
				break
			}
		}
	}
	sendVXLANAs(t, lab.strang, tunNode[2], tunNode[0], vxlanFrame(a3, a1, 9982, []byte("other-mac-again")))
	if arrived := got(2 * time.Second); len(arrived) != 0 {
		t.Errorf("pod 1 received %q with the check back on", arrived)
	}
	waitIngress(t, m1, up1, maps.ReasonDropTunMAC, 1)
}

// waitIngress waits until the ingress drops of reason on idx reach want.
func waitIngress(t *testing.T, m *maps.Maps, idx int, r maps.Reason, want uint64) {
	t.Helper()
	got := uint64(0)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if got = counter(t, m, idx, maps.DirIngress, r).Packets; got >= want {
			return
		}
	}
	t.Errorf("ifindex %d: %d ingress %s drops, want %d", idx, got, r, want)
}
