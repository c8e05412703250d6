package datapath

import (
	"net"
	"net/netip"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// The masquerade's count of a FIN of the server's that arrives out of
// order (masqrace30, docs/masquerade.md "Reordered"), on hand-made
// segments (BPF_PROG_TEST_RUN through cni_to_uplink and cni_from_uplink):
// the tracking's end (the server's next sequence number) moves only with
// segments exactly in order, so a segment taken out of order left it
// behind, a FIN arriving then did not count, and the flow kept its share
// of ports for its hour. Now such a FIN counts once the pod acknowledges
// exactly its end; a FIN forged at another number, and a pod acknowledging
// a FIN that was never sent, release nothing.

const (
	finFlag         = 0x01
	flowFinBoth     = 1<<4 | 1<<5 // FLOW_F_FIN_ORIG | FLOW_F_FIN_REPLY
	flowFinReply    = 1 << 5
	flowClosingBit  = 1 << 6
	flowPeerFirst   = 1 << 7
	snatDirRev      = 1
	masqPeerFINPort = 443
)

// masqFlow is one masqueraded TCP connection of the pod behind lo to
// far:peerPort, driven segment by segment: pod's ISN p, server's ISN s.
type masqFlow struct {
	t                *testing.T
	dp               *Datapath
	out, in          func(frame []byte, ingress uint32) (uint32, parsed)
	pod, far         net.IP
	podPort, srvPort uint16
	node             uint16 // the node port the masquerade gave it
	p, s             uint32
}

func (m *masqFlow) fromPod(what string, seq, ack uint32, flags byte, payload []byte) {
	m.t.Helper()
	ret, o := m.out(tcpSegment(podMAC, m.pod, m.far, m.podPort, m.srvPort, seq, ack, flags, payload, 0), loIfindex)
	if ret != actNext || o.sport < 1024 {
		m.t.Fatalf("%s (pod): verdict %d, source port %d", what, ret, o.sport)
	}
	if m.node == 0 {
		m.node = o.sport
	} else if o.sport != m.node {
		m.t.Fatalf("%s (pod): left from port %d, the flow's is %d", what, o.sport, m.node)
	}
}

func (m *masqFlow) fromServer(what string, at net.IP, seq, ack uint32, flags byte, payload []byte) {
	m.t.Helper()
	ret, o := m.in(tcpSegment(remoteMAC, m.far, at, m.srvPort, m.node, seq, ack, flags, payload, 0), 0)
	if ret == actShot || !o.dst.Equal(m.pod) || o.dport != m.podPort {
		m.t.Fatalf("%s (server): verdict %d, to %s:%d; want it to the pod %s:%d", what, ret, o.dst, o.dport, m.pod, m.podPort)
	}
}

// state is the flow's reverse entry's flags and the pod's share of ports
// towards the server.
func (m *masqFlow) state() (flags uint16, share int) {
	m.t.Helper()
	var k maps.SNATKey
	var v maps.SNATVal
	n := 0
	it := mapstest.Map(m.dp.Maps, "cni_snat").Iterate()
	for it.Next(&k, &v) {
		if k.Dir == snatDirRev && k.Port == htons(m.node) && k.PeerPort == htons(m.srvPort) {
			flags = v.Flags
			n++
		}
	}
	must(m.t, it.Err())
	if n != 1 {
		m.t.Fatalf("%d reverse entries for node port %d, want 1", n, m.node)
	}
	shares, err := m.dp.Maps.Masq().ListShares()
	must(m.t, err)
	for _, s := range shares {
		if s.Ifindex == loIfindex && s.Destination.Port() == m.srvPort && s.Destination.Addr().Unmap() == netip.MustParseAddr(m.far.String()).Unmap() {
			share += s.Ports
		}
	}
	return flags, share
}

// fwdEntry is the flow's forward entry (pod port to server port).
func (m *masqFlow) fwdEntry() maps.SNATVal {
	m.t.Helper()
	var k maps.SNATKey
	var v maps.SNATVal
	it := mapstest.Map(m.dp.Maps, "cni_snat").Iterate()
	for it.Next(&k, &v) {
		if k.Dir == 0 && k.Port == htons(m.podPort) && k.PeerPort == htons(m.srvPort) {
			return v
		}
	}
	must(m.t, it.Err())
	m.t.Fatalf("no forward entry of %d -> %d", m.podPort, m.srvPort)
	return v
}

// open runs the handshake and two 10-byte segments of the server's
// delivered out of order (the second first): the tracking's end stays at
// s+11 while the pod has everything up to s+21.
func (m *masqFlow) open(at net.IP) {
	m.t.Helper()
	m.fromPod("SYN", m.p, 0, synFlag, nil)
	m.fromServer("SYN-ACK", at, m.s, m.p+1, synFlag|ackFlag, nil)
	m.fromPod("ACK", m.p+1, m.s+1, ackFlag, nil)
}

func (m *masqFlow) reordered(at net.IP, ack uint32) {
	m.t.Helper()
	m.fromServer("second 10 bytes, first", at, m.s+11, ack, ackFlag|0x08, []byte("abcdefghij"))
	m.fromServer("first 10 bytes, second", at, m.s+1, ack, ackFlag|0x08, []byte("0123456789"))
}

// TestMasqPeerFINReordered: IPv4 and IPv6, each case a connection of its
// own (its own server port, so its own share).
//   - server first: its data reordered, its FIN at s+21, the pod's ACK of
//     s+22, the pod's FIN and the server's ACK of it: closed (a FIN each
//     way, the server first), share 0. Red before (share 1, the server's
//     FIN never counted).
//   - pod first: the pod's FIN, the server's data reordered, its FIN-ACK
//     acknowledging the pod's FIN, the pod's ACK: closed, the pod first,
//     share 0. Red before.
//   - forged FIN: the server's data reordered, a FIN from outside at
//     s+5000 (the pod answers it with its own next number, s+21): nothing
//     counts, share 1; so too after the pod's FIN and the server's ACK of it.
//   - FIN never sent: the server's data reordered, the pod acknowledges
//     s+22 as if a FIN were at s+21: nothing counts, share 1, and none after
//     the pod's FIN and the server's ACK of it.
func TestMasqPeerFINReordered(t *testing.T) {
	dp, out, in := masqLab(t)

	for fi, fam := range []struct {
		name          string
		pod, far, at  net.IP
		podISN, srvSN uint32
	}{
		{"IPv4", podIP, farIP, nodeIP, 1000, 0xfffffff5}, // the server's numbers wrap past 2^32
		{"IPv6", podIP6, farIP6, nodeIP6, 0x7ffffff0, 5000},
	} {
		n := 0
		flow := func() *masqFlow {
			n++
			return &masqFlow{t: t, dp: dp, out: out, in: in, pod: fam.pod, far: fam.far,
				podPort: uint16(41000 + 10*fi + n), srvPort: uint16(masqPeerFINPort + 10*fi + n), p: fam.podISN, s: fam.srvSN}
		}

		m := flow()
		m.open(fam.at)
		m.reordered(fam.at, m.p+1)
		m.fromServer("FIN out of order", fam.at, m.s+21, m.p+1, finFlag|ackFlag, nil)
		m.fromPod("ACK of the FIN", m.p+1, m.s+22, ackFlag, nil)
		m.fromPod("FIN", m.p+1, m.s+22, finFlag|ackFlag, nil)
		m.fromServer("ACK of the pod's FIN", fam.at, m.s+22, m.p+2, ackFlag, nil)
		if fl, share := m.state(); fl&flowFinBoth != flowFinBoth || fl&flowClosingBit == 0 || fl&flowPeerFirst == 0 || share != 0 {
			t.Errorf("%s server first, its FIN after reordered data: flags %#x, share %d; want a FIN each way, closing, the server first, share 0", fam.name, fl, share)
		}

		m = flow()
		m.open(fam.at)
		m.fromPod("FIN", m.p+1, m.s+1, finFlag|ackFlag, nil)
		m.reordered(fam.at, m.p+1)
		m.fromServer("FIN-ACK out of order", fam.at, m.s+21, m.p+2, finFlag|ackFlag, nil)
		m.fromPod("ACK of the FIN", m.p+2, m.s+22, ackFlag, nil)
		if fl, share := m.state(); fl&flowFinBoth != flowFinBoth || fl&flowClosingBit == 0 || fl&flowPeerFirst != 0 || share != 0 {
			t.Errorf("%s pod first, the server's FIN-ACK after reordered data: flags %#x, share %d; want a FIN each way, closing, the pod first, share 0", fam.name, fl, share)
		}

		m = flow()
		m.open(fam.at)
		m.reordered(fam.at, m.p+1)
		m.fromServer("forged FIN", fam.at, m.s+5000, m.p+1, finFlag|ackFlag, nil)
		m.fromPod("the pod's ACK of its next", m.p+1, m.s+21, ackFlag, nil)
		if fl, share := m.state(); fl&(flowFinReply|flowClosingBit) != 0 || share != 1 {
			t.Errorf("%s a FIN forged at another number, the pod acknowledging its own next: flags %#x, share %d; want no FIN of the server's, share 1", fam.name, fl, share)
		}
		m.fromPod("FIN", m.p+1, m.s+21, finFlag|ackFlag, nil)
		m.fromServer("ACK of the pod's FIN", fam.at, m.s+21, m.p+2, ackFlag, nil)
		if fl, share := m.state(); fl&(flowFinReply|flowClosingBit) != 0 || share != 1 {
			t.Errorf("%s a forged FIN, then the pod's FIN acknowledged: flags %#x, share %d; want no FIN of the server's, share 1", fam.name, fl, share)
		}

		m = flow()
		m.open(fam.at)
		m.reordered(fam.at, m.p+1)
		m.fromPod("ACK of a FIN never sent", m.p+1, m.s+22, ackFlag, nil)
		m.fromPod("FIN", m.p+1, m.s+22, finFlag|ackFlag, nil)
		m.fromServer("ACK of the pod's FIN", fam.at, m.s+21, m.p+2, ackFlag, nil)
		if fl, share := m.state(); fl&(flowFinReply|flowClosingBit) != 0 || share != 1 {
			t.Errorf("%s the pod acknowledging a FIN never sent: flags %#x, share %d; want no FIN of the server's, share 1", fam.name, fl, share)
		}
	}
}

// frameRun runs a frame through a program (runFromFrame): its verdict and
// what it sent.
type frameRun func(f []byte, in uint32) (uint32, parsed)

// masqLab: the node's programs loaded (closed at the test's end) in the
// test's netns, the pod (podIP, podIP6) behind lo and masqueraded,
// 10.9.0.0/16 the cluster's; out and in run frames through cni_to_uplink
// and cni_from_uplink.
func masqLab(t *testing.T) (*Datapath, frameRun, frameRun) {
	t.Helper()
	inNodeNetns(t)
	dp := hpDatapath(t)
	progs, err := loadPrograms(dp.PinRoot, dp.Maps, nodeHookPrograms(), loadMissing)
	must(t, err)
	t.Cleanup(func() { closePrograms(progs) })
	out := func(f []byte, in uint32) (uint32, parsed) { return runFromFrame(t, progs["cni_to_uplink"], f, in) }
	in := func(f []byte, in uint32) (uint32, parsed) { return runFromFrame(t, progs["cni_from_uplink"], f, in) }
	mq := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, maps.EndpointFlagMasq)
	must(t, putEndpoint(dp.Maps, podIP, mq))
	must(t, putEndpoint(dp.Maps, podIP6, mq))
	must(t, mapstest.PutClusterCIDR(dp.Maps, netip.MustParsePrefix("10.9.0.0/16")))
	return dp, out, in
}
