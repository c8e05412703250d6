//go:build review_repro

package datapath

import "testing"

// TestAttack30cMasqForgedFINReplaces (red: a working attack, not fixed):
// the server's real FIN arrives out of order and waits for the pod's ack
// of its end (masqrace30); a FIN forged from outside at any other number
// ahead of the tracked end (up to 2^30 ahead: a blind attacker who knows
// the 4-tuple hits it with a quarter of the sequence space, so within 4
// tries) takes the waiting FIN's place ("a later such FIN takes the waiting
// one's place", docs/masquerade.md). The pod's ACK of the real FIN's end
// then counts nothing, and the flow keeps its share of node ports after a
// FIN each way, as before masqrace30.
//
//	go test -tags review_repro -count=1 -run 'TestAttack30cMasqForgedFINReplaces$' ./pkg/datapath/
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
