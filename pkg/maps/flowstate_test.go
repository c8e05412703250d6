package maps

import "testing"

// TestNATFlowTimeout: a masqueraded TCP flow the peer closed first lives
// Linux's TIME_WAIT (masq.h's MASQ_TIME_WAIT), as the datapath keeps it;
// any other closed flow 10 s, and cni_ct's FlowTimeout ignores the bit.
func TestNATFlowTimeout(t *testing.T) {
	for _, c := range []struct {
		flags uint32
		want  string
	}{
		{flowClosing | flowFinOrig | flowFinReply | flowPeerFirst, "1m0s"},
		{flowClosing | flowFinOrig | flowFinReply, "10s"},
		{flowFinReply | flowPeerFirst, "2m0s"}, // half-closed: the handshake's, not completed here
		{flowAssured | flowFinReply | flowPeerFirst, "1h0m0s"},
	} {
		if got := NATFlowTimeout(ProtoTCP, c.flags).String(); got != c.want {
			t.Errorf("flags %#x: %s, want %s", c.flags, got, c.want)
		}
	}
	if got := FlowTimeout(ProtoTCP, flowClosing|flowPeerFirst); got != FlowTimeoutClosing {
		t.Errorf("FlowTimeout with the peer-first bit: %v", got)
	}
}
