//go:build review_repro

package datapath

import "testing"

// TestAttack30cMasqForgedFINNearer (red: what is left after attack30c's
// fix): a FIN forged from outside between the tracked end and the real
// FIN's number (s+15 here; the gap the reordered data left, a few segments
// on a real flow: a blind forger hits it with a chance of about gap/2^32
// per packet, against a quarter of the space before the fix), arriving
// before the real out-of-order FIN, keeps its place: the real FIN is
// farther, so taken for forged; the pod's ACK of the real end counts
// nothing and the flow keeps its share after a FIN each way.
//
//	go test -tags review_repro -count=1 -run 'TestAttack30cMasqForgedFINNearer$' ./pkg/datapath/
func TestAttack30cMasqForgedFINNearer(t *testing.T) {
	flow := masq30cFlows(t, 80)
	at := nodeIP

	m := flow()
	m.open(at)
	m.reordered(at, m.p+1)
	m.fromServer("forged FIN nearer", at, m.s+15, m.p+1, finFlag|ackFlag, nil)
	m.fromServer("real FIN out of order", at, m.s+21, m.p+1, finFlag|ackFlag, nil)
	m.fromPod("ACK of the real FIN", m.p+1, m.s+22, ackFlag, nil)
	m.fromPod("FIN", m.p+1, m.s+22, finFlag|ackFlag, nil)
	m.fromServer("ACK of the pod's FIN", at, m.s+22, m.p+2, ackFlag, nil)
	if fl, share := m.state(); fl&flowFinBoth != flowFinBoth || fl&flowClosingBit == 0 || share != 0 {
		t.Errorf("a FIN forged nearer end, then the real one: flags %#x, share %d; want a FIN each way, closing, share 0", fl, share)
	}
}
