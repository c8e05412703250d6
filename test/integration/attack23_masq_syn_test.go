// attack23: a pod's SYN on its own live tuple re-seeds the flow's tracking
// (taken for the port reused, docs/masquerade.md, "No pod starves the
// others"), and "the ack counts only once the server's end is known (its
// SYN-ACK seen)". An accomplice outside can supply that SYN-ACK, and odd
// flag combinations may take the SYN path and the FIN path at once.

package integration

import (
	"testing"
	"time"
)

// TestAttack23MasqShareForgedSynAck (RED on land18, a defect of its own,
// not attack21's: no jump, no wrap): on each of its first 8 connections
// (the server's FIN read) the pod sends a raw SYN at a sequence number of
// its choosing S (the server answers with a challenge ACK and changes
// nothing); the accomplice outside answers it with a forged SYN-ACK (its
// own sequence number Q, ack S+1) on the node's tuple; the pod sends a FIN
// at S+1 (out of the server's window: dropped) and the accomplice
// "acknowledges" it with a FIN-ACK at Q+1, which the pod acknowledges. No
// sequence number of the real server is used. On land18, 50 ms between
// the steps, all 8 stop counting: 16 of 16 live at a limit of 8 (2 ms
// apart: 2-3 of 8, 3 runs; without the pod's SYN: none). Right: 8; the
// SYN-ACK that makes the server's end known must be the server's (e.g. a
// SYN on a live tuple not re-seeding it, or a re-seeded flow keeping its
// share until the server's own SYN-ACK answers a SYN it took).
func TestAttack23MasqShareForgedSynAck(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "64400-64431")
	n := a23Round(t, lab, 7590, 0, "a23sa", 49100, 8, false, a23SynAckCheat)
	if n > 8 {
		t.Errorf("attack23: RED pod holds %d live connections to one server, over its share of 8: its raw SYN on its live tuple, a SYN-ACK and FIN-ACK forged from outside (no sequence number of the server's), counted as the flow's close", n)
	}
}

// TestAttack23MasqShareForgedSynAckIPv6 (RED on land18, as
// TestAttack23MasqShareForgedSynAck): the same over IPv6.
func TestAttack23MasqShareForgedSynAckIPv6(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "64900-64931")
	n := a23RoundAt(t, lab, outsideIP6, 7592, 0, "a23s6", 49900, 8, false, a23SynAckCheat)
	if n > 8 {
		t.Errorf("attack23: RED pod holds %d live IPv6 connections to one server, over its share of 8: its raw SYN on its live tuple, a SYN-ACK and FIN-ACK forged from outside, counted as the flow's close", n)
	}
}

// a23SynAckCheat: the pod's SYN at S on its live tuple, the accomplice's
// SYN-ACK (Q, S+1), the pod's FIN at S+1, the accomplice's FIN-ACK (Q+1,
// S+2), the pod's ACK; 50 ms apart.
func a23SynAckCheat(t *testing.T, a *a23Conn) {
	s, q := a.snd+1<<30, uint32(0x12345678)
	a.podSeg(t, s, 0, 0x02, nil)
	time.Sleep(50 * time.Millisecond)
	a.srvSeg(t, q, s+1, 0x12)
	time.Sleep(50 * time.Millisecond)
	a.podSeg(t, s+1, q+1, 0x11, nil)
	time.Sleep(50 * time.Millisecond)
	a.srvSeg(t, q+1, s+2, 0x11)
	a.podSeg(t, s+2, q+2, 0x10, nil)
}
