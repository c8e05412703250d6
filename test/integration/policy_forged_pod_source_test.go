package integration

import (
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// sendForged sends one UDP datagram from netns with the source address and
// port given, which need not be its own (IP_TRANSPARENT: root forging).
func sendForged(t *testing.T, netns ns.NetNS, src *net.UDPAddr, dst *net.UDPAddr, msg string) {
	t.Helper()
	must(t, netns.Do(func(ns.NetNS) error {
		fam, level, opt := unix.AF_INET, unix.SOL_IP, unix.IP_TRANSPARENT
		if src.IP.To4() == nil {
			fam, level, opt = unix.AF_INET6, unix.SOL_IPV6, unix.IPV6_TRANSPARENT
		}
		fd, err := unix.Socket(fam, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, level, opt, 1); err != nil {
			return err
		}
		sa := func(a *net.UDPAddr) unix.Sockaddr {
			if ip4 := a.IP.To4(); ip4 != nil {
				s := &unix.SockaddrInet4{Port: a.Port}
				copy(s.Addr[:], ip4)
				return s
			}
			s := &unix.SockaddrInet6{Port: a.Port}
			copy(s.Addr[:], a.IP.To16())
			return s
		}
		if err := unix.Bind(fd, sa(src)); err != nil {
			return err
		}
		return unix.Sendto(fd, []byte(msg), 0, sa(dst))
	}))
}

// TestPolicyForgedPodSourceFromOutside: h lets in UDP from pod b only. A
// host outside the node forges b's address as its source: b's address
// can only come from b's host veth, so such a datagram is a forgery
// wherever it enters (through h's hostPort, redirected straight into h,
// or to h's address through the stack; IPv6 has no reverse-path filter
// and Linux's IPv4 one is off by default in a netns, loose on most
// distributions). h must not get it. b listens on the forged port: h's
// answer, sent to b, says h took the datagram.
func TestPolicyForgedPodSourceFromOutside(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	for _, pod := range []string{"a", "b"} {
		p.apply(t, pod, policy.Endpoint{})
	}
	p.apply(t, "h", policy.Endpoint{Ingress: isolated(allowAll(host(ip("b", 4))), allowAll(host(ip("b", 6))))})
	for _, fam := range []int{4, 6} {
		reach(t, p.b, "udp", ip("h", fam), 80, "h") // b itself: allowed
		blocked(t, p.remote, "udp", ip("h", fam), 80)
	}
	const port = 5555
	for _, fam := range []int{4, 6} {
		var lnb *net.UDPConn
		must(t, p.b.Do(func(ns.NetNS) error {
			var err error
			lnb, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip("b", fam), Port: port})
			return err
		}))
		for _, dst := range []*net.UDPAddr{{IP: uplinkIP[fam], Port: hostPortH}, {IP: ip("h", fam), Port: 80}} {
			marker := "forged-to-" + dst.String()
			for i := 0; i < 3; i++ {
				sendForged(t, p.remote, &net.UDPAddr{IP: ip("b", fam), Port: port}, dst, marker)
			}
			lnb.SetReadDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 512)
			if n, from, err := lnb.ReadFromUDP(buf); err == nil {
				t.Errorf("IPv%d: a datagram forged from outside with b's source to %s reached h, which answered b from %s: %q", fam, dst, from, buf[:n])
				for lnb.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); ; {
					if _, _, err := lnb.ReadFromUDP(buf); err != nil {
						break
					}
				}
			}
		}
		lnb.Close()
	}
}
