// share25: the masquerade share's forged SYN-ACK hole (attack23's red,
// TestAttack23MasqShareForgedSynAck, rebuilt) and the backstop that closes
// it whatever the tracking believes: payload on a flow whose share was
// released takes the share back, or is dropped (drop_pod_limit) when the
// pod is at its limit (docs/masquerade.md, "No pod starves the others").

package integration

import (
	"testing"
	"time"
)

// a25Check asserts a round of the cheat against a limit of 8: at most 8 of
// the 16 connections deliver (the 8 opened after the cheat do), the share
// is 8 at the end, and the cheated ones were dropped at the limit.
func a25Check(t *testing.T, what string, r a23Result) {
	t.Helper()
	if r.n > 8 {
		t.Errorf("%s: RED pod holds %d live connections to one server, over its share of 8 (share after the cheat %d, at the end %d)", what, r.n, r.share0, r.share)
	}
	if r.n < 8 {
		t.Errorf("%s: only %d of the 8 connections within the pod's share delivered", what, r.n)
	}
	if r.share != 8 {
		t.Errorf("%s: share %d at the end, want 8 (its limit)", what, r.share)
	}
	if r.n <= 8 && r.counters["drop_pod_limit"] == 0 {
		t.Errorf("%s: no drop_pod_limit counted for the cheated connections' data", what)
	}
}

// TestAttack23MasqShareForgedSynAck (red on main, rebuilt from branch
// attack23): on each of its first 8 connections (the server's FIN read)
// the pod sends a raw SYN at a sequence number of its choosing S on its
// live tuple (the server answers with a challenge ACK and changes nothing;
// the datapath re-seeds its tracking, taken for the tuple reused); the
// accomplice outside answers it with a forged SYN-ACK (its own sequence
// number Q, ack S+1) on the node's tuple; the pod sends a FIN at S+1 (out
// of the server's window: dropped) and the accomplice "acknowledges" it
// with a FIN-ACK at Q+1, which the pod acknowledges. No sequence number of
// the real server is used. On main: 16 of 16 live at a limit of 8, share
// 0 after the first 8.
func TestAttack23MasqShareForgedSynAck(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "64400-64431")
	r := a23RoundFull(t, lab, outsideIP, 7590, 0, "a23sa", 49100, 8, false, a23SynAckCheat)
	a25Check(t, "attack23 forged SYN-ACK", r)
}

// TestAttack23MasqShareForgedSynAckIPv6: the same over IPv6.
func TestAttack23MasqShareForgedSynAckIPv6(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "64900-64931")
	r := a23RoundFull(t, lab, outsideIP6, 7592, 0, "a23s6", 49900, 8, false, a23SynAckCheat)
	a25Check(t, "attack23 forged SYN-ACK (IPv6)", r)
}

// a23SynAckCheat: the pod's SYN at S on its live tuple, the accomplice's
// SYN-ACK (Q, S+1), the pod's FIN at S+1, the accomplice's FIN-ACK (Q+1,
// S+2), the pod's ACK; 50 ms apart.
func a23SynAckCheat(t *testing.T, a *a23Conn) {
	a25SynAckCheatAt(t, a, a.snd+1<<30, 0x12345678)
}

// a25SynAckCheatAt is a23SynAckCheat with the pod's S and the accomplice's
// Q given.
func a25SynAckCheatAt(t *testing.T, a *a23Conn, s, q uint32) {
	a.podSeg(t, s, 0, 0x02, nil)
	time.Sleep(50 * time.Millisecond)
	a.srvSeg(t, q, s+1, 0x12)
	time.Sleep(50 * time.Millisecond)
	a.podSeg(t, s+1, q+1, 0x11, nil)
	time.Sleep(50 * time.Millisecond)
	a.srvSeg(t, q+1, s+2, 0x11)
	a.podSeg(t, s+2, q+2, 0x10, nil)
}

// TestShare25MasqAlignedPod (the gap of share24's first build, which let
// the pod's data at or up to 2^29 below the recorded end of a released flow
// pass as a retransmission, 16 of 16 live): the cheat of
// TestAttack23MasqShareForgedSynAck with the pod's S placed so that the end
// the datapath records for the pod (the forged FIN's, S+2) lies just past
// the real data that follows: S = its next + 5, the recorded end one past
// the end of "again\n" (even connections), or 1 MiB past its next (odd).
func TestShare25MasqAlignedPod(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "63900-63931")
	r := a23RoundFull(t, lab, outsideIP, 7584, 0, "s25ap", 49300, 8, false, func(t *testing.T, a *a23Conn) {
		// The pod's next data starts at a.snd and ends at a.snd + 6
		// ("again\n"): the recorded end placed just past that end
		// (S+2 = a.snd+7) makes it a "retransmission" below the end.
		s := a.snd + 5
		if a.sport%2 == 1 {
			s = a.snd + 1<<20 // far past it, within 2^29
		}
		a25SynAckCheatAt(t, a, s, 0x12345678)
	})
	a25Check(t, "share25 aligned pod end", r)
}

// TestShare25MasqAlignedServer: every recorded end just past the real
// one: the accomplice's Q is the server's real next sequence number + 1
// (the recorded server end Q+2 just past it: the server's segments after
// the close, its ACKs of "again", fall below it), the pod's S its next - 1
// (the recorded pod end S+2 just past its next). The lab's server has
// half-closed: after the close it sends ACKs only, no data.
func TestShare25MasqAlignedServer(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "61100-61131")
	r := a23RoundFull(t, lab, outsideIP, 7586, 0, "s25as", 49500, 8, false, func(t *testing.T, a *a23Conn) {
		a25SynAckCheatAt(t, a, a.snd-1, a.rcv+1)
	})
	a25Check(t, "share25 aligned server end", r)
}

// TestShare25MasqAlignedIPv6: TestShare25MasqAlignedPod's cheat over IPv6.
func TestShare25MasqAlignedIPv6(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "61200-61231")
	r := a23RoundFull(t, lab, outsideIP6, 7588, 0, "s25a6", 49700, 8, false, func(t *testing.T, a *a23Conn) {
		a25SynAckCheatAt(t, a, a.snd+5, a.rcv+1)
	})
	a25Check(t, "share25 aligned pod and server ends (IPv6)", r)
}
