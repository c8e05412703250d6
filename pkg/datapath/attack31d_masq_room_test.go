package datapath

import (
	"fmt"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// attack31d: hostile review of masqout31's cut (SNAT_F_ROOM: the pod's data
// segment within the 2^24-block of H moves H from the forward entry alone,
// no reverse lookup), on hand-made segments through cni_to_uplink and
// cni_from_uplink, as TestMasqRoomBoundsPodEnd. The cut decides on the
// forward entry alone, so every change of the flow's state that the
// reverse lookup would see has to reach the forward entry too.

// TestAttack31dRoomPeerEvents (guard): the room is set (the pod's first
// data), then an event of either side changes the flow's state; the
// reverse entry is then deleted (as the LRU may take it) and the pod sends
// data in H's block: H must stay where it was, which only the lookup
// (finding no reverse entry) leaves it, i.e. the cut was not taken. The
// control (no event) shows the cut is taken there: H moves. Events: the
// server's FIN in order (counted: FLOW_F_FIN_REPLY mirrored on the forward
// entry), its FIN out of order (waiting on the forward entry,
// SNAT_F_PEER_FIN), its RST at end (FLOW_F_CLOSING), its RST ahead of end
// (waiting, SNAT_F_PEER_RST), the pod's FIN the server acknowledged
// (FLOW_F_FIN_ORIG), and both FINs (the flow released: its payload must
// reach snat_share_back through the lookup). Full and compat builds.
func TestAttack31dRoomPeerEvents(t *testing.T) {
	flow := masq30cFlows(t, 230)
	at := nodeIP
	events := []struct {
		name string
		do   func(m *masqFlow)
		cut  bool // the cut is taken (the control)
	}{
		{"none", func(m *masqFlow) {}, true},
		{"server FIN in order", func(m *masqFlow) {
			m.fromServer("FIN", at, m.s+1, m.p+11, finFlag|ackFlag, nil)
		}, false},
		{"server FIN out of order", func(m *masqFlow) {
			m.fromServer("data out of order", at, m.s+11, m.p+11, ackFlag|0x08, []byte("abcdefghij"))
			m.fromServer("FIN out of order", at, m.s+21, m.p+11, finFlag|ackFlag, nil)
		}, false},
		{"server RST at end", func(m *masqFlow) {
			m.fromServer("RST", at, m.s+1, 0, rstFlag, nil)
		}, false},
		{"server RST ahead of end", func(m *masqFlow) {
			m.fromServer("data out of order", at, m.s+11, m.p+11, ackFlag|0x08, []byte("abcdefghij"))
			m.fromServer("RST ahead", at, m.s+21, 0, rstFlag, nil)
		}, false},
		{"pod FIN acknowledged", func(m *masqFlow) {
			m.fromPod("FIN", m.p+11, m.s+1, finFlag|ackFlag, nil)
			m.fromServer("ACK of the FIN", at, m.s+1, m.p+12, ackFlag, nil)
		}, false},
		{"both FINs (released)", func(m *masqFlow) {
			m.fromPod("FIN", m.p+11, m.s+1, finFlag|ackFlag, nil)
			m.fromServer("FIN-ACK", at, m.s+1, m.p+12, finFlag|ackFlag, nil)
			m.fromPod("ACK of the server's FIN", m.p+12, m.s+2, ackFlag, nil)
		}, false},
	}
	for _, compat := range []bool{false, true} {
		for _, ev := range events {
			m := flow()
			if compat {
				m.useObjects(fmt.Sprintf("compat%d", m.podPort), objToUplink.compat, objFromUplink.compat)
			}
			m.open(at)
			m.fromPod("data", m.p+1, m.s+1, ackFlag|0x08, []byte("0123456789"))
			if h, fl := m.fwdEnd(), m.fwdFlags(); h != m.p+11 || fl&snatRoom == 0 {
				t.Fatalf("compat %v, %s: the pod's first data: H %#x, forward flags %#x; want H %#x and the room", compat, ev.name, h, fl, m.p+11)
			}
			ev.do(m)
			h0 := m.fwdEnd()
			fl0 := m.fwdFlags()
			rfl, share := m.state()
			m.dropReverse()
			// Data in H's block, one block-length's quarter on: within the
			// room, so the cut moves H there if it is taken.
			seq := h0 + 0x1000
			m.fromPod("data in H's block, no reverse entry", seq, m.s+1, ackFlag|0x08, []byte("0123456789"))
			h := m.fwdEnd()
			t.Logf("compat %v, %s: reverse flags %#x, share %d, forward flags %#x; H %#x -> %#x", compat, ev.name, rfl, share, fl0, h0, h)
			if ev.cut && h != seq+10 {
				t.Errorf("compat %v, %s: H %#x, want %#x: the cut not taken (the harness sees nothing)", compat, ev.name, h, seq+10)
			}
			if !ev.cut && h != h0 {
				t.Errorf("compat %v, %s (reverse flags %#x, forward %#x): H moved %#x -> %#x without the reverse entry: the cut was taken over a state it does not know", compat, ev.name, rfl, fl0, h0, h)
			}
		}
	}
}

// TestAttack31dRoomAckWalk: SNAT_F_ROOM's bound rests on "A only moves
// forward", which holds modulo 2^32 only: the server's pure ACKs, each at
// exactly its next number and at most SNAT_ACK_BOUND past A, walk A three
// times 2^30 forward (acknowledging data the pod never sent: a server in
// league with the pod), which leaves A 2^30 behind where it was. Within
// the second the pod's data at the last number of H's block then moves H
// through the cut to 2^30 + 2^24 past A, past the bound; the older build
// (the lookup, snat_end_move) reads H past the bound as behind A and
// leaves it at A. What the tracking does with it next decides: the pod's
// FIN at that end and the server's ACK of it, then the server's FIN and
// the pod's ACK, must leave the flow in the same state (reverse flags,
// share) as with the build before masqout31.
func TestAttack31dRoomAckWalk(t *testing.T) {
	flow := masq30cFlows(t, 250)
	at := nodeIP
	oldTo, oldFrom := uplinkObjectsAt(t, preMasqout31Commit)
	type result struct {
		h, a         uint32
		flags        uint16
		share        int
		finH, finFlg uint16
	}
	run := func(old bool) result {
		m := flow()
		if old {
			m.useObjects(fmt.Sprintf("old%d", m.podPort), oldTo, oldFrom)
		}
		m.open(at)
		m.fromPod("data", m.p+1, m.s+1, ackFlag|0x08, []byte("0123456789"))
		a := m.p + 1
		for i := 0; i < 3; i++ {
			a += snatAckBound
			m.fromServer("ACK of data never sent", at, m.s+1, a, ackFlag, nil)
		}
		end := (m.p+11)&^(snatRoomBlock-1) + snatRoomBlock - 1
		m.fromPod("data at the block's last number", end-10, m.s+1, ackFlag|0x08, []byte("0123456789"))
		r := result{h: m.fwdEnd(), a: a}
		m.fromPod("FIN", end, m.s+1, finFlag|ackFlag, nil)
		m.fromServer("ACK of the FIN", at, m.s+1, end+1, ackFlag, nil)
		r.finFlg, _ = m.state()
		m.fromServer("server FIN", at, m.s+1, end+1, finFlag|ackFlag, nil)
		m.fromPod("ACK of the server's FIN", end+1, m.s+2, ackFlag, nil)
		r.flags, r.share = m.state()
		return r
	}
	nw, od := run(false), run(true)
	t.Logf("this build: H %#x (%#x past A %#x), after the pod's FIN acked: flags %#x; after both FINs: flags %#x, share %d", nw.h, nw.h-nw.a, nw.a, nw.finFlg, nw.flags, nw.share)
	t.Logf("older build %s: H %#x (%#x past A %#x), after the pod's FIN acked: flags %#x; after both FINs: flags %#x, share %d", preMasqout31Commit, od.h, od.h-od.a, od.a, od.finFlg, od.flags, od.share)
	if nw.finFlg != od.finFlg || nw.flags != od.flags || nw.share != od.share {
		t.Errorf("the ACK walk then data through the cut: this build's flow ends as flags %#x/%#x share %d, the older build's %#x/%#x share %d", nw.finFlg, nw.flags, nw.share, od.finFlg, od.flags, od.share)
	}
}

// TestAttack31dRoomEdgeWalk (guard): attack21's walk at the blocks' edges,
// the server acknowledging nothing (A stays at the SYN-ACK's): each step
// the pod's data ends at the last number of H's block (the cut), then at
// the first of the next block (the lookup), then a retransmission back
// into the block before (the lookup; H must not move back). After every
// segment H must be what the rule without the cut gives (snat_end_move:
// H moves to an end in (H, A + SNAT_ACK_BOUND] only), so never past the
// bound; low numbers and across the wrap, IPv4 and IPv6.
func TestAttack31dRoomEdgeWalk(t *testing.T) {
	flow := masq30cFlows(t, 270)
	move := func(h, a, end uint32) uint32 { // snat_end_move
		if h-a > snatAckBound {
			h = a
		}
		if o := end - a; o <= snatAckBound && o > h-a {
			return end
		}
		return h
	}
	for _, c := range []struct {
		ipv6 bool
		p    uint32
	}{{false, 1000}, {false, 0xfff00000}, {true, 0xfff00000}} {
		m := flow()
		m.p, m.s = c.p, 5000
		at := nodeIP
		if c.ipv6 {
			must(t, putEndpoint(m.dp.Maps, podIP6, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, maps.EndpointFlagMasq)))
			m.pod, m.far, at = podIP6, farIP6, nodeIP6
		}
		m.open(at)
		a := m.p + 1
		h := a
		seg := func(what string, end uint32) {
			t.Helper()
			m.fromPod(what, end-10, m.s+1, ackFlag|0x08, []byte("0123456789"))
			h = move(h, a, end)
			if got := m.fwdEnd(); got != h || got-a > snatAckBound {
				t.Fatalf("p %#x ipv6 %v: %s ending %#x: H %#x (%#x past A %#x), want %#x", c.p, c.ipv6, what, end, got, got-a, a, h)
			}
		}
		seg("data", m.p+11)
		cut := 0
		for i := 0; i < 80; i++ {
			last := h | (snatRoomBlock - 1)
			room := m.fwdFlags()&snatRoom != 0
			seg("data at the block's last number", last)
			if room && h == last {
				cut++
			}
			seg("data at the next block's first number", last+11)
			seg("retransmission into the block before", last-100)
		}
		if h-a < snatAckBound-snatRoomBlock || cut < 50 {
			t.Errorf("p %#x ipv6 %v: the walk reached %#x past A, %d steps through the cut; want near SNAT_ACK_BOUND and most steps cut", c.p, c.ipv6, h-a, cut)
		}
		t.Logf("p %#x ipv6 %v: H %#x past A after the walk, %d steps with the room", c.p, c.ipv6, h-a, cut)
	}
}
