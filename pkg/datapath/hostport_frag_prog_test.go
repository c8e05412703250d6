package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Fragments of hostPort UDP datagrams (lib/hostport.h hp_frag_flow): the
// first fragment is translated like a datagram and its ports noted; a later
// one gets the same translation of its addresses, and only then.

// udpSeg is a UDP header and payload src:sport -> dst:dport with its checksum.
func udpSeg(src, dst net.IP, sport, dport uint16, payload []byte) []byte {
	u := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	u = append(u, payload...)
	c := csum(pseudo(protoUDP, src, dst, u))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], c)
	return u
}

// fragment is one fragment of a datagram src -> dst (by src's family):
// data at offset off (in 8-byte units), more to come or not.
func fragment(srcMAC net.HardwareAddr, src, dst net.IP, id uint32, off int, more bool, data []byte) []byte {
	mf := 0
	if more {
		mf = 1
	}
	if src.To4() != nil {
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, protoUDP
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(data)))
		binary.BigEndian.PutUint16(ip[4:], uint16(id))
		binary.BigEndian.PutUint16(ip[6:], uint16(mf<<13|off))
		copy(ip[12:16], src.To4())
		copy(ip[16:20], dst.To4())
		binary.BigEndian.PutUint16(ip[10:], csum(ip))
		return append(append(eth(srcMAC, 0x0800), ip...), data...)
	}
	ip := make([]byte, 48)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(8+len(data)))
	ip[6], ip[7] = 44, 64
	copy(ip[8:24], src.To16())
	copy(ip[24:40], dst.To16())
	ip[40] = protoUDP
	binary.BigEndian.PutUint16(ip[42:], uint16(off<<3|mf))
	binary.BigEndian.PutUint32(ip[44:], id)
	return append(append(eth(srcMAC, 0x86dd), ip...), data...)
}

// fragOut is an output fragment's addresses, whether its IPv4 header
// checksum holds, and its data (dlen bytes: the frame may be padded).
func fragOut(t *testing.T, f []byte, dlen int) (src, dst net.IP, l3ok bool, data []byte) {
	t.Helper()
	if binary.BigEndian.Uint16(f[12:]) == 0x0800 {
		ip := f[14:34]
		return net.IP(ip[12:16]), net.IP(ip[16:20]), csum(ip) == 0, f[34 : 34+dlen]
	}
	ip := f[14:62]
	return net.IP(ip[8:24]), net.IP(ip[24:40]), true, f[62 : 62+dlen]
}

// TestUplinkUDPFragments: a client's UDP datagram in two fragments to a
// hostPort, IPv4 and IPv6: both are DNATed into the pod, and the datagram
// they make checks out (its UDP checksum, which only the first carries,
// over the translated addresses). A later fragment no translated first
// fragment announced, before it or of a datagram to a port no hostPort
// maps, goes on untouched.
func TestUplinkUDPFragments(t *testing.T) {
	dp := hpDatapath(t)
	must(t, dp.Maps.HostPorts().Insert(maps.HostPort{IPv6: true, Proto: protoUDP, HostPort: 8080, PodIP: dstIP6, PodPort: 80, Ifindex: dstIfindex}))
	up := uplinkProgram(t, dp)
	payload := []byte("0123456789abcdefghijklmnopqrstuv") // 32 bytes
	for _, c := range []struct {
		name              string
		client, node, pod net.IP
	}{
		{"IPv4", clientIP, nodeIP, dstIP},
		{"IPv6", clientIP6, nodeIP6, dstIP6},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := udpSeg(c.client, c.node, 40000, 8080, payload)
			first := fragment(remoteMAC, c.client, c.node, 7, 0, true, d[:16])
			later := fragment(remoteMAC, c.client, c.node, 7, 2, false, d[16:])

			if ret, out := run(t, up, later); ret != actNext || !bytes.Equal(out[:len(later)], later) {
				t.Fatalf("a later fragment before its first: verdict %d (want TCX_NEXT), changed %v", ret, !bytes.Equal(out[:len(later)], later))
			}
			ret, out := run(t, up, first)
			src, dst, l3ok, d1 := fragOut(t, out, 16)
			if ret != actRedirect || !src.Equal(c.client) || !dst.Equal(c.pod) || !l3ok || binary.BigEndian.Uint16(d1[2:]) != 80 {
				t.Fatalf("first fragment: verdict %d, %s -> %s port %d (IP checksum ok %v), want redirect %s -> %s port 80",
					ret, src, dst, binary.BigEndian.Uint16(d1[2:]), l3ok, c.client, c.pod)
			}
			d1 = append([]byte(nil), d1...)
			ret, out = run(t, up, later)
			src, dst, l3ok, d2 := fragOut(t, out, len(d)-16)
			if ret != actRedirect || !src.Equal(c.client) || !dst.Equal(c.pod) || !l3ok {
				t.Fatalf("later fragment: verdict %d, %s -> %s (IP checksum ok %v), want redirect %s -> %s", ret, src, dst, l3ok, c.client, c.pod)
			}
			if !bytes.Equal(d2, d[16:]) {
				t.Fatalf("later fragment's data changed")
			}
			whole := append(d1, d2...)
			if csum(pseudo(protoUDP, c.client, c.pod, whole)) != 0 {
				t.Fatalf("the reassembled datagram's UDP checksum does not hold over %s -> %s", c.client, c.pod)
			}

			// A datagram to a port no hostPort maps: its first fragment is
			// the stack's, and so is its later one.
			u := udpSeg(c.client, c.node, 40001, 8081, payload)
			if ret, _ := run(t, up, fragment(remoteMAC, c.client, c.node, 8, 0, true, u[:16])); ret != actNext {
				t.Fatalf("first fragment to an unmapped port: verdict %d, want TCX_NEXT", ret)
			}
			l := fragment(remoteMAC, c.client, c.node, 8, 2, false, u[16:])
			if ret, out := run(t, up, l); ret != actNext || !bytes.Equal(out[:len(l)], l) {
				t.Fatalf("its later fragment: verdict %d, want TCX_NEXT and the frame untouched", ret)
			}
		})
	}
}

// TestFromContainerUDPFragmentReply: the hostPort pod's reply in two
// fragments: both get the source the client dialled (the client is another
// pod of the node here, so the verdict is a redirect to it), and the
// datagram they make checks out.
func TestFromContainerUDPFragmentReply(t *testing.T) {
	dp := hpDatapath(t)
	info := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)
	info.Flags |= maps.EndpointFlagHostPort
	must(t, putEndpoint(dp.Maps, podIP, info))
	k, v := ctFlow(podIP, 70, dstIP, 5555, nodeIP, 7000, loIfindex)
	k.Proto = protoUDP
	must(t, putCT(dp.Maps, k, v))
	payload := []byte("0123456789abcdefghijklmnopqrstuv")
	d := udpSeg(podIP, dstIP, 70, 5555, payload)
	first := fragment(podMAC, podIP, dstIP, 9, 0, true, d[:16])
	later := fragment(podMAC, podIP, dstIP, 9, 2, false, d[16:])

	ret, out := run(t, dp.FromContainer, first)
	src, dst, l3ok, d1 := fragOut(t, out, 16)
	if ret != actRedirect || !src.Equal(nodeIP) || !dst.Equal(dstIP) || !l3ok || binary.BigEndian.Uint16(d1[0:]) != 7000 {
		t.Fatalf("first fragment: verdict %d, %s port %d -> %s (IP checksum ok %v), want redirect from %s port 7000",
			ret, src, binary.BigEndian.Uint16(d1[0:]), dst, l3ok, nodeIP)
	}
	d1 = append([]byte(nil), d1...)
	ret, out = run(t, dp.FromContainer, later)
	src, dst, l3ok, d2 := fragOut(t, out, len(d)-16)
	if ret != actRedirect || !src.Equal(nodeIP) || !dst.Equal(dstIP) || !l3ok {
		t.Fatalf("later fragment: verdict %d, %s -> %s (IP checksum ok %v), want redirect from %s", ret, src, dst, l3ok, nodeIP)
	}
	if csum(pseudo(protoUDP, nodeIP, dstIP, append(d1, d2...))) != 0 {
		t.Fatalf("the reassembled reply's UDP checksum does not hold over %s -> %s", nodeIP, dstIP)
	}
	// Another datagram's later fragment (its first never seen) is left
	// as the pod sent it (to the stack, as every fragment went before).
	l := fragment(podMAC, podIP, dstIP, 10, 2, false, d[16:])
	if _, out := run(t, dp.FromContainer, l); !bytes.Equal(out[:len(l)], l) {
		src, _, _, _ := fragOut(t, out, len(d)-16)
		t.Fatalf("an unannounced later fragment was changed (source %s, the pod's own %s)", src, podIP)
	}
}
