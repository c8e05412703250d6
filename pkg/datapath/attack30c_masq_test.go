package datapath

import (
	"testing"
)

// attack30c: hostile review of masqrace30 (a server FIN out of order waits
// on the forward entry for the pod's ack of exactly its end), on hand-made
// segments through cni_to_uplink and cni_from_uplink, as
// TestMasqPeerFINReordered.

// masq30cFlows sets up the pod behind lo, masqueraded, and returns a
// constructor of flows to farIP (each its own ports, so its own share).
func masq30cFlows(t *testing.T, base uint16) func() *masqFlow {
	t.Helper()
	dp, out, in := masqLab(t)
	n := uint16(0)
	return func() *masqFlow {
		n++
		return &masqFlow{t: t, dp: dp, out: out, in: in, pod: podIP, far: farIP,
			podPort: 42000 + base + n, srvPort: 600 + base + n, p: 1000, s: 0xfffffff0}
	}
}

// TestAttack30cMasqForgedFINFirst (guard): a FIN forged from outside at a
// wrong number ahead of the tracked end arrives before the server's real
// FIN, both out of order: the real FIN takes the forged one's place, the
// pod's ACK of the real end counts it and the close releases the share.
// Forged RSTs out of order (one ahead of end, one behind) release nothing
// and the flow keeps its translation (its port) for its next segments.
func TestAttack30cMasqForgedFINFirst(t *testing.T) {
	flow := masq30cFlows(t, 0)
	at := nodeIP

	m := flow()
	m.open(at)
	m.reordered(at, m.p+1)
	m.fromServer("forged FIN ahead", at, m.s+3000, m.p+1, finFlag|ackFlag, nil)
	m.fromServer("real FIN out of order", at, m.s+21, m.p+1, finFlag|ackFlag, nil)
	m.fromPod("ACK of the real FIN", m.p+1, m.s+22, ackFlag, nil)
	m.fromPod("FIN", m.p+1, m.s+22, finFlag|ackFlag, nil)
	m.fromServer("ACK of the pod's FIN", at, m.s+22, m.p+2, ackFlag, nil)
	if fl, share := m.state(); fl&flowFinBoth != flowFinBoth || fl&flowClosingBit == 0 || share != 0 {
		t.Errorf("forged FIN then the real one: flags %#x, share %d; want a FIN each way, closing, share 0", fl, share)
	}

	m = flow()
	m.open(at)
	m.reordered(at, m.p+1)
	m.fromServer("forged RST ahead", at, m.s+3000, 0, 0x04, nil)
	m.fromServer("forged RST behind", at, m.s-3000, 0, 0x04, nil)
	m.fromServer("forged RST-ACK ahead", at, m.s+40, m.p+1, 0x04|ackFlag, nil)
	m.fromPod("the pod's data", m.p+1, m.s+21, ackFlag|0x08, []byte("still here"))
	if fl, share := m.state(); fl&(flowFinReply|flowClosingBit) != 0 || share != 1 {
		t.Errorf("forged RSTs out of order: flags %#x, share %d; want the flow established, share 1", fl, share)
	}
}

// TestAttack30cMasqForgedFINReplaces: the server's real FIN arrives out of
// order and waits for the pod's ack of its end (masqrace30); a FIN forged
// from outside at another number farther ahead of the tracked end (up to
// 2^30 ahead: a blind attacker who knows the 4-tuple hits that with a
// quarter of the sequence space) took the waiting FIN's place, the pod's
// ACK of the real end counted nothing and the flow kept its share after a
// FIN each way (red before: flags 0xf71e, share 1). Now a FIN waiting
// nearer end keeps its place.
func TestAttack30cMasqForgedFINReplaces(t *testing.T) {
	flow := masq30cFlows(t, 50)
	at := nodeIP

	m := flow()
	m.open(at)
	m.reordered(at, m.p+1)
	m.fromServer("real FIN out of order", at, m.s+21, m.p+1, finFlag|ackFlag, nil)
	m.fromServer("forged FIN ahead", at, m.s+3000, m.p+1, finFlag|ackFlag, nil)
	m.fromPod("ACK of the real FIN", m.p+1, m.s+22, ackFlag, nil)
	m.fromPod("FIN", m.p+1, m.s+22, finFlag|ackFlag, nil)
	m.fromServer("ACK of the pod's FIN", at, m.s+22, m.p+2, ackFlag, nil)
	if fl, share := m.state(); fl&flowFinBoth != flowFinBoth || fl&flowClosingBit == 0 || share != 0 {
		t.Errorf("the real FIN waiting, then a forged one: flags %#x, share %d; want a FIN each way, closing, share 0", fl, share)
	}
}
