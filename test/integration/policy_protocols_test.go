// What a NetworkPolicy rule naming TCP ports does not allow (SCTP and an
// unknown protocol to the same port, UDP to a TCP-only port), what IPv4
// options cannot hide, and a rule set of thousands of peers: raw IP packets
// sent from and to pods.

package integration

import (
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// rawIPSend sends payload as protocol proto from netns to dst over a raw
// socket (the kernel writes the IP header).
func rawIPSend(t *testing.T, netns ns.NetNS, dst net.IP, proto int, payload []byte) {
	t.Helper()
	must(t, netns.Do(func(ns.NetNS) error {
		var (
			fd  int
			err error
			sa  syscall.Sockaddr
		)
		if dst.To4() != nil {
			fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, proto)
			a := &syscall.SockaddrInet4{}
			copy(a.Addr[:], dst.To4())
			sa = a
		} else {
			fd, err = syscall.Socket(syscall.AF_INET6, syscall.SOCK_RAW, proto)
			a := &syscall.SockaddrInet6{}
			copy(a.Addr[:], dst.To16())
			sa = a
		}
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		for i := 0; i < 3; i++ {
			if err := syscall.Sendto(fd, payload, 0, sa); err != nil {
				return err
			}
		}
		return nil
	}))
}

// rawListen opens a raw socket of protocol proto in netns.
func rawListen(t *testing.T, netns ns.NetNS, fam, proto int) int {
	t.Helper()
	var fd int
	must(t, netns.Do(func(ns.NetNS) error {
		var err error
		if fam == 4 {
			fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, proto)
		} else {
			fd, err = syscall.Socket(syscall.AF_INET6, syscall.SOCK_RAW, proto)
		}
		return err
	}))
	t.Cleanup(func() { syscall.Close(fd) })
	tv := syscall.NsecToTimeval(int64(300 * time.Millisecond))
	must(t, syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv))
	return fd
}

// TestPolicyAttackProtocols: what a rule naming TCP ports does not allow
// (SCTP and an unknown protocol to the same port, UDP to a TCP-only DNS
// port), what IPv4 options cannot hide, and a rule set of thousands of
// peers.
func TestPolicyAttackProtocols(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	fams := []int{4, 6}
	for _, pod := range []string{"a", "b", "h"} {
		p.apply(t, pod, policy.Endpoint{})
	}

	// The control: b open, the raw packets get there. From h: a flow b
	// allowed while open outlives the policy below (docs/networkpolicy.md,
	// Flows), and protocol 253 has no ports, so a's would be that flow.
	for _, fam := range fams {
		fd := rawListen(t, p.b, fam, 253)
		marker := []byte(fmt.Sprintf("control-v%d", fam))
		rawIPSend(t, p.h, ip("b", fam), 253, marker)
		if !rawSaw(fd, marker, 2*time.Second) {
			t.Fatalf("IPv%d: protocol 253 from h did not reach b, open", fam)
		}
	}
	// b lets a in on TCP 53 only.
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(allowPorts(host(ip("a", 4)), policy.ProtoTCP, 53, 53),
		allowPorts(host(ip("a", 6)), policy.ProtoTCP, 53, 53))})
	t.Run("other-protocols-to-an-allowed-tcp-port", func(t *testing.T) {
		for _, fam := range fams {
			for _, proto := range []int{syscall.IPPROTO_SCTP, 253} {
				fd := rawListen(t, p.b, fam, proto)
				marker := []byte(fmt.Sprintf("proto-%d-v%d", proto, fam))
				// An SCTP common header (ports 5000 -> 53), then the marker.
				pkt := append([]byte{0x13, 0x88, 0, 53, 0, 0, 0, 0, 0, 0, 0, 0}, marker...)
				rawIPSend(t, p.a, ip("b", fam), proto, pkt)
				if rawSaw(fd, marker, time.Second) {
					t.Errorf("IPv%d: protocol %d to port 53 reached b, whose rule names TCP 53 only", fam, proto)
				}
			}
			reach(t, p.a, "tcp", ip("b", fam), 53, "dns")
			blocked(t, p.a, "udp", ip("b", fam), 53)
		}
	})

	// a may send to b TCP 53 only (DNS over TCP): UDP 53 stays denied,
	// to b and through the DNS Service.
	p.apply(t, "b", policy.Endpoint{})
	p.apply(t, "a", policy.Endpoint{Egress: isolated(allowPorts(host(ip("b", 4)), policy.ProtoTCP, 53, 53),
		allowPorts(host(ip("b", 6)), policy.ProtoTCP, 53, 53))})
	t.Run("udp-dns-when-only-tcp-dns-is-allowed", func(t *testing.T) {
		for _, fam := range fams {
			reach(t, p.a, "tcp", ip("b", fam), 53, "dns")
			blocked(t, p.a, "udp", ip("b", fam), 53)
			blocked(t, p.a, "udp", svcDNS[fam], 53)
		}
	})
	p.apply(t, "a", policy.Endpoint{})

	// IPv4 options push the TCP header back: b lets a in on TCP 53 only,
	// a dials 8080 with options.
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(allowPorts(host(ip("a", 4)), policy.ProtoTCP, 53, 53))})
	t.Run("ipv4-options", func(t *testing.T) {
		dial := func(port int) error {
			return p.a.Do(func(ns.NetNS) error {
				d := net.Dialer{Timeout: 700 * time.Millisecond, Control: func(_, _ string, rc syscall.RawConn) error {
					var serr error
					err := rc.Control(func(fd uintptr) {
						// Four NOPs: the header grows to 24 bytes.
						serr = syscall.SetsockoptString(int(fd), syscall.IPPROTO_IP, syscall.IP_OPTIONS, "\x01\x01\x01\x01")
					})
					if err != nil {
						return err
					}
					return serr
				}}
				c, err := d.Dial("tcp4", hp(ip("b", 4), port))
				if err == nil {
					c.Close()
				}
				return err
			})
		}
		if err := dial(53); err != nil {
			t.Errorf("a to b:53 with IPv4 options: %v, want it allowed", err)
		}
		if err := dial(8080); err == nil {
			t.Errorf("a reached b:8080 with IPv4 options, which b's ingress denies")
		}
	})

	// b's ingress names 3000 peers per family, a among them, h not.
	var allows []policy.Allow
	for i := 0; i < 3000; i++ {
		allows = append(allows, allowPorts(prefix(fmt.Sprintf("172.%d.%d.%d/32", 16+i/65536, i/256%256, i%256)), policy.ProtoTCP, 8080, 8080),
			allowPorts(prefix(fmt.Sprintf("fd00:99::%x/128", i+1)), policy.ProtoTCP, 8080, 8080))
	}
	allows = append(allows, allowPorts(host(ip("a", 4)), policy.ProtoTCP, 8080, 8080), allowPorts(host(ip("a", 6)), policy.ProtoTCP, 8080, 8080))
	start := time.Now()
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(allows...)})
	t.Logf("Apply of %d peers: %v", len(allows), time.Since(start))
	t.Run("thousands-of-peers", func(t *testing.T) {
		for _, fam := range fams {
			reach(t, p.a, "tcp", ip("b", fam), 8080, "b")
			blocked(t, p.h, "tcp", ip("b", fam), 8080)
		}
		pp, ok, err := p.m.Policy().Read(int(p.idx["b"]))
		if err != nil || !ok || len(pp.Ingress.Allows) != len(allows) {
			t.Errorf("programmed: %d allows, %v, %v; want %d", len(pp.Ingress.Allows), ok, err, len(allows))
		}
	})
}
