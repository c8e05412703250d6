// ICMP errors about a hostPort pod's replies that come back through the
// tunnel (tunnel.c tun_hostport): translated into the pod, as
// cni_from_uplink translates those off the wire.

package integration

import (
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelHostPortICMPErrorFromTunnel: pod 3 asks node 1's hostPort
// (IPv4, IPv6) through the tunnel (node addresses are cluster CIDRs: it
// keeps its address) from a socket it then closes; the hostPort pod
// answers from a socket connected to pod 3's address and port, and pod 3's
// kernel sends "port unreachable" quoting node 1's address and hostPort,
// to node 1 through the tunnel. The hostPort pod's socket must see it
// (ECONNREFUSED), as it does for a client off the wire
// (TestNATICMPErrors). Before tun_hostport translated ICMP errors, the
// error went to node 1's stack, which had no socket for it: the pod never
// learned, v4 and v6.
func TestTunnelHostPortICMPErrorFromTunnel(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	lab.nodesInCluster(true)
	startTunAgents(t, lab)
	p3, r3 := n3.RunPod("icmp3")
	a3, a36 := testenv.PodIPs(t, r3)
	hp1 := n1.NewPod()
	n1.CleanupDel(hp1, "icmp1")
	n1.MustAddHP(hp1, "icmp1", testenv.PM{HostPort: 11359, ContainerPort: 5359, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, hp1)
	testenv.WaitIPv6Ready(t, p3)
	for _, c := range []struct {
		fam       string
		node, pod net.IP
	}{{"udp4", tunNode[0], a3}, {"udp6", tunNode6[0], a36}} {
		var ln *net.UDPConn
		must(t, hp1.Do(func(ns.NetNS) error {
			var err error
			ln, err = net.ListenUDP(c.fam, &net.UDPAddr{Port: 5359})
			return err
		}))
		// Each try from a new socket, closed at once: the first datagram
		// of a path may be lost while the way is resolved.
		var from *net.UDPAddr
		var err error
		for try := 0; try < 5 && from == nil; try++ {
			must(t, p3.Do(func(ns.NetNS) error {
				c, err := net.Dial("udp", hp(c.node, 11359))
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte("hello"))
				return err
			}))
			ln.SetReadDeadline(time.Now().Add(time.Second))
			_, from, err = ln.ReadFromUDP(make([]byte, 64))
		}
		ln.Close()
		if err != nil {
			t.Errorf("hostPort %s: the pod got nothing from pod 3: %v", hp(c.node, 11359), err)
			continue
		}
		if !from.IP.Equal(c.pod) {
			t.Errorf("hostPort %s: the pod saw pod 3 as %s, want its own address %s", hp(c.node, 11359), from, c.pod)
			continue
		}
		if err := udpRefused(hp1, &net.UDPAddr{Port: 5359}, from.String()); err != nil {
			t.Errorf("hostPort %s: the pod's answer to %s (pod 3's closed port, across the tunnel): %v", hp(c.node, 11359), from, err)
		}
	}
}
