// Hostile review of the NetworkPolicy datapath (issue 23): a pod or a host
// on the wire trying to get around a pod's isolation, or a pod denied egress
// getting its packets out anyway.

package integration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// rawICMPListen opens a raw ICMP (fam 4) or ICMPv6 socket in netns: it gets
// a copy of every such packet the netns receives.
func rawICMPListen(t *testing.T, netns ns.NetNS, fam int) int {
	t.Helper()
	var fd int
	err := netns.Do(func(ns.NetNS) error {
		var err error
		if fam == 4 {
			fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_ICMP)
		} else {
			fd, err = syscall.Socket(syscall.AF_INET6, syscall.SOCK_RAW, syscall.IPPROTO_ICMPV6)
		}
		return err
	})
	if err != nil {
		t.Fatalf("raw ICMP socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	tv := syscall.NsecToTimeval(int64(300 * time.Millisecond))
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return fd
}

// rawSaw reads fd for up to d and tells whether a packet carrying marker came.
func rawSaw(fd int, marker []byte, d time.Duration) bool {
	buf := make([]byte, 4096)
	for end := time.Now().Add(d); time.Now().Before(end); {
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err == nil && bytes.Contains(buf[:n], marker) {
			return true
		}
	}
	return false
}

// icmpErrorCarrying is forgedUnreach's error quoting src:sport -> dst:dport,
// with data appended to the quote: what a pod would smuggle out in it.
func icmpErrorCarrying(src net.IP, sport int, dst net.IP, dport int, data []byte) []byte {
	m := append(forgedUnreach(src, sport, dst, dport), data...)
	if src.To4() != nil {
		m[2], m[3] = 0, 0
		binary.BigEndian.PutUint16(m[2:], csum16(m))
	}
	return m
}

// sendBigUDP sends one datagram of size bytes (fragmented on a 1500-byte link)
// from netns, from src (port 0: any) to dst.
func sendBigUDP(t *testing.T, netns ns.NetNS, src *net.UDPAddr, dst *net.UDPAddr, size int, marker string) {
	t.Helper()
	must(t, netns.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp", src, dst)
		if err != nil {
			return err
		}
		defer c.Close()
		b := bytes.Repeat([]byte{'x'}, size)
		copy(b, marker)
		_, err = c.Write(b)
		return err
	}))
}

// bigReceived tells whether ln gets a datagram starting with marker within d.
func bigReceived(ln *net.UDPConn, marker string, d time.Duration) bool {
	buf := make([]byte, 65536)
	ln.SetReadDeadline(time.Now().Add(d))
	for {
		n, _, err := ln.ReadFromUDP(buf)
		if err != nil {
			return false
		}
		if strings.HasPrefix(string(buf[:n]), marker) {
			return true
		}
	}
}

// TestPolicyAttack: attacks on the NetworkPolicy datapath, each a packet
// that must not get where it goes.
func TestPolicyAttack(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	fams := []int{4, 6}

	// Pending (ADD done, nothing applied yet): a's packets go nowhere but
	// to its replies of the node's traffic: not off the node (judged in
	// to_uplink after the stack), not to the node, not through a Service.
	t.Run("pending-egress", func(t *testing.T) {
		serve(t, p.Node, 9091, "node")
		for _, fam := range fams {
			blocked(t, p.a, "tcp", remoteIP[fam], 7000)
			blocked(t, p.a, "udp", remoteIP[fam], 7000)
			blocked(t, p.a, "tcp", nodeIP[fam], 9091)
			blocked(t, p.a, "tcp", svcWeb[fam], 80)
			reach(t, p.Node, "tcp", ip("a", fam), 8080, "a")
		}
	})

	for _, pod := range []string{"a", "b", "h"} {
		p.apply(t, pod, policy.Endpoint{})
	}

	// A runtime retrying the ADD of a live pod is refused, and the pod's
	// programmed policy stays: the retry must not leave it pending (the
	// agent would not know to program it again).
	t.Run("retried-add-keeps-policy", func(t *testing.T) {
		if _, err := p.AddV("1.1.0", p.a, "a", "eth0"); err == nil {
			t.Fatal("a second ADD of a live pod succeeded")
		}
		st, ok, err := p.m.Policy().StateOf(int(p.idx["a"]))
		if err != nil || !ok || st.Mode != [2]uint8{maps.PolicyOpen, maps.PolicyOpen} {
			t.Errorf("a's state after a refused ADD: %+v %v %v, want open both ways", st, ok, err)
		}
		for _, fam := range fams {
			reach(t, p.b, "tcp", ip("a", fam), 8080, "a")
		}
	})

	// a lets in UDP from pod p1 only. p1 talks to a, then is deleted; its
	// IPv4 address goes to a new pod q, which a's policy does not name.
	// q sending from p1's port must not ride p1's flow entry in a's table
	// (Cilium scrubs a deleted endpoint's addresses from its conntrack).
	t.Run("dead-pods-flows-not-inherited", func(t *testing.T) {
		p1 := p.NewPod()
		p.CleanupDel(p1, "p1")
		ip1, _ := resultIPs(p.Add(p1, "p1"))
		_, idx1 := p.HostVeth("p1")
		if err := p.w.Apply(uint32(idx1), policy.Endpoint{}); err != nil {
			t.Fatal(err)
		}
		ln := udpSocket(t, p.a, ip("a", 4))
		port := ln.LocalAddr().(*net.UDPAddr).Port
		p.apply(t, "a", policy.Endpoint{Ingress: isolated(allowPorts(host(ip1), policy.ProtoUDP, uint16(port), uint16(port)))})
		defer p.apply(t, "a", policy.Endpoint{})
		send := func(pod ns.NetNS, src net.IP, msg string) {
			must(t, pod.Do(func(ns.NetNS) error {
				c, err := net.DialUDP("udp", &net.UDPAddr{IP: src, Port: 5555}, &net.UDPAddr{IP: ip("a", 4), Port: port})
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte(msg))
				return err
			}))
		}
		send(p1, ip1, "from-p1")
		if !bigReceived(ln, "from-p1", 2*time.Second) {
			t.Fatal("p1's datagram, allowed, did not reach a")
		}
		must(t, p.Del(p1, "p1", "eth0"))
		// The agent follows: p1 is gone, a's rule with it.
		p.apply(t, "a", policy.Endpoint{Ingress: isolated()})
		// q gets p1's address (a one-address range), and is programmed open.
		p.IPAM = map[string]any{"type": "host-local", "dataDir": t.TempDir(),
			"ranges": [][]map[string]string{{{"subnet": "10.250.0.0/24", "rangeStart": ip1.String(), "rangeEnd": ip1.String()}}}}
		defer func() { p.IPAM = nil }()
		q := p.NewPod()
		p.CleanupDel(q, "q")
		if got, _ := resultIPs(p.Add(q, "q")); !got.Equal(ip1) {
			t.Fatalf("q got %s, want p1's %s", got, ip1)
		}
		_, qidx := p.HostVeth("q")
		if err := p.w.Apply(uint32(qidx), policy.Endpoint{}); err != nil {
			t.Fatal(err)
		}
		send(q, ip1, "from-q")
		if bigReceived(ln, "from-q", time.Second) {
			t.Errorf("q, with dead p1's address, reached a through p1's flow: a's policy allows nobody")
		}
	})

	// a may send only to b, TCP 8080. With a connection to b open, it
	// sends h (which a may not reach) an ICMP error quoting a segment of
	// that connection, carrying whatever it likes: the error is "about a
	// flow of the pod", but it goes to a host the flow has nothing to do
	// with. Linux conntrack takes an error as related only when its outer
	// destination is the quoted packet's source (nf_conntrack_inet_error);
	// an error a pod sends goes back to the sender of what it quotes.
	t.Run("icmp-error-to-a-denied-peer", func(t *testing.T) {
		p.apply(t, "a", policy.Endpoint{Egress: isolated(allowPorts(host(ip("b", 4)), policy.ProtoTCP, 8080, 8080),
			allowPorts(host(ip("b", 6)), policy.ProtoTCP, 8080, 8080))})
		defer p.apply(t, "a", policy.Endpoint{})
		for i, fam := range fams {
			lport := 40111 + i
			var c net.Conn
			must(t, p.a.Do(func(ns.NetNS) error {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip("a", fam), Port: lport}, Timeout: 2 * time.Second}
				var err error
				c, err = d.Dial("tcp", hp(ip("b", fam), 8080))
				return err
			}))
			defer c.Close()
			fd := rawICMPListen(t, p.h, fam)
			marker := []byte(fmt.Sprintf("exfiltrated-v%d", fam))
			sendICMP(t, p.a, ip("h", fam), icmpErrorCarrying(ip("b", fam), 8080, ip("a", fam), lport, marker), 3)
			if rawSaw(fd, marker, time.Second) {
				t.Errorf("IPv%d: a's ICMP error quoting its flow with b reached h, which a's egress denies", fam)
			}
			// The same error to b, the quoted packet's sender, is a's to send.
			fdb := rawICMPListen(t, p.b, fam)
			sendICMP(t, p.a, ip("b", fam), icmpErrorCarrying(ip("b", fam), 8080, ip("a", fam), lport, marker), 3)
			if !rawSaw(fdb, marker, 2*time.Second) {
				t.Errorf("IPv%d: a's ICMP error about b's segment did not reach b", fam)
			}
		}
	})

	// a isolated for ingress, egress open: it sends b a datagram large
	// enough to be fragmented. b then sends a fragmented datagram to a
	// port a's ingress does not allow: it must not get in. An IPv6
	// fragment header ahead of the transport header must not make every
	// fragmented packet between a and b one flow.
	t.Run("fragments-after-a-fragmented-send", func(t *testing.T) {
		p.apply(t, "a", policy.Endpoint{Ingress: isolated()})
		defer p.apply(t, "a", policy.Endpoint{})
		for _, fam := range fams {
			ln := udpSocket(t, p.a, ip("a", fam))
			port := ln.LocalAddr().(*net.UDPAddr).Port
			sendBigUDP(t, p.a, &net.UDPAddr{IP: ip("a", fam)}, &net.UDPAddr{IP: ip("b", fam), Port: 8080}, 3000, "from-a")
			time.Sleep(100 * time.Millisecond)
			marker := fmt.Sprintf("fragmented-into-a-v%d", fam)
			sendBigUDP(t, p.b, &net.UDPAddr{IP: ip("b", fam), Port: 9999}, &net.UDPAddr{IP: ip("a", fam), Port: port}, 3000, marker)
			if bigReceived(ln, marker, time.Second) {
				t.Errorf("IPv%d: b's fragmented datagram reached a's port %d, which a's ingress denies", fam, port)
			}
			for _, f := range flowsOf(t, p, "a") {
				if f.Proto == syscall.IPPROTO_FRAGMENT {
					t.Errorf("IPv%d: a flow entry keyed on the fragment header: %+v", fam, f)
				}
			}
		}
	})

	// The same with a destination options header before UDP (IPv6): a
	// sends b one, then b sends a such a datagram to a port a's ingress
	// denies. A flow keyed on the options header's number would let it in.
	t.Run("ipv6-destination-options", func(t *testing.T) {
		p.apply(t, "a", policy.Endpoint{Ingress: isolated()})
		defer p.apply(t, "a", policy.Endpoint{})
		ln := udpSocket(t, p.a, ip("a", 6))
		port := ln.LocalAddr().(*net.UDPAddr).Port
		withOpts := func(pod ns.NetNS, src, dst *net.UDPAddr, msg string) {
			must(t, pod.Do(func(ns.NetNS) error {
				c, err := net.DialUDP("udp6", src, dst)
				if err != nil {
					return err
				}
				defer c.Close()
				rc, err := c.SyscallConn()
				if err != nil {
					return err
				}
				var serr error
				// Next header (the kernel's), length 0, PadN of 4.
				rc.Control(func(fd uintptr) {
					serr = syscall.SetsockoptString(int(fd), syscall.IPPROTO_IPV6, unix.IPV6_DSTOPTS, "\x00\x00\x01\x04\x00\x00\x00\x00")
				})
				if serr != nil {
					return fmt.Errorf("IPV6_DSTOPTS: %w", serr)
				}
				_, err = c.Write([]byte(msg))
				return err
			}))
		}
		withOpts(p.a, &net.UDPAddr{IP: ip("a", 6)}, &net.UDPAddr{IP: ip("b", 6), Port: 8080}, "from-a")
		time.Sleep(100 * time.Millisecond)
		withOpts(p.b, &net.UDPAddr{IP: ip("b", 6), Port: 9998}, &net.UDPAddr{IP: ip("a", 6), Port: port}, "dstopts-into-a")
		if bigReceived(ln, "dstopts-into-a", time.Second) {
			t.Errorf("b's datagram behind a destination options header reached a's port %d, which a's ingress denies", port)
		}
		for _, f := range flowsOf(t, p, "a") {
			if f.Proto == syscall.IPPROTO_DSTOPTS {
				t.Errorf("a flow entry keyed on the destination options header: %+v", f)
			}
		}
	})

	// h isolated for ingress: a host on the uplink's link sends its
	// hostPort a datagram from an IPv6 link-local address. Only the
	// node's own link-local traffic is link scope for a pod.
	t.Run("hostport-from-a-link-local-source", func(t *testing.T) {
		p.apply(t, "h", policy.Endpoint{Ingress: isolated()})
		defer p.apply(t, "h", policy.Endpoint{})
		ll := net.ParseIP("fe80::bad:1")
		must(t, p.remote.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			a, _ := netlink.ParseAddr(ll.String() + "/64")
			a.Flags = unix.IFA_F_NODAD
			return netlink.AddrAdd(l, a)
		}))
		before := p.drops(t, "h", maps.DirIngress)
		must(t, p.remote.Do(func(ns.NetNS) error {
			c, err := net.DialUDP("udp", &net.UDPAddr{IP: ll, Zone: "eth0"}, &net.UDPAddr{IP: uplinkIP6, Port: hostPortH})
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("from a link-local source"))
			return err
		}))
		deadline := time.Now().Add(2 * time.Second)
		for p.drops(t, "h", maps.DirIngress) == before && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if p.drops(t, "h", maps.DirIngress) == before {
			t.Errorf("a datagram from a link-local source on the wire reached isolated h through its hostPort undenied")
		}
	})

	// h isolated for ingress: a host on the wire posing as the node (a
	// node address as its source) sends to h's own address, through the
	// stack. The node's pass is for what the node sends.
	t.Run("node-source-forged-on-the-wire", func(t *testing.T) {
		p.apply(t, "h", policy.Endpoint{Ingress: isolated()})
		defer p.apply(t, "h", policy.Endpoint{})
		must(t, p.remote.Do(func(ns.NetNS) error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			for _, a := range []string{nodeIP[4].String() + "/32", nodeIP[6].String() + "/128"} {
				addr, _ := netlink.ParseAddr(a)
				addr.Flags = unix.IFA_F_NODAD
				if err := netlink.AddrAdd(lo, addr); err != nil {
					return err
				}
			}
			return nil
		}))
		defer p.remote.Do(func(ns.NetNS) error {
			lo, _ := netlink.LinkByName("lo")
			for _, a := range []string{nodeIP[4].String() + "/32", nodeIP[6].String() + "/128"} {
				addr, _ := netlink.ParseAddr(a)
				netlink.AddrDel(lo, addr)
			}
			return nil
		})
		for _, fam := range fams {
			ln := udpSocket(t, p.h, ip("h", fam))
			port := ln.LocalAddr().(*net.UDPAddr).Port
			marker := fmt.Sprintf("posing-as-the-node-v%d", fam)
			must(t, p.remote.Do(func(ns.NetNS) error {
				c, err := net.DialUDP("udp", &net.UDPAddr{IP: nodeIP[fam]}, &net.UDPAddr{IP: ip("h", fam), Port: port})
				if err != nil {
					return err
				}
				defer c.Close()
				for i := 0; i < 3; i++ {
					c.Write([]byte(marker))
				}
				return nil
			}))
			if bigReceived(ln, marker, time.Second) {
				t.Errorf("IPv%d: a datagram from the wire with a node address as its source reached isolated h", fam)
			}
		}
	})

	// a may send nothing: the node is no exception when a dials it (only
	// the node's own traffic into a pod is). Neither by its host veth's
	// link-local address nor by an IPv4 link-local address the node holds
	// (node-local DNS's 169.254.20.10, on a dummy link there, on lo here).
	t.Run("egress-to-the-node-by-link-local-addresses", func(t *testing.T) {
		serve(t, p.Node, 9090, "node")
		nodeDNS := net.ParseIP("169.254.20.10").To4()
		must(t, p.InNode(func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			a, _ := netlink.ParseAddr(nodeDNS.String() + "/32")
			return netlink.AddrAdd(lo, a)
		}))
		// Any ADD resyncs the node's addresses, as the agent does on a change.
		c := p.NewPod()
		p.CleanupDel(c, "c")
		p.Add(c, "c")

		p.apply(t, "a", policy.Endpoint{Egress: isolated()})
		defer p.apply(t, "a", policy.Endpoint{})
		for _, fam := range fams {
			blocked(t, p.a, "tcp", nodeIP[fam], 9090) // a node address: judged
		}
		blocked(t, p.a, "tcp", nodeDNS, 9090)
		blocked(t, p.a, "udp", nodeDNS, 9090)
		hostIf, _ := p.HostVeth("a")
		var ll net.IP
		must(t, p.InNode(func() error {
			l, err := netlink.LinkByName(hostIf)
			if err != nil {
				return err
			}
			for end := time.Now().Add(10 * time.Second); ll == nil && time.Now().Before(end); time.Sleep(50 * time.Millisecond) { // DAD, slower on a loaded node
				as, err := netlink.AddrList(l, netlink.FAMILY_V6)
				if err != nil {
					return err
				}
				for _, a := range as {
					if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
						ll = a.IP
					}
				}
			}
			if ll == nil {
				return fmt.Errorf("%s has no usable link-local address", hostIf)
			}
			return nil
		}))
		must(t, p.a.Do(func(ns.NetNS) error {
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(ll.String()+"%eth0", "9090"), 700*time.Millisecond)
			if err == nil {
				conn.Close()
				t.Errorf("a, denied all egress, connected to the node's [%s]:9090 by its host veth's link-local address", ll)
			}
			return nil
		}))
	})
}

// flowsOf lists the policy flow entries of pod's interface.
func flowsOf(t *testing.T, p *polLab, pod string) []maps.PolicyFlow {
	t.Helper()
	fl, err := p.m.Policy().ListFlows()
	must(t, err)
	var out []maps.PolicyFlow
	for _, f := range fl {
		if f.Ifindex == int(p.idx[pod]) {
			out = append(out, f)
		}
	}
	return out
}
