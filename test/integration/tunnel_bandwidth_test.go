// A pod's bandwidth limits hold for its traffic across the tunnel.

package integration

import (
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelBandwidth: a pod of node 1 with an egress limit of 40 Mbit/s
// and an ingress limit of 20 Mbit/s streams TCP to a pod of node 3, on the
// other subnet (vxlan), and back, IPv4 and IPv6: each direction gets its
// limit (the egress one is enforced before the packet is encapsulated, the
// ingress one after it is decapsulated, at the pod's host veth); the
// unlimited pod of node 3 is not held back. The tunnel devices' transmit
// counters prove the streams crossed.
func TestTunnelBandwidth(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, p3 := n1.NewPod(), n3.NewPod()
	n1.CleanupDel(p1, "bw1")
	n3.CleanupDel(p3, "bw3")
	const egress, ingress = 40e6, 20e6
	r1, err := n1.AddBW(p1, "bw1", bandwidthArgs(ingress, egress))
	if err != nil {
		t.Fatalf("ADD with bandwidth: %v", err)
	}
	r3 := n3.Add(p3, "bw3")
	a1, a16 := testenv.PodIPs(t, r1)
	a3, a36 := testenv.PodIPs(t, r3)

	_, _, tx1 := tunDevice(t, n1)
	_, _, tx3 := tunDevice(t, n3)
	d := 2 * time.Second
	assertRate(t, "pod 1 to pod 3 across the tunnel, egress limit", tcpRate(t, p1, p3, a3, d), egress)
	assertRate(t, "pod 3 to pod 1 across the tunnel, ingress limit", tcpRate(t, p3, p1, a1, d), ingress)
	assertRate(t, "pod 1 to pod 3 over IPv6, egress limit", tcpRate(t, p1, p3, a36, d), egress)
	assertRate(t, "pod 3 to pod 1 over IPv6, ingress limit", tcpRate(t, p3, p1, a16, d), ingress)
	// 2 s at 20-40 Mbit/s each: thousands of packets, fewer as the device
	// counts them (GSO segments count once); a run sent 3395 and 3363.
	_, _, tx1b := tunDevice(t, n1)
	_, _, tx3b := tunDevice(t, n3)
	if tx1b-tx1 < 1000 || tx3b-tx3 < 1000 {
		t.Errorf("the streams did not cross the tunnel: node 1's ebpf-tun sent %d packets, node 3's %d", tx1b-tx1, tx3b-tx3)
	}
	// Node 3's pod, unlimited, streams to node 1 well above both limits.
	if got := tcpRate(t, p3, n1.Node, tunNode[0], time.Second); got < 2*egress {
		t.Errorf("unlimited pod 3 to node 1: only %.1f Mbit/s", got/1e6)
	}
}
