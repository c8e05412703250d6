// attack23: attack21's jumps of the pod's highest end round the sequence
// space, with its real data in flight and with an accomplice outside
// forging the server's ACKs: red while the highest end moves on the pod's
// word alone (attack21's open defect, docs/masquerade.md), and the attacks
// a fix bounding it by the server's acknowledgement must hold against.

package integration

import "testing"

// a23Jumps moves the pod's highest end round the sequence space from from
// to one below it in five raw data segments the server drops (attack21's),
// each preceded, if forge, by forged "server" ACKs of its end from the
// accomplice: 16 of them, their sequence numbers spread over the space
// (blind: the accomplice does not know the server's).
func a23Jumps(t *testing.T, a *a23Conn, from uint32, forge bool) {
	end := from
	for i := 0; i < 5; i++ {
		end += 858993459
		if forge {
			for k := uint32(0); k < 16; k++ {
				a.srvSeg(t, a.rcv+k<<28+12345, end, 0x10)
			}
		}
		a.podSeg(t, end-10, a.rcv, 0x18, make([]byte, 10))
	}
}

// TestAttack23MasqShareJumpsInFlight (RED on land18: attack21's open
// defect, the pod's highest end moved on its word alone): attack21's jumps with the pod's real
// data in flight: the pod writes 1 MiB on the connection (real data to X,
// the socket's write_seq), and at once, before the server acknowledged it,
// moves its highest end round the space to X-1 and sends a FIN at X-1,
// which the server takes for an old retransmission once the data is in and
// acknowledges by exactly X.
func TestAttack23MasqShareJumpsInFlight(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "63000-63031")
	n := a23Round(t, lab, 7530, 0, "a23jf", 41000, 8, false, func(t *testing.T, a *a23Conn) {
		a.c.Write(a23Lines(1 << 20))
		snd, _ := a20Seqs(t, a.c)
		a23Jumps(t, a, snd, false)
		a.podSeg(t, snd-1, a.rcv, 0x11, nil)
	})
	if n > 8 {
		t.Errorf("attack23: RED pod holds %d live connections to one server, over its share of 8: attack21's jumps round the sequence space with 1 MiB of real data in flight, then a FIN one below its next, counted", n)
	}
}

// TestAttack23MasqShareForgedAcksThenJumps (RED on land18: attack21's open
// defect; the forged ACKs matter only once the end is bounded by the
// server's acknowledgement): before each of attack21's five
// jumps the accomplice outside sends, on the node's masqueraded tuple, 16
// forged "server" ACKs acknowledging the jump's end, blind sequence numbers
// spread over the space (one lands within any window of 2^28): an
// acknowledgement moved by them would let the jumps through a bound of
// "server's ack plus window". Then the FIN one below the pod's next.
func TestAttack23MasqShareForgedAcksThenJumps(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "63100-63131")
	n := a23Round(t, lab, 7531, 0, "a23fa", 42000, 8, false, func(t *testing.T, a *a23Conn) {
		a23Jumps(t, a, a.snd, true)
		a.podSeg(t, a.snd-1, a.rcv, 0x11, nil)
	})
	if n > 8 {
		t.Errorf("attack23: RED pod holds %d live connections to one server, over its share of 8: forged server ACKs from outside (blind sequence numbers) acknowledging far ahead, attack21's jumps, then a FIN one below its next, counted", n)
	}
}

// TestAttack23MasqShareIPv6Jumps (RED on land18: attack21's open defect,
// IPv6 too): attack21's jumps round the sequence space, then a FIN one
// below the pod's next, over IPv6.
func TestAttack23MasqShareIPv6Jumps(t *testing.T) {
	t.Parallel()
	lab := f20Lab(t, "64300-64331")
	n := a23RoundAt(t, lab, outsideIP6, 7580, 0, "a23v6j", 49000, 8, false, func(t *testing.T, a *a23Conn) {
		a23Jumps(t, a, a.snd, false)
		a.podSeg(t, a.snd-1, a.rcv, 0x11, nil)
	})
	if n > 8 {
		t.Errorf("attack23: RED pod holds %d live IPv6 connections to one server, over its share of 8: attack21's jumps round the sequence space, then a FIN one below its next, counted (attack21's open defect, over IPv6)", n)
	}
}
