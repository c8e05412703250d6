package datapath

import (
	"encoding/binary"
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// ICMP errors about translated flows, on hand-made frames: every field and
// checksum of the translated error, the ones no receiving kernel checks
// included (the quoted IPv4 header's, the quoted L4 header's).

var (
	farIP    = net.ParseIP("198.51.100.9").To4()
	farIP6   = net.ParseIP("fd00:51::9")
	routerIP = net.ParseIP("203.0.113.254").To4()
	router6  = net.ParseIP("fd00:203::fe")
)

func monoNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// putSNAT writes the reverse entry of a masqueraded flow: the pod's
// pod:podPort leaves as node:port to peer:peerPort.
func putSNAT(t *testing.T, dp *Datapath, proto byte, node net.IP, port uint16, peer net.IP, peerPort uint16, pod net.IP, podPort uint16) {
	t.Helper()
	var k maps.SNATKey
	var v maps.SNATVal
	fam := uint8(2)
	put := func(dst *[16]uint8, ip net.IP) {
		if ip.To4() != nil {
			copy(dst[:], ip.To4())
		} else {
			fam = 10
			copy(dst[:], ip.To16())
		}
	}
	put(&k.Addr, node)
	put(&k.PeerAddr, peer)
	put(&v.Addr, pod)
	k.Port, k.PeerPort, k.Proto, k.Family, k.Dir = htons(port), htons(peerPort), proto, fam, 1
	v.Port, v.Ifindex, v.CreatedNs, v.SeenNs = htons(podPort), loIfindex, monoNow(), monoNow()
	must(t, mapstest.Map(dp.Maps, "cni_snat").Put(&k, &v))
}

// ipPacket is an IP header (no options) and a payload.
func ipPacket(proto byte, src, dst net.IP, payload []byte) []byte {
	if src.To4() != nil {
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, proto
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(payload)))
		copy(ip[12:16], src.To4())
		copy(ip[16:20], dst.To4())
		binary.BigEndian.PutUint16(ip[10:], csum(ip))
		return append(ip, payload...)
	}
	ip := make([]byte, 40)
	ip[0], ip[6], ip[7] = 0x60, proto, 64
	binary.BigEndian.PutUint16(ip[4:], uint16(len(payload)))
	copy(ip[8:24], src.To16())
	copy(ip[24:40], dst.To16())
	return append(ip, payload...)
}

// echoRequest is an ICMP(v6) echo request with a valid checksum.
func echoRequest(src, dst net.IP, id uint16) []byte {
	m := []byte{8, 0, 0, 0, 0, 0, 0, 1, 'p', 'i', 'n', 'g'}
	binary.BigEndian.PutUint16(m[4:], id)
	if src.To4() != nil {
		binary.BigEndian.PutUint16(m[2:], csum(m))
		return ipPacket(1, src, dst, m)
	}
	m[0] = 128
	binary.BigEndian.PutUint16(m[2:], csum(pseudo(58, src, dst, m)))
	return ipPacket(58, src, dst, m)
}

// icmpError is an Ethernet frame with an ICMP(v6) error from src to dst of
// type/code quoting the packet q, checksummed.
func icmpError(srcMAC net.HardwareAddr, src, dst net.IP, typ, code byte, q []byte) []byte {
	m := append([]byte{typ, code, 0, 0, 0, 0, 0x05, 0x00}, q...) // 0x0500: MTU 1280
	if src.To4() != nil {
		binary.BigEndian.PutUint16(m[2:], csum(m))
		return append(eth(srcMAC, 0x0800), ipPacket(1, src, dst, m)...)
	}
	binary.BigEndian.PutUint16(m[2:], csum(pseudo(58, src, dst, m)))
	return append(eth(srcMAC, 0x86dd), ipPacket(58, src, dst, m)...)
}

// checkedError is a translated error as a test reads it back.
type checkedError struct {
	src, dst, qsrc, qdst net.IP
	qsport, qdport       uint16
}

// readError checks every checksum of an ICMP(v6) error frame (the quoted
// L4 one over the whole quoted segment, which these tests quote in full)
// and returns its addresses and the quoted ports (an echo's id as qsport).
func readError(t *testing.T, f []byte) checkedError {
	t.Helper()
	var c checkedError
	var msg, q []byte
	if binary.BigEndian.Uint16(f[12:]) == 0x0800 {
		ip := f[14:34]
		if csum(ip) != 0 {
			t.Errorf("outer IPv4 header checksum wrong")
		}
		c.src, c.dst = net.IP(ip[12:16]), net.IP(ip[16:20])
		msg = f[34 : 14+int(binary.BigEndian.Uint16(ip[2:]))]
		if csum(msg) != 0 {
			t.Errorf("ICMP checksum wrong")
		}
		q = msg[8:]
		if csum(q[:20]) != 0 {
			t.Errorf("quoted IPv4 header checksum wrong")
		}
		c.qsrc, c.qdst = net.IP(q[12:16]), net.IP(q[16:20])
		seg := q[20:]
		c.qsport, c.qdport = binary.BigEndian.Uint16(seg), binary.BigEndian.Uint16(seg[2:])
		switch q[9] {
		case 1:
			c.qsport, c.qdport = binary.BigEndian.Uint16(seg[4:]), 0
			if csum(seg) != 0 {
				t.Errorf("quoted ICMP echo checksum wrong")
			}
		default:
			if csum(pseudo(q[9], c.qsrc, c.qdst, seg)) != 0 {
				t.Errorf("quoted L4 (%d) checksum wrong", q[9])
			}
		}
		return c
	}
	ip := f[14:54]
	c.src, c.dst = net.IP(ip[8:24]), net.IP(ip[24:40])
	msg = f[54 : 54+int(binary.BigEndian.Uint16(ip[4:]))]
	if csum(pseudo(58, c.src, c.dst, msg)) != 0 {
		t.Errorf("ICMPv6 checksum wrong")
	}
	q = msg[8:]
	c.qsrc, c.qdst = net.IP(q[8:24]), net.IP(q[24:40])
	seg := q[40:]
	c.qsport, c.qdport = binary.BigEndian.Uint16(seg), binary.BigEndian.Uint16(seg[2:])
	if q[6] == 58 {
		c.qsport, c.qdport = binary.BigEndian.Uint16(seg[4:]), 0
	}
	if csum(pseudo(q[6], c.qsrc, c.qdst, seg)) != 0 {
		t.Errorf("quoted L4 (%d) checksum wrong", q[6])
	}
	return c
}

func wantError(t *testing.T, what string, got checkedError, src, dst, qsrc net.IP, qsport uint16, qdst net.IP, qdport uint16) {
	t.Helper()
	if !got.src.Equal(src) || !got.dst.Equal(dst) || !got.qsrc.Equal(qsrc) || got.qsport != qsport || !got.qdst.Equal(qdst) || got.qdport != qdport {
		t.Errorf("%s: %s -> %s quoting %s:%d -> %s:%d, want %s -> %s quoting %s:%d -> %s:%d", what,
			got.src, got.dst, got.qsrc, got.qsport, got.qdst, got.qdport, src, dst, qsrc, qsport, qdst, qdport)
	}
}

// TestMasqICMPErrorIn: errors from a router about packets a masquerading
// pod sent (quoting node:port -> peer) go back to the pod's address and
// port: fragmentation needed about TCP, packet too big about UDP, time
// exceeded about an echo request; each checksum right. An error about no
// masqueraded flow is left alone.
func TestMasqICMPErrorIn(t *testing.T) {
	dp := hpDatapath(t)
	up := uplinkProgram(t, dp)
	putSNAT(t, dp, protoTCP, nodeIP, 61234, farIP, 443, podIP, 40000)
	putSNAT(t, dp, protoUDP, nodeIP6, 61235, farIP6, 53, podIP6, 40001)
	putSNAT(t, dp, 1, nodeIP, 61236, farIP, 0, podIP, 7)
	putSNAT(t, dp, 58, nodeIP6, 61237, farIP6, 0, podIP6, 8)

	for _, c := range []struct {
		name     string
		frame    []byte
		pod      net.IP
		podPort  uint16
		peer     net.IP
		peerPort uint16
	}{
		{"frag-needed/tcp", icmpError(remoteMAC, routerIP, nodeIP, 3, 4,
			ipPacket(protoTCP, nodeIP, farIP, l4(protoTCP, nodeIP, farIP, 61234, 443, ackFlag, false))), podIP, 40000, farIP, 443},
		{"packet-too-big/udp", icmpError(remoteMAC, router6, nodeIP6, 2, 0,
			ipPacket(protoUDP, nodeIP6, farIP6, l4(protoUDP, nodeIP6, farIP6, 61235, 53, 0, false))), podIP6, 40001, farIP6, 53},
		{"time-exceeded/echo", icmpError(remoteMAC, routerIP, nodeIP, 11, 0, echoRequest(nodeIP, farIP, 61236)), podIP, 7, farIP, 0},
		{"time-exceeded/echo6", icmpError(remoteMAC, router6, nodeIP6, 3, 0, echoRequest(nodeIP6, farIP6, 61237)), podIP6, 8, farIP6, 0},
	} {
		ret, out := run(t, up, c.frame)
		if ret != actNext {
			t.Errorf("%s: verdict %d, want on to the stack", c.name, ret)
			continue
		}
		router := routerIP
		if c.pod.To4() == nil {
			router = router6
		}
		wantError(t, c.name, readError(t, out), router, c.pod, c.pod, c.podPort, c.peer, c.peerPort)
	}
	// About a port nobody masqueraded: untouched.
	f := icmpError(remoteMAC, routerIP, nodeIP, 3, 4, ipPacket(protoTCP, nodeIP, farIP, l4(protoTCP, nodeIP, farIP, 61299, 443, ackFlag, false)))
	ret, out := run(t, up, f)
	if ret != actNext || string(out) != string(f) {
		t.Errorf("error about no flow: verdict %d, changed %v", ret, string(out) != string(f))
	}
	st, err := dp.Maps.Masq().Stats()
	if err != nil || st["icmp_error_in"] != 4 {
		t.Errorf("icmp_error_in %d (%v), want 4", st["icmp_error_in"], err)
	}
}

// TestHostPortICMPErrors: a router's error about a pod's hostPort reply
// (quoting node:hostPort -> client) goes into the pod as pod:port; the
// pod's port unreachable about a client's datagram (quoting client ->
// pod:port) leaves as the node's, quoting node:hostPort.
func TestHostPortICMPErrors(t *testing.T) {
	dp := hpDatapath(t)
	up := uplinkProgram(t, dp)
	// In: IPv6 TCP *:8080 -> dstIP6:80 (hpDatapath), a flow of clientIP6:5555.
	k, v := ctFlow(dstIP6, 80, clientIP6, 5555, nodeIP6, 8080, dstIfindex)
	// ctFlow is IPv4's: the same flow in IPv6.
	k.Family = 10
	copy(k.PodAddr[:], dstIP6)
	copy(k.PeerAddr[:], clientIP6)
	copy(v.OrigAddr[:], nodeIP6)
	copy(v.ClientAddr[:], clientIP6)
	must(t, putCT(dp.Maps, k, v))
	f := icmpError(remoteMAC, router6, nodeIP6, 2, 0,
		ipPacket(protoTCP, nodeIP6, clientIP6, l4(protoTCP, nodeIP6, clientIP6, 8080, 5555, ackFlag, false)))
	ret, out := run(t, up, f)
	if ret != actRedirect {
		t.Fatalf("packet too big about a hostPort reply: verdict %d, want a redirect into the pod", ret)
	}
	wantError(t, "in", readError(t, out), router6, dstIP6, dstIP6, 80, clientIP6, 5555)

	// Out: the pod behind lo (flagged) refuses a UDP datagram of a flow
	// dstIP:5555 -> node:7000 -> podIP:70; the client is a pod of the node.
	info := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)
	info.Flags |= maps.EndpointFlagHostPort
	must(t, putEndpoint(dp.Maps, podIP, info))
	k, v = ctFlow(podIP, 70, dstIP, 5555, nodeIP, 7000, loIfindex)
	k.Proto = protoUDP
	must(t, putCT(dp.Maps, k, v))
	f = icmpError(podMAC, podIP, dstIP, 3, 3, ipPacket(protoUDP, dstIP, podIP, l4(protoUDP, dstIP, podIP, 5555, 70, 0, false)))
	ret, out = run(t, dp.FromContainer, f)
	if ret != actRedirect {
		t.Fatalf("the pod's port unreachable: verdict %d, want a redirect to the client pod", ret)
	}
	wantError(t, "out", readError(t, out), nodeIP, dstIP, dstIP, 5555, nodeIP, 7000)

	st, err := dp.Maps.HostPorts().Stats()
	if err != nil || st["icmp_error_in"] != 1 || st["icmp_error_out"] != 1 {
		t.Errorf("counters %v (%v), want one error each way", st, err)
	}
}
