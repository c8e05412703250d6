//go:build review_repro

package datapath

import "testing"

// TestAttack31bMasqForgedRSTNearerThanFIN (red: what attack31b's
// nearer-wins rule between a waiting FIN and an RST leaves, the class of
// TestAttack30cMasqForgedFINNearer and TestMasqPeerRSTForgedNearer): the
// server's real FIN out of order waits at its end (s+22 here), and an RST
// forged from outside between the tracked end and it (s+15: the gap the
// reordered data left) takes its place, being nearer. The pod's ACK of the
// FIN's end is no ACK of the RST's number and not behind end: it drops the
// RST and counts nothing, and the flow keeps its share until its idle
// timeout. Before attack31b a waiting FIN kept its place against any RST
// (this was green), but then a FIN forged anywhere in the 2^30 ahead of end
// turned away the real RST (TestAttack31bMasqForgedFINBlocksRST): a blind
// forger now has to land in the gap, as for the two others.
//
//	go test -tags review_repro -count=1 -run 'TestAttack31bMasqForgedRSTNearerThanFIN$' ./pkg/datapath/
func TestAttack31bMasqForgedRSTNearerThanFIN(t *testing.T) {
	flow := masq30cFlows(t, 290)
	at := nodeIP

	m := flow()
	m.open(at)
	m.reordered(at, m.p+1)
	m.fromServer("real FIN out of order", at, m.s+21, m.p+1, finFlag|ackFlag, nil)
	m.fromServer("forged RST nearer", at, m.s+15, 0, rstFlag, nil)
	m.fromPod("ACK of the FIN", m.p+1, m.s+22, ackFlag, nil)
	if fl, share := m.state(); fl&flowFinReply == 0 {
		t.Errorf("the real FIN waiting, an RST forged nearer end, the pod's ACK of the FIN: flags %#x, share %d; want the server's FIN counted", fl, share)
	}
}
