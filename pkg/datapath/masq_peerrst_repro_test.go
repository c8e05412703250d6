//go:build review_repro

package datapath

import "testing"

// TestMasqPeerRSTForgedNearer (red: what pkt31's waiting RST leaves, as
// attack30c's FIN rule does): an RST forged from outside between the
// tracked end and the real RST's number (s+15 here; the gap the reordered
// data left, a few segments on a real flow: a blind forger lands in it with
// a chance of about gap/2^32 per packet), arriving before the real RST,
// keeps its place: the real one is farther, so taken for forged; the pod's
// ACK of the real number then drops the forged one and counts nothing, and
// the flow stays established until its idle timeout (as every RST ahead of
// end did before pkt31).
//
//	go test -tags review_repro -count=1 -run 'TestMasqPeerRSTForgedNearer$' ./pkg/datapath/
func TestMasqPeerRSTForgedNearer(t *testing.T) {
	flow := masq30cFlows(t, 90)
	at := nodeIP

	m := flow()
	m.open(at)
	m.reordered(at, m.p+1)
	m.fromServer("forged RST nearer", at, m.s+15, 0, rstFlag, nil)
	m.fromServer("real RST at the pod's next", at, m.s+21, 0, rstFlag, nil)
	m.fromPod("ACK of the reordered data", m.p+1, m.s+21, ackFlag, nil)
	if fl, _ := m.state(); fl&flowClosingBit == 0 {
		t.Errorf("an RST forged nearer end, then the real one: flags %#x; want closing", fl)
	}
}
