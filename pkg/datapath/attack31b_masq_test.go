package datapath

import (
	"fmt"
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// attack31bCases: IPv4 with the server's numbers low and across the wrap,
// IPv6, and the compat build (EBPF_CNI_COMPAT: its flags written without
// atomics) across the wrap; each case a flow of its own.
func attack31bCases(t *testing.T, base uint16, run func(name string, m *masqFlow, at net.IP)) {
	flow := masq30cFlows(t, base)
	for _, c := range []struct {
		ipv6, compat bool
		s            uint32
	}{{false, false, 5000}, {false, false, 0xfffffff0}, {true, false, 0xfffffff0}, {false, true, 0xfffffff0}} {
		m := flow()
		m.s = c.s
		at := nodeIP
		if c.ipv6 {
			must(t, putEndpoint(m.dp.Maps, podIP6, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, maps.EndpointFlagMasq)))
			m.pod, m.far, at = podIP6, farIP6, nodeIP6
		}
		if c.compat {
			m.useObjects("compat", objToUplink.compat, objFromUplink.compat)
		}
		run(fmt.Sprintf("s %#x ipv6 %v compat %v", c.s, c.ipv6, c.compat), m, at)
	}
}

// attack31b: hostile review of the merged waiting FIN/RST (attack31's and
// pkt31's rules in snat_peer_fin_wait, snat_peer_rst_wait and
// snat_peer_fin_acked), on hand-made segments as TestMasqPeerRSTReordered.

// TestAttack31bMasqRSTOvertakenByData: attack31's FIN, as an RST. An RST
// forged from outside ahead of the tracked end waits for the pod's next
// ACK; the pod's challenge ACK (its next number when the RST reached it)
// comes back behind the tracked end whenever more of the server's data
// passed the node meanwhile (a bulk stream: the node's end leads the pod's
// ACKs by what is in flight to the pod), and one behind end leaves it
// waiting, as do the pod's ACKs of the data after it. The server's data,
// in order, reaches the RST's number and the pod acknowledges exactly it:
// that ACK counted the forged RST (FLOW_F_CLOSING: the flow's entries go in
// 10 s) while the pod's connection lived and the server went on sending
// (red before: flags 0xf74e). A blind forger needed a number ahead of end
// at a boundary of the server's segments that the pod acknowledges, not
// the pod's exact next number. Now the pod's ACK of the RST's number counts
// it only while end is still behind it, as attack31's FIN.
func TestAttack31bMasqRSTOvertakenByData(t *testing.T) {
	attack31bCases(t, 130, func(s string, m *masqFlow, at net.IP) {
		m.open(at)
		m.fromServer("forged RST ahead", at, m.s+21, 0, rstFlag, nil)
		if !m.waiting() {
			t.Fatalf("%s: the forged RST ahead of end does not wait", s)
		}
		m.fromServer("data 1", at, m.s+1, m.p+1, ackFlag|0x08, []byte("0123456789"))
		m.fromPod("challenge ACK (sent before data 1 reached the pod)", m.p+1, m.s+1, ackFlag, nil)
		m.fromServer("data 2, up to the forged RST's number", at, m.s+11, m.p+1, ackFlag|0x08, []byte("abcdefghij"))
		m.fromPod("ACK of data 1", m.p+1, m.s+11, ackFlag, nil)
		m.fromPod("ACK of data 2 (the forged RST's number)", m.p+1, m.s+21, ackFlag, nil)
		if fl, share := m.state(); fl&flowClosingBit != 0 || share != 1 {
			t.Errorf("%s: a forged RST ahead, the server's data in order up to its number, the pod's ACK of it: flags %#x, share %d; want not closing, share 1", s, fl, share)
		}
	})
}

// TestAttack31bMasqForgedFINBlocksRST: a FIN forged from outside anywhere
// in the 2^30 ahead of the tracked end (a blind forger: one guess in four)
// waits and stays (the pod's answers, its next number, are behind it), and
// "a waiting FIN keeps its place" then turns away the server's real RST
// that overtook the pod's ACK (pkt31's case): the pod's ACK of the RST's
// number counts nothing and the flow stays established until its idle
// timeout (~1 h), holding its share of ports (as every RST ahead of end did
// before pkt31; red before: flags 0xf70e). The nearer-wins rule that
// guards a waiting FIN against a farther forged FIN (attack30c) did not
// apply to an RST meeting a FIN; now it does: the real RST, nearer, takes
// the forged FIN's place. (A blind forger landing between end and a real
// waiting FIN with an RST now makes that FIN count nothing: the nearer
// class of TestMasqPeerRSTForgedNearer, review_repro.) The RST comes before
// any ACK of the pod's after the reordered data: a pod's segment noted
// meanwhile (on most segments while something waits: seen_ns's low word is
// no time then) catches end up to the pod's ACK, and the RST at end counts
// at once, whatever waits.
func TestAttack31bMasqForgedFINBlocksRST(t *testing.T) {
	attack31bCases(t, 150, func(s string, m *masqFlow, at net.IP) {
		m.open(at)
		m.reordered(at, m.p+1)
		m.fromServer("forged FIN far ahead", at, m.s+70000, m.p+1, finFlag|ackFlag, nil)
		if !m.waiting() {
			t.Fatalf("%s: the forged FIN ahead of end does not wait", s)
		}
		m.fromServer("real RST at the pod's next", at, m.s+21, 0, rstFlag, nil)
		m.fromPod("ACK of the reordered data (sent before the RST)", m.p+1, m.s+21, ackFlag, nil)
		if fl, _ := m.state(); fl&flowClosingBit == 0 {
			t.Errorf("%s: a FIN forged far ahead, then the real RST at the pod's next and its ACK: flags %#x; want closing", s, fl)
		}
	})
}
