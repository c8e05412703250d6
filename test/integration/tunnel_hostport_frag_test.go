// hostPort UDP datagrams that cross the tunnel in fragments (lib/hostport.h
// hp_frag_flow): a reply the hostPort pod fragments once it learned a
// smaller path, a client's request larger than its MTU, IPv4 and IPv6
// (hostport_frag_test.go: off the wire, hairpin, forged fragments).

package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// serveUDPEcho answers every datagram to port in netns, IPv4 and IPv6,
// with the datagram itself, from sockets at the kernel's default (path MTU
// discovery "want": larger than the known path, it is fragmented).
func serveUDPEcho(t *testing.T, netns ns.NetNS, port int) {
	t.Helper()
	for _, fam := range []string{"udp4", "udp6"} {
		var pc net.PacketConn
		must(t, netns.Do(func(ns.NetNS) error {
			var err error
			pc, err = net.ListenPacket(fam, fmt.Sprintf(":%d", port))
			return err
		}))
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 65536)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(buf[:n], from)
			}
		}()
	}
}

// echoConnectedUDP sends a size-byte datagram (its bytes numbered) to addr
// from netns on a connected socket (answers only from addr count) once a
// second, up to tries times, and returns the request that got the first
// whole echo back.
func echoConnectedUDP(netns ns.NetNS, addr string, size, tries int) (sent int, err error) {
	err = netns.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		req, buf := make([]byte, size), make([]byte, 65536)
		for i := range req {
			req[i] = byte(i)
		}
		var last string
		for sent = 1; sent <= tries; sent++ {
			c.Write(req)
			for end := time.Now().Add(time.Second); ; {
				c.SetReadDeadline(end)
				n, err := c.Read(buf)
				if err != nil {
					break
				}
				if n == size && string(buf[:n]) == string(req) {
					return nil
				}
				last = fmt.Sprintf("a %d-byte answer", n)
			}
		}
		return fmt.Errorf("no whole %d-byte echo from %s to %d requests (%s)", size, addr, tries, last)
	})
	return sent, err
}

// TestTunnelHostPortUDPFragmentedReply: as TestTunnelUDPBeyondPathMTU, but
// pod 3 asks node 1's hostPort (IPv4, IPv6) on a connected socket. Once the
// hostPort pod learns the path MTU (1350) it fragments its 1400-byte
// answers (IP_PMTUDISC_WANT, the default). Before hp_frag_flow,
// hostport_from_pod did not translate fragments (flow_parse4/6 refuse
// them), so they left with the pod's own address and port, and a
// connected client (a DNS resolver) dropped them: no answer in 20 s, v4
// and v6 (pmtu8, 19:12 UTC). An unconnected client
// (TestAttack8TunnelUDPBeyondPathMTU) took the answer from the wrong
// address, which is why that test passed.
func TestTunnelHostPortUDPFragmentedReply(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	lab.nodesInCluster(true)
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

// TestTunnelHostPortUDPFragmented: datagrams larger than the client's MTU
// to node 1's hostPort, echoed whole by the hostPort pod (MTU 1450), on
// connected sockets, IPv4 and IPv6: both directions are fragments. From
// the stranger, a host of node 1's subnet (off the wire: cni_from_uplink,
// the replies out by the FIB), 4000 bytes. From pod 3 through the tunnel
// (cni_from_tunnel; node addresses are cluster CIDRs, so pod 3 keeps its
// address and the replies go back by tun_redirect): first 1400 bytes,
// which teaches the hostPort pod the path MTU (its unfragmented answer
// carries DF and is refused by the stack: "fragmentation needed" / "packet
// too big"), then 4000. Before hp_frag_flow every case got nothing: the
// request's fragments went to the node's own stack, which had no socket
// for them, and the reply's left untranslated.
func TestTunnelHostPortUDPFragmented(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	lab.nodesInCluster(true)
	startTunAgents(t, lab)
	p3, _ := n3.RunPod("frag3")
	hp1 := n1.NewPod()
	n1.CleanupDel(hp1, "frag1")
	n1.MustAddHP(hp1, "frag1", testenv.PM{HostPort: 11356, ContainerPort: 5356, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, hp1)
	testenv.WaitIPv6Ready(t, p3)
	serveUDPEcho(t, hp1, 5356)
	for _, c := range []struct {
		who   string
		from  ns.NetNS
		node  net.IP
		sizes []int
	}{
		{"the stranger", lab.strang, tunNode[0], []int{4000}},
		{"the stranger", lab.strang, tunNode6[0], []int{4000}},
		{"pod 3", p3, tunNode[0], []int{1400, 4000}},
		{"pod 3", p3, tunNode6[0], []int{1400, 4000}},
	} {
		addr := hp(c.node, 11356)
		for _, size := range c.sizes {
			sent, err := echoConnectedUDP(c.from, addr, size, 15)
			if err != nil {
				t.Errorf("%s to hostPort %s: %v", c.who, addr, err)
				continue
			}
			t.Logf("%s to %s: %d bytes echoed after %d requests", c.who, addr, size, sent)
		}
	}
}

// TestTunnelHostPortUDP6ExtensionHeaders: as TestTunnelHostPortUDPFragmented,
// IPv6, pod 3's datagrams (100 and 4000 bytes) carrying a hop-by-hop and a
// destination options header to node 1's hostPort through the tunnel, and
// the answers of a hostPort pod whose socket puts both on them. Before,
// cni_from_tunnel let only TCP, UDP, a fragment header and ICMP reach the
// hostPort code (and hp_frag_flow walked no extension header): none was
// echoed.
func TestTunnelHostPortUDP6ExtensionHeaders(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	lab.nodesInCluster(true)
	startTunAgents(t, lab)
	p3, _ := n3.RunPod("ext3")
	hp1, hq1 := n1.NewPod(), n1.NewPod()
	n1.CleanupDel(hp1, "ext1")
	n1.CleanupDel(hq1, "extq1")
	n1.MustAddHP(hp1, "ext1", testenv.PM{HostPort: 11357, ContainerPort: 5357, Protocol: "udp"})
	n1.MustAddHP(hq1, "extq1", testenv.PM{HostPort: 11358, ContainerPort: 5358, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, hp1)
	testenv.WaitIPv6Ready(t, hq1)
	testenv.WaitIPv6Ready(t, p3)
	serveUDPEcho(t, hp1, 5357)
	serveUDP6EchoOpts(t, hq1, 5358, ip6OptsSock(true, true))
	for _, size := range []int{100, 4000} {
		for _, c := range []struct {
			what   string
			port   int
			client func(int) error
		}{
			{"both headers", 11357, ip6OptsSock(true, true)},
			{"answered with both headers", 11358, func(int) error { return nil }},
		} {
			addr := hp(tunNode6[0], c.port)
			if err := echoUDP6Opts(p3, addr, size, 10, c.client); err != nil {
				t.Errorf("pod 3, %d bytes, %s, to hostPort %s through the tunnel: %v", size, c.what, addr, err)
			}
		}
	}
}
