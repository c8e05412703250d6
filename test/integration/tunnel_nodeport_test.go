// A NodePort whose endpoint is a pod of another node across the tunnel,
// kube-proxy's way: the node DNATs the client's datagram to the pod and
// masquerades it (KUBE-MARK-MASQ) as it enters ebpf-tun. The masquerade
// takes its source from the outgoing device (IPv4: inet_select_addr; IPv6:
// source address selection, which prefers the outgoing interface): with no
// address on ebpf-tun it took another device's, the first with a global
// IPv4 address or the IPv6 one of longest match, which the receiving
// node's trust rule does not know as the sender's (drop_tunnel_source).

package integration

import (
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// udpEcho answers every datagram to port in a pod with the same bytes.
func udpEcho(t *testing.T, pod ns.NetNS, ip net.IP, port int) {
	t.Helper()
	var c *net.UDPConn
	must(t, pod.Do(func(ns.NetNS) error {
		var err error
		c, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
		return err
	}))
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			c.WriteToUDP(buf[:n], from)
		}
	}()
}

// udpAsk sends msg from netns to dst and waits for its echo (a few tries).
func udpAsk(t *testing.T, from ns.NetNS, dst *net.UDPAddr, msg string) bool {
	t.Helper()
	var c *net.UDPConn
	must(t, from.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialUDP("udp", nil, dst)
		return err
	}))
	defer c.Close()
	buf := make([]byte, 2048)
	for i := 0; i < 3; i++ {
		c.Write([]byte(msg))
		c.SetReadDeadline(time.Now().Add(time.Second))
		if n, err := c.Read(buf); err == nil && string(buf[:n]) == msg {
			return true
		}
	}
	return false
}

// testTunnelNodePort: a client outside the cluster (the lab's stranger on
// subnet A) reaches a NodePort of node 1 whose endpoint is pod p3 of node
// 3; node 1 holds one more address, extra, that comes first in source
// selection (on lo: the first device; the longest IPv6 match), as a
// node's other interfaces do (a container runtime's bridge, a BGP
// speaker's loopback address). The echo must come back, and node 3's
// tunnel device must drop nothing as drop_tunnel_source.
func testTunnelNodePort(t *testing.T, lab *tunLab, fam int, extra string, client net.IP) {
	n1, n3 := lab.nodes[0], lab.nodes[2]
	must(t, n1.InNode(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return labAddr(lo, extra)
	}))
	startTunAgents(t, lab)
	p3, r3 := n3.RunPod("np3")
	a3v4, a3v6 := testenv.PodIPs(t, r3)
	node, backend, cluster, restoreCmd := tunNode[0], a3v4, tunCluster, "iptables-nft-restore"
	if fam == 6 {
		node, backend, cluster, restoreCmd = tunNode6[0], a3v6, tunCluster6, "ip6tables-nft-restore"
	}
	udpEcho(t, p3, backend, 9980)
	restore(t, n1.Node, restoreCmd, iptablesRules(fam, cluster, []svcPort{{
		name: "tunnp", proto: "udp", clusterIP: map[int]net.IP{4: net.ParseIP("10.96.0.80"), 6: net.ParseIP("fd00:96::80")}[fam],
		port: 80, nodePort: 30080, backend: backend, target: 9980,
	}}))
	idx3, _, _ := tunDevice(t, n3)
	before := counter(t, n3.Maps(), idx3, maps.DirIngress, maps.ReasonDropTunSrc).Packets
	if !udpAsk(t, lab.strang, &net.UDPAddr{IP: node, Port: 30080}, "nodeport-across") {
		t.Errorf("no echo from pod %s through node 1's NodePort %s:30080 (client %s)", backend, node, client)
	}
	if d := counter(t, n3.Maps(), idx3, maps.DirIngress, maps.ReasonDropTunSrc).Packets - before; d != 0 {
		t.Errorf("node 3's tunnel device dropped %d datagrams as drop_tunnel_source: node 1's masquerade picked an address it is not known by", d)
	}
}

func TestTunnelNodePortMasqueraded(t *testing.T) {
	lab := newTunLab(t)
	// The router checks sources, as a cloud's network does (strict reverse
	// path): the endpoint's reply must come back through the tunnel to the
	// masquerade's address (node 1's pod CIDR's), not cross the underlay
	// with pod 3's address toward a node address, as it did when the
	// device held a copy of the node's address.
	must(t, lab.router.Do(func(ns.NetNS) error { return tunSysctl("net.ipv4.conf.all.rp_filter", "1") }))
	testTunnelNodePort(t, lab, 4, "10.99.0.1/32", tunStrang)
}

func TestTunnelNodePortMasqueraded6(t *testing.T) {
	lab := newTunLab6(t)
	testenv.WaitIPv6Ready(t, lab.nodes[0].Node)
	testTunnelNodePort(t, lab, 6, "fd00:78:ff::1/128", tunStrang6)
}
