// Packets forged by a host on a node's link: hand-built Ethernet, IPv4/IPv6,
// UDP and TCP headers (checksums included), sent with AF_PACKET from a
// netns the test made, with any source address the attacker likes.

package integration

import (
	"encoding/binary"
	"net"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TCP flags of forged segments.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
)

// l4Frame builds an Ethernet frame carrying an IPv4 or IPv6 packet (by the
// family of sip) around l4, whose checksum (at csumOff; -1: none) is
// computed over the pseudo header.
func l4Frame(src, dst net.HardwareAddr, sip, dip net.IP, proto byte, l4 []byte, csumOff int) []byte {
	l4 = append([]byte{}, l4...)
	var ps []byte
	if sip.To4() != nil {
		ps = append(append(append([]byte{}, sip.To4()...), dip.To4()...), 0, proto, byte(len(l4)>>8), byte(len(l4)))
	} else {
		ps = append(append(append([]byte{}, sip.To16()...), dip.To16()...), 0, 0, byte(len(l4)>>8), byte(len(l4)), 0, 0, 0, proto)
	}
	if csumOff >= 0 {
		l4[csumOff], l4[csumOff+1] = 0, 0
		c := csumFold(csumAdd(csumAdd(0, ps), l4))
		if c == 0 && proto == 17 {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(l4[csumOff:], c)
	}
	if sip.To4() != nil {
		return ipv4Frame(src, dst, sip, dip, proto, l4)
	}
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(l4)))
	h[6], h[7] = proto, 64
	copy(h[8:], sip.To16())
	copy(h[24:], dip.To16())
	return append(append(ethHeader(src, dst, 0x86dd), h...), l4...)
}

// udpFrame is a UDP datagram sip:sport -> dip:dport.
func udpFrame(src, dst net.HardwareAddr, sip net.IP, sport int, dip net.IP, dport int, payload []byte) []byte {
	u := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], uint16(sport))
	binary.BigEndian.PutUint16(u[2:], uint16(dport))
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	return l4Frame(src, dst, sip, dip, 17, append(u, payload...), 6)
}

// tcpFrame is a TCP segment without options or payload.
func tcpFrame(src, dst net.HardwareAddr, sip net.IP, sport int, dip net.IP, dport int, seq, ack uint32, flags byte, win uint16) []byte {
	h := make([]byte, 20)
	binary.BigEndian.PutUint16(h[0:], uint16(sport))
	binary.BigEndian.PutUint16(h[2:], uint16(dport))
	binary.BigEndian.PutUint32(h[4:], seq)
	binary.BigEndian.PutUint32(h[8:], ack)
	h[12] = 5 << 4
	h[13] = flags
	binary.BigEndian.PutUint16(h[14:], win)
	return l4Frame(src, dst, sip, dip, 6, h, 16)
}

// linkMAC is the MAC of link name in netns.
func linkMAC(t *testing.T, netns ns.NetNS, name string) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	err := netns.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		mac = l.Attrs().HardwareAddr
		return nil
	})
	if err != nil {
		t.Fatalf("MAC of %s: %v", name, err)
	}
	return mac
}

// sendFrames sends frames out of link name in netns (AF_PACKET), as a host
// with a raw socket on that link can.
func sendFrames(t *testing.T, netns ns.NetNS, name string, frames [][]byte) {
	t.Helper()
	sendFramesCPU(t, netns, name, frames, -1)
}

// sendFramesCPU is sendFrames from a thread on cpu (-1: any), so that the
// node's programs handle them all on that CPU (a veth delivers to its peer
// on the sender's CPU): what per-CPU state (an LRU's local lists) makes of
// packets can then be tested.
func sendFramesCPU(t *testing.T, netns ns.NetNS, name string, frames [][]byte, cpu int) {
	t.Helper()
	err := netns.Do(func(ns.NetNS) error {
		if cpu >= 0 {
			var was, set unix.CPUSet
			if err := unix.SchedGetaffinity(0, &was); err != nil {
				return err
			}
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				return err
			}
			defer unix.SchedSetaffinity(0, &was)
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4<<20)
		sa := &syscall.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}
		for _, f := range frames {
			for {
				err := syscall.Sendto(fd, f, 0, sa)
				if err == syscall.ENOBUFS || err == syscall.EAGAIN {
					continue
				}
				if err != nil {
					return err
				}
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send %d frames out of %s: %v", len(frames), name, err)
	}
}

// csum16 is the Internet checksum of b.
func csum16(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// quotedPacket is the IP(v6) header of a packet src -> dst of protocol proto
// followed by l4len zero bytes (its transport header): what an ICMP error
// quotes.
func quotedPacket(src, dst net.IP, proto uint8, l4len int) []byte {
	if src.To4() != nil {
		q := make([]byte, 20+l4len)
		q[0], q[8], q[9] = 0x45, 64, proto
		binary.BigEndian.PutUint16(q[2:], uint16(len(q)))
		copy(q[12:16], src.To4())
		copy(q[16:20], dst.To4())
		binary.BigEndian.PutUint16(q[10:], csum16(q[:20]))
		return q
	}
	q := make([]byte, 40+l4len)
	q[0], q[6], q[7] = 0x60, proto, 64
	binary.BigEndian.PutUint16(q[4:], uint16(l4len))
	copy(q[8:24], src.To16())
	copy(q[24:40], dst.To16())
	return q
}

// forgedUnreach is an ICMP(v6) destination unreachable quoting a TCP segment
// src:sport -> dst:dport that its sender never received. The ICMPv6
// checksum is the kernel's (raw ICMPv6 sockets compute it).
func forgedUnreach(src net.IP, sport int, dst net.IP, dport int) []byte {
	q := quotedPacket(src, dst, syscall.IPPROTO_TCP, 20)
	tcp := q[len(q)-20:]
	binary.BigEndian.PutUint16(tcp[0:], uint16(sport))
	binary.BigEndian.PutUint16(tcp[2:], uint16(dport))
	tcp[12], tcp[13] = 5<<4, 0x10 // data offset, ACK
	if src.To4() != nil {
		m := append([]byte{3, 1, 0, 0, 0, 0, 0, 0}, q...)
		binary.BigEndian.PutUint16(m[2:], csum16(m))
		return m
	}
	return append([]byte{1, 3, 0, 0, 0, 0, 0, 0}, q...)
}

// sendICMP sends the ICMP(v6) message m n times from netns to dst over a raw socket.
func sendICMP(t *testing.T, netns ns.NetNS, dst net.IP, m []byte, n int) {
	t.Helper()
	err := netns.Do(func(ns.NetNS) error {
		var (
			fd  int
			err error
			sa  syscall.Sockaddr
		)
		if dst.To4() != nil {
			fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_ICMP)
			a := &syscall.SockaddrInet4{}
			copy(a.Addr[:], dst.To4())
			sa = a
		} else {
			fd, err = syscall.Socket(syscall.AF_INET6, syscall.SOCK_RAW, syscall.IPPROTO_ICMPV6)
			a := &syscall.SockaddrInet6{}
			copy(a.Addr[:], dst.To16())
			sa = a
		}
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		for i := 0; i < n; i++ {
			if err := syscall.Sendto(fd, m, 0, sa); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send forged ICMP: %v", err)
	}
}
