package datapath

import (
	"testing"
)

// attack31: hostile review of the merged masqrace30/attack30c rule (a
// server FIN out of order waits on the forward entry, its end F in the
// low word of seen_ns, and counts once the pod acks exactly F), on
// hand-made segments through cni_to_uplink and cni_from_uplink.

const snatPeerFIN = 1 << 9 // SNAT_F_PEER_FIN, on forward entries

// fwdFlags is the flow's forward entry's flags.
func (m *masqFlow) fwdFlags() uint16 {
	m.t.Helper()
	return m.fwdEntry().Flags
}

// TestAttack31MasqForgedFINOvertakenByData: the pod half-closed its flow
// (its FIN acknowledged by the server) and the server goes on sending. A
// FIN forged from outside ahead of the tracked end waits for the pod's ack
// of its end F; then the server's real data, in order, covers the FIN's
// number (a real FIN's number never carries data: the forged one is void,
// and the pod's TCP drops it from its out-of-order queue once the data
// covers it). The pod acknowledges the data, whose end is F: that ack
// counted the forged FIN, the flow closed (a FIN each way: its share
// released, its entries armed to expire) while the server was still
// sending (red before: flags 0xf77e, share 0). A blind forger needs only a
// number in the quarter of the space ahead of end that is one before a
// boundary of the server's segments (every MSS or two in a bulk stream),
// not the exact end an RST needs. Now a wait the peer's data reached in
// order counts nothing, nor one the pod acknowledged past (the wait goes:
// a stale one came back ahead of end once the numbers wrapped). The
// server's numbers wrap past 2^32 between the forged FIN and the data's
// end in the second run.
func TestAttack31MasqForgedFINOvertakenByData(t *testing.T) {
	flow := masq30cFlows(t, 110)
	at := nodeIP

	for _, s := range []uint32{5000, 0xfffffff8} {
		m := flow()
		m.s = s
		m.open(at)
		m.fromPod("FIN (half-close)", m.p+1, m.s+1, finFlag|ackFlag, nil)
		m.fromServer("ACK of the pod's FIN", at, m.s+1, m.p+2, ackFlag, nil)
		if fl, share := m.state(); fl&flowFinBoth != 1<<4 || share != 1 {
			t.Fatalf("s %#x: the pod's FIN acknowledged: flags %#x, share %d; want its FIN only, share 1", s, fl, share)
		}
		m.fromServer("forged FIN ahead", at, m.s+10, m.p+2, finFlag|ackFlag, nil)
		if m.fwdFlags()&snatPeerFIN == 0 {
			t.Errorf("s %#x: the forged FIN ahead does not wait", s)
		}
		m.fromServer("data over the forged FIN's number", at, m.s+1, m.p+2, ackFlag|0x08, []byte("0123456789"))
		m.fromPod("ACK of the data (the forged FIN's end)", m.p+2, m.s+11, ackFlag, nil)
		if fl, share := m.state(); fl&(flowFinReply|flowClosingBit) != 0 || share != 1 {
			t.Errorf("s %#x: a FIN forged ahead, the server's data over its number, the pod's ack of the data: flags %#x, share %d; want the server's FIN not seen, share 1", s, fl, share)
		}
		m.fromServer("more data", at, m.s+11, m.p+2, ackFlag|0x08, []byte("abcdefghij"))
		m.fromPod("ACK of more data", m.p+2, m.s+21, ackFlag, nil)
		// The server's real FIN, in order, closes it.
		m.fromServer("real FIN", at, m.s+21, m.p+2, finFlag|ackFlag, nil)
		m.fromPod("ACK of the FIN", m.p+2, m.s+22, ackFlag, nil)
		if fl, share := m.state(); fl&flowFinBoth != flowFinBoth || fl&flowClosingBit == 0 || share != 0 {
			t.Errorf("s %#x: then the real FIN in order: flags %#x, share %d; want a FIN each way, closing, share 0", s, fl, share)
		}

		// A forged FIN whose end falls inside a segment of the server's:
		// the pod acknowledges past it, and the wait goes.
		m = flow()
		m.s = s
		m.open(at)
		m.fromServer("forged FIN ahead", at, m.s+5, m.p+1, finFlag|ackFlag, nil)
		m.fromServer("data over it", at, m.s+1, m.p+1, ackFlag|0x08, []byte("0123456789"))
		m.fromPod("ACK past the forged FIN's end", m.p+1, m.s+11, ackFlag, nil)
		if fl := m.fwdFlags(); fl&snatPeerFIN != 0 {
			t.Errorf("s %#x: the pod acknowledged past a waiting FIN's end: forward flags %#x, want the wait gone", s, fl)
		}
		m.fromPod("ACK of the forged FIN's end (late, or after a wrap)", m.p+1, m.s+6, ackFlag, nil)
		if fl, share := m.state(); fl&(flowFinReply|flowClosingBit) != 0 || share != 1 {
			t.Errorf("s %#x: an ack of a void FIN's end after the pod's ack past it: flags %#x, share %d; want no FIN of the server's, share 1", s, fl, share)
		}
	}
}
