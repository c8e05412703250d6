// PMTU for a hostPort's replies into the tunnel: a pod of another node
// dials node 1's hostPort through the tunnel (its address kept), and the
// hostPort pod's replies go back by tun_redirect (lib/tunnel.h), which sends
// past the route into the device.

package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// tunMidPath makes the lab's small link one in the middle of the path:
// node 3's uplink and subnet B are 1500 bytes like subnet A, and the router
// forwards between the subnets at 1400 (its routes' MTU, which forwarding
// honours), answering "fragmentation needed". Every node's pods then get
// 1450 bytes (nothing on a node's own link says otherwise) and a TCP
// client on node 3 announces an MSS that does not fit the path, as clients
// behind a tunnel over a WAN or a cloud's smaller inter-region MTU do.
// Before the agents start: they size the pods from the uplink.
func tunMidPath(t *testing.T, lab *tunLab) {
	t.Helper()
	must(t, lab.nodes[2].InNode(func() error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(l, 1500)
	}))
	must(t, lab.router.Do(func(ns.NetNS) error {
		for _, n := range []string{"n3", "brB"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetMTU(l, 1500); err != nil {
				return err
			}
		}
		for _, s := range []struct {
			br  string
			gw  net.IP
			dst string
		}{{"brA", tunGWA, "10.77.1.0/24"}, {"brB", tunGWB, "10.77.2.0/24"}} {
			l, err := netlink.LinkByName(s.br)
			if err != nil {
				return err
			}
			_, dst, _ := net.ParseCIDR(s.dst)
			r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Src: s.gw, Scope: netlink.SCOPE_LINK,
				Protocol: unix.RTPROT_KERNEL, MTU: tunPMTU}
			if err := netlink.RouteReplace(r); err != nil {
				return fmt.Errorf("route %s mtu %d: %w", s.dst, tunPMTU, err)
			}
		}
		return nil
	}))
}

// serveBulk: a TCP server in pod on port (IPv4 and IPv6) that writes n
// bytes to every client and closes.
func serveBulk(t *testing.T, pod ns.NetNS, port, n int) {
	t.Helper()
	var lns []net.Listener
	must(t, pod.Do(func(ns.NetNS) error {
		for _, fam := range []string{"4", "6"} {
			ln, err := net.Listen("tcp"+fam, fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			lns = append(lns, ln)
		}
		return nil
	}))
	t.Cleanup(func() {
		for _, l := range lns {
			l.Close()
		}
	})
	buf := make([]byte, n)
	for _, ln := range lns {
		acceptEach(ln, func(c net.Conn) {
			c.SetDeadline(time.Now().Add(60 * time.Second))
			c.Write(buf)
		})
	}
}

// fetchBulk dials addr from netns and reads until the server closes or
// wait passes; it returns the bytes read.
func fetchBulk(from ns.NetNS, addr string, wait time.Duration) (int64, error) {
	var c net.Conn
	if err := from.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	}); err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	return io.Copy(io.Discard, c)
}

// serveBigUDP: a UDP server in pod on port (IPv4 and IPv6) that answers
// every client, from a socket connected to it (SO_REUSEPORT beside the
// listener), with big bytes and, once the kernel refuses that size
// (EMSGSIZE: the socket does path MTU discovery, IP_PMTUDISC_DO, and was
// told the path is smaller), with small bytes, as a server adapting to the
// path does. A connected socket: in these pods an unconnected one was never
// refused, pod to pod as much as through the hostPort, while the node's
// "fragmentation needed" arrived (a kernel matter left alone).
func serveBigUDP(t *testing.T, pod ns.NetNS, port, big, small int) {
	t.Helper()
	reuse := func(fam string) *net.ListenConfig {
		return &net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
				if serr != nil {
					return
				}
				if fam == "4" {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
				} else {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
				}
			})
			return serr
		}}
	}
	type lsn struct {
		fam string
		pc  *net.UDPConn
	}
	var ls []lsn
	var conns []net.Conn
	var mu sync.Mutex
	must(t, pod.Do(func(ns.NetNS) error {
		for _, fam := range []string{"4", "6"} {
			pc, err := reuse(fam).ListenPacket(context.Background(), "udp"+fam, fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			ls = append(ls, lsn{fam, pc.(*net.UDPConn)})
		}
		return nil
	}))
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range ls {
			l.pc.Close()
		}
		for _, c := range conns {
			c.Close()
		}
	})
	answer := func(c net.Conn) {
		if _, err := c.Write(make([]byte, big)); errors.Is(err, unix.EMSGSIZE) {
			c.Write(make([]byte, small))
		}
	}
	for _, l := range ls {
		go func() {
			buf := make([]byte, 2048)
			replies := map[string]net.Conn{}
			for {
				_, from, err := l.pc.ReadFromUDP(buf)
				if err != nil {
					return
				}
				c := replies[from.String()]
				if c == nil {
					// The dial's socket is made in the pod's netns.
					pod.Do(func(ns.NetNS) error {
						d := net.Dialer{LocalAddr: &net.UDPAddr{Port: port}, ControlContext: func(ctx context.Context, n, a string, rc syscall.RawConn) error {
							return reuse(l.fam).Control(n, a, rc)
						}}
						c, err = d.Dial("udp"+l.fam, from.String())
						return err
					})
					if c == nil {
						continue
					}
					replies[from.String()] = c
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
					// Later requests of this client may arrive on the
					// connected socket (IPv4's reuseport group prefers it).
					go func() {
						b := make([]byte, 2048)
						for {
							// The "packet too big" is reported once as the
							// socket's error (EMSGSIZE), on a read too.
							if _, err := c.Read(b); errors.Is(err, unix.EMSGSIZE) {
								continue
							} else if err != nil {
								return
							}
							answer(c)
						}
					}()
				}
				answer(c)
			}
		}()
	}
}

// askBigUDP asks addr from netns every 300 ms until an answer comes or
// wait passes; it returns the first answer's size (0: none).
func askBigUDP(from ns.NetNS, addr string, wait time.Duration) (int, error) {
	var c net.Conn
	if err := from.Do(func(ns.NetNS) error {
		var err error
		c, err = net.Dial("udp", addr)
		return err
	}); err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, 4096)
	for end := time.Now().Add(wait); time.Now().Before(end); {
		c.Write([]byte("big?"))
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if n, err := c.Read(buf); err == nil {
			return n, nil
		}
	}
	return 0, nil
}

// TestTunnelHostPortReplyPMTU: a pod of node 3 (MTU 1450) dials node 1's
// hostPort at node 1's IPv4 and IPv6 address, through the tunnel (node
// addresses are cluster CIDRs: the pod keeps its address), and the hostPort
// pod (MTU 1450) answers with more than the 1400-byte path between the
// subnets carries. TCP: 4 MiB must arrive (the pod's segments fit its MTU,
// not the path), IPv4 and IPv6. UDP, IPv4 and IPv6: a
// server doing path MTU discovery answers 1400 bytes, or 1300 once its
// kernel refuses 1400; the client must get an answer, which then is the
// 1300-byte one. Before the fix all of it failed, v4 and v6:
// tun_redirect sent the replies past the route whose MTU the agent had
// locked at the path's, the router's "fragmentation needed" reached only
// node 1's kernel (about the outer datagram), and the pod was never told:
// the TCP transfer stalled and no UDP answer ever arrived.
func TestTunnelHostPortReplyPMTU(t *testing.T) {
	lab := newTunLab6(t)
	tunMidPath(t, lab)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	lab.nodesInCluster(true)
	startTunAgents(t, lab)
	for i, e := range lab.nodes {
		if _, mtu, _ := tunDevice(t, e); mtu != 1450 {
			t.Fatalf("node %d: tunnel device MTU %d, want 1450 (every uplink is 1500)", i+1, mtu)
		}
	}
	hp1 := hostPortPod(n1, "hpmtu1", 11304)
	p3, _ := n3.RunPod("cmtu3")
	testenv.WaitIPv6Ready(t, hp1)
	testenv.WaitIPv6Ready(t, p3)
	const bulk = 4 << 20
	serveBulk(t, hp1, 8080, bulk)
	serveBigUDP(t, hp1, 8080, 1400, 1300)

	for _, node := range []net.IP{tunNode[0], tunNode6[0]} {
		addr := hp(node, 11304)
		got, err := fetchBulk(p3, addr, 30*time.Second)
		if got != bulk {
			t.Errorf("tcp %s from pod 3: %d of %d bytes (%v): the hostPort pod's segments larger than the path were lost", addr, got, bulk, err)
		}
		n, err := askBigUDP(p3, addr, 15*time.Second)
		switch {
		case err != nil:
			t.Errorf("udp %s from pod 3: %v", addr, err)
		case n == 0:
			t.Errorf("udp %s from pod 3: no answer in 15 s: the hostPort pod was never told its 1400-byte answers do not fit the path", addr)
		case n != 1300:
			t.Errorf("udp %s from pod 3: a %d-byte answer, want 1300 (the server's after its kernel refused 1400)", addr, n)
		}
	}
}
