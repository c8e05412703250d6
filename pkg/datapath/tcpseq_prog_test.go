package datapath

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// The TCP tracking of bpf/lib/tcpseq.h on a hostPort flow (cni_ct), on
// hand-made segments with real sequence numbers (BPF_PROG_TEST_RUN): where
// the client's next sequence number (the tracking's end) stands after each
// segment, and which RST closes the flow. Issue 30 moved the client's
// segments that can move nothing (no SYN, FIN or RST, no payload: pure
// ACKs) past the tracking and reads the headers in place: end must stand
// exactly where the full tracking put it, whatever such segments claim.

// tcpSegment is an Ethernet frame with a TCP segment (seq, ack, flags, a
// 64 KiB window, payload) and valid checksums; pad bytes of Ethernet
// padding follow the IP packet (its length does not count them).
func tcpSegment(srcMAC net.HardwareAddr, src, dst net.IP, sport, dport uint16, seq, ack uint32, flags byte, payload []byte, pad int) []byte {
	h := make([]byte, 20)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint32(h[4:], seq)
	binary.BigEndian.PutUint32(h[8:], ack)
	h[12] = 5 << 4
	h[13] = flags
	binary.BigEndian.PutUint16(h[14:], 0xffff)
	seg := append(h, payload...)
	binary.BigEndian.PutUint16(seg[16:], csum(pseudo(protoTCP, src, dst, seg)))
	var f []byte
	if src.To4() != nil {
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, protoTCP
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(seg)))
		copy(ip[12:16], src.To4())
		copy(ip[16:20], dst.To4())
		binary.BigEndian.PutUint16(ip[10:], csum(ip))
		f = append(append(eth(srcMAC, 0x0800), ip...), seg...)
	} else {
		ip := make([]byte, 40)
		ip[0], ip[6], ip[7] = 0x60, protoTCP, 64
		binary.BigEndian.PutUint16(ip[4:], uint16(len(seg)))
		copy(ip[8:24], src.To16())
		copy(ip[24:40], dst.To16())
		f = append(append(eth(srcMAC, 0x86dd), ip...), seg...)
	}
	return append(f, make([]byte, pad)...)
}

// ctSeq is the tracking of the one cni_ct entry: the client's next
// sequence number (end, the low half of created_ns: struct snat_seq) and
// the entry's flags.
func ctSeq(t *testing.T, dp *Datapath) (end uint32, flags uint32) {
	t.Helper()
	var k maps.CTKey
	var v maps.CTVal
	n := 0
	it := mapstest.Map(dp.Maps, "cni_ct").Iterate()
	for it.Next(&k, &v) {
		n++
		end, flags = uint32(v.CreatedNs), v.Flags
	}
	must(t, it.Err())
	if n != 1 {
		t.Fatalf("cni_ct holds %d entries, want the one flow", n)
	}
	return end, flags
}

// TestHostPortSeqTracking: a remote client's connection to the pod behind
// lo through hostPort 7000, IPv4 and IPv6. After the handshake and 10
// bytes of data, end is the client's ISN + 11. Pure ACKs move nothing,
// whatever their sequence number, and so does one with Ethernet padding
// (its IP length says no payload); data in order moves end. An RST one
// byte before end leaves the flow as it is; one at end closes it.
func TestHostPortSeqTracking(t *testing.T) {
	inNodeNetns(t) // the reply's FIB lookup: routes towards the client
	dp := hpDatapath(t)
	up := uplinkProgram(t, dp)
	info := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)
	info.Flags |= maps.EndpointFlagHostPort
	must(t, putEndpoint(dp.Maps, podIP, info))
	must(t, putEndpoint(dp.Maps, podIP6, info))
	must(t, dp.Maps.HostPorts().Insert(maps.HostPort{IPv6: true, Proto: protoTCP, HostPort: 7000, PodIP: podIP6, PodPort: 70, Ifindex: loIfindex}))
	const ctFlagSeq, ctPeerEnd, flowClosing = 1 << 8, 1 << 9, 1 << 6 // CT_F_SEQ, its PEER_END, FLOW_F_CLOSING
	for _, c := range []struct {
		name              string
		client, node, pod net.IP
		cport             uint16
		isn, podISN       uint32
	}{
		{"IPv4", clientIP, nodeIP, podIP, 41001, 0xfffffff0, 5000}, // end wraps past 2^32
		{"IPv6", clientIP6, nodeIP6, podIP6, 41002, 7000000, 9000},
	} {
		in := func(step string, seq, ack uint32, flags byte, payload []byte, pad int, wantEnd uint32) {
			t.Helper()
			ret, _, _ := testRun(t, up, tcpSegment(remoteMAC, c.client, c.node, c.cport, 7000, seq, ack, flags, payload, pad), 0)
			if ret != actRedirect {
				t.Fatalf("%s %s: verdict %d, want the redirect into the pod", c.name, step, ret)
			}
			if end, fl := ctSeq(t, dp); end != wantEnd || fl&(ctFlagSeq|ctPeerEnd) != ctFlagSeq|ctPeerEnd {
				t.Fatalf("%s %s: end %d (flags %#x), want %d, tracked", c.name, step, end, fl, wantEnd)
			}
		}
		S := c.isn
		in("SYN", S, 0, synFlag, nil, 0, S+1)
		ret, _, _ := testRun(t, dp.FromContainer, tcpSegment(podMAC, c.pod, c.client, 70, c.cport, c.podISN, S+1, synFlag|ackFlag, nil, 0), 0)
		if ret == actShot {
			t.Fatalf("%s: the pod's SYN-ACK was dropped", c.name)
		}
		in("ACK", S+1, c.podISN+1, ackFlag, nil, 0, S+1)
		in("10 bytes", S+1, c.podISN+1, ackFlag|0x08, []byte("0123456789"), 0, S+11)
		in("pure ACK", S+11, c.podISN+1, ackFlag, nil, 0, S+11)
		in("pure ACK far ahead", S+20000, c.podISN+1, ackFlag, nil, 0, S+11)
		in("pure ACK with Ethernet padding", S+11, c.podISN+1, ackFlag, nil, 6, S+11)
		in("10 bytes out of order", S+21, c.podISN+1, ackFlag, []byte("0123456789"), 0, S+11)
		in("RST one before end", S+10, 0, 0x04, nil, 0, S+11)
		if _, fl := ctSeq(t, dp); fl&flowClosing != 0 {
			t.Fatalf("%s: an RST at end - 1 closed the flow (flags %#x)", c.name, fl)
		}
		in("RST at end", S+11, 0, 0x04, nil, 0, S+11)
		if _, fl := ctSeq(t, dp); fl&flowClosing == 0 {
			t.Fatalf("%s: the RST at end left the flow open (flags %#x)", c.name, fl)
		}
		if n, err := dp.Maps.HostPorts().DeleteCTOf(loIfindex); err != nil || n != 1 { // the next family's flow alone
			t.Fatalf("%s: DeleteCTOf: %d, %v", c.name, n, err)
		}
	}
}
