// ICMP errors through both NATs: path-MTU discovery across a 1280-byte link
// (masquerade and hostPort), traceroute's time exceeded, port unreachable
// each way, IPv4 and IPv6.

package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// The far host: behind the remote host of newHPEnv (which routes, and has
// no route to any pod), over a link of MTU 1280. Its routes advertise a TCP
// MSS of a 1500-byte path, so only path-MTU discovery (the router's
// "fragmentation needed" / "packet too big" reaching the sender) keeps a
// transfer going.
var (
	farIP     = map[int]net.IP{4: net.ParseIP("100.64.0.2").To4(), 6: net.ParseIP("fd00:64::2")}
	farRouter = map[int]net.IP{4: net.ParseIP("100.64.0.1").To4(), 6: net.ParseIP("fd00:64::1")}
)

const (
	farMTU = 1280
	podMTU = 1400 // below the uplink's 1500: the node itself reports too big a reply to a pod
)

// newPMTULab is a node with ipMasq and hostPorts (pods with MTU podMTU),
// its remote host turned into a router, and a far host behind it.
func newPMTULab(t *testing.T) (*hpEnv, ns.NetNS) {
	t.Helper()
	e := newHPEnv(t)
	e.Extra["ipMasq"] = true
	e.Extra["mtu"] = podMTU
	far, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		far.Close()
		testutils.UnmountNS(far)
	})
	addr := func(l netlink.Link, ip net.IP, bits int) error {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, len(ip)*8)}, Flags: unix.IFA_F_NODAD}
		return netlink.AddrAdd(l, a)
	}
	noDAD := "/proc/sys/net/ipv6/conf/default/accept_dad"
	if err := far.Do(func(ns.NetNS) error { return os.WriteFile(noDAD, []byte("0"), 0o644) }); err != nil {
		t.Fatal(err)
	}
	err = e.remote.Do(func(ns.NetNS) error {
		// A router: forwarding on, and no way to the pods but through NAT.
		for f, v := range map[string]string{"/proc/sys/net/ipv4/ip_forward": "1", "/proc/sys/net/ipv6/conf/all/forwarding": "1", noDAD: "0"} {
			if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
				return err
			}
		}
		for _, gw := range []net.IP{uplinkIP4, uplinkIP6} {
			if err := netlink.RouteDel(&netlink.Route{Gw: gw}); err != nil {
				return fmt.Errorf("delete the route via %s: %w", gw, err)
			}
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth1", MTU: farMTU}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(far.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		l, err := netlink.LinkByName("eth1")
		if err != nil {
			return err
		}
		if err := addr(l, farRouter[4], 24); err != nil {
			return err
		}
		if err := addr(l, farRouter[6], 64); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatalf("router: %v", err)
	}
	err = far.Do(func(ns.NetNS) error {
		lo, _ := netlink.LinkByName("lo")
		netlink.LinkSetUp(lo)
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMTU(l, farMTU); err != nil {
			return err
		}
		if err := addr(l, farIP[4], 24); err != nil {
			return err
		}
		if err := addr(l, farIP[6], 64); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		for fam, mss := range map[int]int{4: 1460, 6: 1440} {
			r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: farRouter[fam], AdvMSS: mss}
			if err := netlink.RouteAdd(r); err != nil {
				return fmt.Errorf("default route via %s: %w", farRouter[fam], err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("far host: %v", err)
	}
	for _, fam := range []int{4, 6} {
		routeVia(t, e.Node, "", remoteIP[fam])
		// The lab works, and its neighbours are resolved: a fresh link's
		// IPv6 link-local address (the source of neighbour solicitations
		// for forwarded packets) is tentative for a second or two.
		var err error
		for try := 0; try < 10; try++ {
			if err = testenv.Ping(e.Node, farIP[fam], 1); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("node to far host: %v", err)
		}
	}
	return e, far
}

// TestNATICMPErrors: ICMP errors about translated flows reach the host that
// sent the packet, through masquerade and hostPort, IPv4 and IPv6: 2 MB
// transfers across the 1280-byte link complete both from a masquerading pod
// to the far host and from the pod to a far client of its hostPort (each
// needs the router's "fragmentation needed" / "packet too big" to reach the
// pod); traceroute's time exceeded reaches the pod (UDP and ICMP echo
// probes); a port unreachable reaches the pod (masquerade), and the pod's
// own reaches the far host (about a hostPort flow, and about a reply of a
// masqueraded flow). dump nat and dump ct count them.
func TestNATICMPErrors(t *testing.T) {
	t.Parallel()
	e, far := newPMTULab(t)
	// Two pods: a pod's kernel remembers a path MTU per destination, and
	// the far host is both pods' peer.
	p, h := e.NewPod(), e.NewPod()
	e.CleanupDel(p, "p")
	testenv.PodIPs(t, e.Add(p, "p")) // dual-stack
	testenv.PodIPs(t, e.MustAddHP(h, "h", testenv.PM{HostPort: 8090, ContainerPort: 80, Protocol: "tcp"},
		testenv.PM{HostPort: 8091, ContainerPort: 5301, Protocol: "udp"})) // nobody listens on 5301
	const size = 2 << 20

	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("masq-pmtu/ipv%d", fam), func(t *testing.T) {
			start := time.Now()
			if err := testenv.TCPTransfer(p, far, farIP[fam], size); err != nil {
				t.Fatalf("2 MB from the masquerading pod to %s across the %d-byte link: %v", farIP[fam], farMTU, err)
			}
			t.Logf("2 MB in %v", time.Since(start))
		})
		t.Run(fmt.Sprintf("hostport-pmtu/ipv%d", fam), func(t *testing.T) {
			start := time.Now()
			if err := tcpPull(far, h, 80, hp(uplinkIP[fam], 8090), size); err != nil {
				t.Fatalf("2 MB from the pod to a far client of its hostPort %s: %v", hp(uplinkIP[fam], 8090), err)
			}
			t.Logf("2 MB in %v", time.Since(start))
		})
		t.Run(fmt.Sprintf("traceroute/ipv%d", fam), func(t *testing.T) {
			// Hop limit 2: the node forwards it, the router finds it expired.
			got, err := udpProbe(p, hp(farIP[fam], 33434), 2)
			if err != nil {
				t.Fatal(err)
			}
			wantType := map[int]uint8{4: 11, 6: 3}[fam]
			if got.typ != wantType || !got.offender.Equal(remoteIP[fam]) {
				t.Fatalf("UDP probe with hop limit 2: ICMP type %d from %s, want time exceeded (%d) from the router %s", got.typ, got.offender, wantType, remoteIP[fam])
			}
			out, err := pingTTL(p, farIP[fam], 2)
			if !strings.Contains(out, "exceeded") || !strings.Contains(out, remoteIP[fam].String()) {
				t.Fatalf("ping with hop limit 2 (%v): want time exceeded from %s:\n%s", err, remoteIP[fam], out)
			}
		})
		t.Run(fmt.Sprintf("port-unreachable-to-pod/ipv%d", fam), func(t *testing.T) {
			if err := udpRefused(p, nil, hp(farIP[fam], 5999)); err != nil {
				t.Fatalf("masqueraded UDP to a closed port of the far host: %v", err)
			}
		})
		t.Run(fmt.Sprintf("port-unreachable-from-pod-hostport/ipv%d", fam), func(t *testing.T) {
			if err := udpRefused(far, nil, hp(uplinkIP[fam], 8091)); err != nil {
				t.Fatalf("UDP to hostPort 8091, whose pod port 5301 is closed: %v", err)
			}
		})
		t.Run(fmt.Sprintf("port-unreachable-from-pod-masq/ipv%d", fam), func(t *testing.T) {
			// The pod asks the far host from a port it then closes; the far
			// host's answer to the node's port gets the pod's port unreachable.
			var ln *net.UDPConn
			err := far.Do(func(ns.NetNS) error {
				var err error
				ln, err = net.ListenUDP("udp", &net.UDPAddr{IP: farIP[fam], Port: 6000})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			err = p.Do(func(ns.NetNS) error {
				c, err := net.Dial("udp", hp(farIP[fam], 6000))
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte("hello"))
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			ln.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, from, err := ln.ReadFromUDP(make([]byte, 64))
			ln.Close()
			if err != nil {
				t.Fatalf("the far host got nothing from the pod: %v", err)
			}
			if !from.IP.Equal(uplinkIP[fam]) {
				t.Fatalf("the far host saw the pod as %s, want the node's %s", from, uplinkIP[fam])
			}
			if err := udpRefused(far, &net.UDPAddr{IP: farIP[fam], Port: 6000}, from.String()); err != nil {
				t.Fatalf("the far host's answer to %s (the pod's closed port): %v", from, err)
			}
		})
	}
	t.Run("node-error-about-reply", func(t *testing.T) {
		// The pod advertises the MSS of a 1500-byte path, so the router
		// (on the node's 1500-byte link) sends it 1500-byte segments: the
		// node reports "fragmentation needed" / "packet too big" (the pod's
		// MTU is smaller) quoting the pod's address, which only the node's
		// address and port mean anything to the router.
		podAdvMSS(t, p, map[int]int{4: 1460, 6: 1440})
		serveBytes := func(fam int) error { return tcpPull(p, e.remote, 7100+fam, hp(remoteIP[fam], 7100+fam), size) }
		for _, fam := range []int{4, 6} {
			if err := serveBytes(fam); err != nil {
				t.Errorf("IPv%d: 2 MB from the router to the masquerading pod (MTU %d): %v", fam, podMTU, err)
			}
		}
	})
	t.Run("counters", func(t *testing.T) {
		var nat inspect.NATDump
		var ct inspect.CTDump
		for what, into := range map[string]any{"nat": &nat, "ct": &ct} {
			js, err := e.MasqAgent("dump", what, "-o", "json")
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(js, into); err != nil {
				t.Fatalf("dump %s: %v", what, err)
			}
		}
		// Per family: a frag-needed / packet too big or more, two time
		// exceeded, a port unreachable in; a port unreachable and a
		// fragmentation needed / packet too big out.
		if nat.Counters["icmp_error_in"] < 8 || nat.Counters["icmp_error_out"] < 4 {
			t.Errorf("dump nat counters %v, want icmp_error_in >= 8 and icmp_error_out >= 4", nat.Counters)
		}
		if ct.Counters["icmp_error_in"] < 2 || ct.Counters["icmp_error_out"] < 2 {
			t.Errorf("dump ct counters %v, want icmp_error_in and icmp_error_out >= 2", ct.Counters)
		}
		t.Logf("dump nat counters %v; dump ct counters %v", nat.Counters, ct.Counters)
	})
	e.MustDel(p, "p")
	e.MustDel(h, "h")
	e.AssertNoHostPorts()
}

// podAdvMSS makes the pod's default routes advertise a TCP MSS per family.
func podAdvMSS(t *testing.T, pod ns.NetNS, mss map[int]int) {
	t.Helper()
	err := pod.Do(func(ns.NetNS) error {
		for fam, v := range mss {
			f := map[int]int{4: netlink.FAMILY_V4, 6: netlink.FAMILY_V6}[fam]
			// Every table: the pod's routes may live in its interface's.
			rs, err := netlink.RouteListFiltered(f, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return err
			}
			for _, r := range rs {
				if (r.Dst == nil || isDefault(r.Dst)) && r.Gw != nil {
					r.AdvMSS = v
					if err := netlink.RouteReplace(&r); err != nil {
						return fmt.Errorf("advmss on %v: %w", r, err)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func isDefault(n *net.IPNet) bool { ones, _ := n.Mask.Size(); return ones == 0 }

// tcpPull serves n random bytes from a listener on port in server and
// reads them from client, which dials addr.
func tcpPull(client, server ns.NetNS, port int, addr string, n int) error {
	// An explicit family: Go probes IPv6 support once per process, maybe in
	// a netns without it, and "tcp" would then listen on IPv4 only.
	fam := "tcp4"
	if h, _, _ := net.SplitHostPort(addr); net.ParseIP(h).To4() == nil {
		fam = "tcp6"
	}
	var ln net.Listener
	err := server.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen(fam, fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		return err
	}
	defer ln.Close()
	payload := make([]byte, n)
	rand.Read(payload)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		c.Write(payload)
	}()
	var got []byte
	err = client.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		got, err = io.ReadAll(c)
		return err
	})
	if err != nil {
		return fmt.Errorf("after %d of %d bytes: %w", len(got), n, err)
	}
	if !bytes.Equal(got, payload) {
		return fmt.Errorf("received %d bytes, want the %d sent", len(got), n)
	}
	return nil
}

// icmpReport is an ICMP error a socket got (IP_RECVERR).
type icmpReport struct {
	typ, code uint8
	offender  net.IP
}

// udpProbe sends a UDP datagram with the given hop limit from netns to addr
// and returns the ICMP error its socket's error queue gets, traceroute's way.
func udpProbe(netns ns.NetNS, addr string, hops int) (icmpReport, error) {
	var rep icmpReport
	err := netns.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		v6 := c.RemoteAddr().(*net.UDPAddr).IP.To4() == nil
		raw, _ := c.(*net.UDPConn).SyscallConn()
		var serr error
		raw.Control(func(fd uintptr) {
			if v6 {
				serr = errors.Join(unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1),
					unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, hops))
			} else {
				serr = errors.Join(unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVERR, 1),
					unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TTL, hops))
			}
		})
		if serr != nil {
			return serr
		}
		for try := 0; try < 3; try++ {
			c.Write([]byte("probe"))
			deadline := time.Now().Add(time.Second)
			for time.Now().Before(deadline) {
				var got bool
				raw.Read(func(fd uintptr) bool {
					oob := make([]byte, 512)
					_, oobn, _, _, err := unix.Recvmsg(int(fd), make([]byte, 64), oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
					if err == nil {
						rep, got = parseRecvErr(oob[:oobn])
					}
					return true
				})
				if got {
					return nil
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		return fmt.Errorf("no ICMP error reached the socket")
	})
	return rep, err
}

// parseRecvErr decodes a sock_extended_err and its offender address.
func parseRecvErr(oob []byte) (icmpReport, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return icmpReport{}, false
	}
	for _, m := range msgs {
		if !(m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_RECVERR) &&
			!(m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_RECVERR) || len(m.Data) < 16 {
			continue
		}
		origin := m.Data[4]
		if origin != unix.SO_EE_ORIGIN_ICMP && origin != unix.SO_EE_ORIGIN_ICMP6 {
			continue
		}
		rep := icmpReport{typ: m.Data[5], code: m.Data[6]}
		off := m.Data[16:]
		switch {
		case len(off) >= 8 && binary.NativeEndian.Uint16(off) == unix.AF_INET:
			rep.offender = net.IP(append([]byte(nil), off[4:8]...))
		case len(off) >= 24 && binary.NativeEndian.Uint16(off) == unix.AF_INET6:
			rep.offender = net.IP(append([]byte(nil), off[8:24]...))
		}
		return rep, true
	}
	return icmpReport{}, false
}

// pingTTL pings once with a hop limit and returns ping's output.
func pingTTL(netns ns.NetNS, ip net.IP, hops int) (string, error) {
	var out []byte
	err := netns.Do(func(ns.NetNS) error {
		args := []string{"-c", "1", "-W", "2", "-t", fmt.Sprint(hops), ip.String()}
		if ip.To4() == nil {
			args = append([]string{"-6"}, args...)
		}
		var err error
		out, err = exec.Command("ping", args...).CombinedOutput()
		return err
	})
	return string(out), err
}

// udpRefused sends from a UDP socket connected to addr (from local, or any
// port) and wants ECONNREFUSED: an ICMP port unreachable reached it.
func udpRefused(netns ns.NetNS, local *net.UDPAddr, addr string) error {
	return netns.Do(func(ns.NetNS) error {
		raddr, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return err
		}
		c, err := net.DialUDP("udp", local, raddr)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		for try := 0; try < 3; try++ {
			c.Write([]byte("anyone?"))
			c.SetReadDeadline(time.Now().Add(time.Second))
			_, err := c.Read(buf)
			if errors.Is(err, syscall.ECONNREFUSED) {
				return nil
			}
			if err == nil {
				return fmt.Errorf("an answer came")
			}
		}
		return fmt.Errorf("no port unreachable reached the socket")
	})
}
