package datapath

import (
	"fmt"
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// masqout31: the pod's data segment of an open flow moves H (the pod's
// highest end, the low word of the forward entry's created_ns) without
// looking the reverse entry up while its end stays in the 2^24-block of
// sequence numbers H was in at the flow's last lookup, which found room
// enough (SNAT_F_ROOM, bit 12 of a forward entry's flags).

const (
	snatRoom      = 1 << 12 // SNAT_F_ROOM, on forward entries
	snatAckBound  = 1 << 30 // SNAT_ACK_BOUND
	snatRoomBlock = 1 << 24 // SNAT_ROOM_BLOCK
)

// fwdEnd is H, the low word of the flow's forward entry's created_ns.
func (m *masqFlow) fwdEnd() uint32 {
	m.t.Helper()
	return uint32(m.fwdEntry().CreatedNs)
}

// dropReverse deletes the flow's reverse entry.
func (m *masqFlow) dropReverse() {
	m.t.Helper()
	var k maps.SNATKey
	var v maps.SNATVal
	mp := mapstest.Map(m.dp.Maps, "cni_snat")
	it := mp.Iterate()
	for it.Next(&k, &v) {
		if k.Dir == 1 && k.PeerPort == htons(m.srvPort) && v.Port == htons(m.podPort) {
			must(m.t, mp.Delete(&k))
			return
		}
	}
	must(m.t, it.Err())
	m.t.Fatalf("no reverse entry of %d -> %d", m.podPort, m.srvPort)
}

// TestMasqRoomBoundsPodEnd: H follows the pod's data in and out of the
// cut, and the cut never takes it past A + SNAT_ACK_BOUND (attack21's
// shape: the pod's segments, each 2^23 past the last, which the server
// never acknowledges, walk H towards the bound through a block after
// another); the room comes back once the server acknowledges, and goes
// with the pod's FIN (its wait is the reverse entry's).
func TestMasqRoomBoundsPodEnd(t *testing.T) {
	flow := masq30cFlows(t, 190)
	// IPv4 with the pod's numbers low and across the wrap, IPv6 and the
	// compat build across the wrap; each case a flow of its own.
	cases := []struct {
		ipv6, compat bool
		p            uint32
	}{{false, false, 1000}, {false, false, 0xfff00000}, {true, false, 0xfff00000}, {false, true, 0xfff00000}}
	setup := func(ipv6, compat bool, p uint32) (*masqFlow, net.IP) {
		m := flow()
		m.p = p
		m.s = 5000
		at := nodeIP
		if ipv6 {
			must(t, putEndpoint(m.dp.Maps, podIP6, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, maps.EndpointFlagMasq)))
			m.pod, m.far, at = podIP6, farIP6, nodeIP6
		}
		if compat {
			m.useObjects(fmt.Sprintf("compat%d", m.podPort), objToUplink.compat, objFromUplink.compat)
		}
		m.open(at)
		return m, at
	}

	for _, c := range cases {
		p := c.p
		m, at := setup(c.ipv6, c.compat, p)
		t.Logf("p %#x ipv6 %v compat %v", p, c.ipv6, c.compat)
		a := m.p + 1 // A: the server's SYN-ACK
		m.fromPod("data", m.p+1, m.s+1, ackFlag|0x08, []byte("0123456789"))
		if h, fl := m.fwdEnd(), m.fwdFlags(); h != m.p+11 || fl&snatRoom == 0 {
			t.Fatalf("p %#x: the pod's first data: H %#x, forward flags %#x; want H %#x and the room", p, h, fl, m.p+11)
		}
		m.fromPod("more data", m.p+11, m.s+1, ackFlag|0x08, []byte("abcdefghij"))
		m.fromPod("a retransmit", m.p+1, m.s+1, ackFlag|0x08, []byte("0123456789"))
		if h := m.fwdEnd(); h != m.p+21 {
			t.Fatalf("p %#x: more data and a retransmit: H %#x, want %#x", p, h, m.p+21)
		}

		// Segments 2^23 apart: two a block, the server acknowledging none.
		var top uint32
		for i := uint32(1); i <= 300; i++ {
			seq := m.p + 21 + i<<23
			m.fromPod("a segment ahead", seq, m.s+1, ackFlag|0x08, []byte("0123456789"))
			h := m.fwdEnd()
			if h-a > snatAckBound {
				t.Fatalf("p %#x: segment %d at %#x: H %#x is %#x past A %#x, past SNAT_ACK_BOUND", p, i, seq, h, h-a, a)
			}
			if h-a > top {
				top = h - a
			}
		}
		if top < snatAckBound-2*snatRoomBlock {
			t.Errorf("p %#x: H went at most %#x past A; want it near SNAT_ACK_BOUND %#x", p, top, snatAckBound)
		}
		if fl := m.fwdFlags(); fl&snatRoom != 0 {
			t.Errorf("p %#x: H %#x past A at the bound: forward flags %#x; want no room", p, top, fl)
		}

		// The server acknowledges H: A moves there, the room comes back.
		h := m.fwdEnd()
		m.fromServer("ACK of the pod's end", at, m.s+1, h, ackFlag, nil)
		m.fromPod("data at H", h, m.s+1, ackFlag|0x08, []byte("0123456789"))
		if h2, fl := m.fwdEnd(), m.fwdFlags(); h2 != h+10 || fl&snatRoom == 0 {
			t.Errorf("p %#x: after the server's ACK of H %#x, data at H: H %#x, forward flags %#x; want H %#x and the room", p, h, h2, fl, h+10)
		}
		m.fromPod("data in the block", h+10, m.s+1, ackFlag|0x08, []byte("0123456789"))
		if h2 := m.fwdEnd(); h2 != h+20 {
			t.Errorf("p %#x: data in the block: H %#x, want %#x", p, h2, h+20)
		}

		// The pod's FIN waits on the reverse entry: no room while it does,
		// and its data after the FIN's end (not its TCP's) ends the wait.
		m.fromPod("FIN", h+20, m.s+1, finFlag|ackFlag, nil)
		if fl := m.fwdFlags(); fl&snatRoom != 0 {
			t.Errorf("p %#x: the pod's FIN waits: forward flags %#x; want no room", p, fl)
		}
		m.fromServer("ACK of the FIN", at, m.s+1, h+21, ackFlag, nil)
		if fl, share := m.state(); fl&(1<<4) == 0 || share != 1 {
			t.Errorf("p %#x: the server's ACK of the pod's FIN: flags %#x, share %d; want the pod's FIN, share 1", p, fl, share)
		}

		// The cut is taken: with the reverse entry gone (as the LRU may
		// take it), the data in H's block still moves H, which the lookup
		// (finding none) would not; the next block's does not.
		m, at = setup(c.ipv6, c.compat, p)
		m.fromPod("data", m.p+1, m.s+1, ackFlag|0x08, []byte("0123456789"))
		m.dropReverse()
		m.fromPod("data, no reverse entry", m.p+11, m.s+1, ackFlag|0x08, []byte("abcdefghij"))
		if h := m.fwdEnd(); h != m.p+21 {
			t.Errorf("p %#x: data in H's block without the reverse entry: H %#x, want %#x (no lookup)", p, h, m.p+21)
		}
		next := (m.p+21)&^(snatRoomBlock-1) + snatRoomBlock
		m.fromPod("data in the next block, no reverse entry", next, m.s+1, ackFlag|0x08, []byte("0123456789"))
		if h := m.fwdEnd(); h != m.p+21 {
			t.Errorf("p %#x: data in the next block without the reverse entry: H %#x, want %#x (the lookup's)", p, h, m.p+21)
		}
	}
}

// preMasqout31Commit is main before SNAT_F_ROOM (docs/upgrade.md: a
// same-layout rollback).
const preMasqout31Commit = "d020e81"

// TestMasqRoomRollback checks what docs/upgrade.md says of SNAT_F_ROOM
// across a rollback to the build before it (same layout) and forward:
//   - the older build keeps the bit (it neither reads nor clears it) and
//     moves H as before;
//   - rolled forward within the second of the older build's last note, a
//     stale bit is taken: the pod's FIN the older build put to wait, then
//     data over the FIN's end (not its TCP's FIN: attack31's raw FIN ahead
//     of data), moves the FIN's end to the data's instead of ending the
//     wait, and the server's ACK of the data counts the FIN. Kept here so
//     that a change of it is seen; with this build throughout, the wait ends.
func TestMasqRoomRollback(t *testing.T) {
	flow := masq30cFlows(t, 210)
	at := nodeIP
	oldTo, oldFrom := uplinkObjectsAt(t, preMasqout31Commit)

	for _, rolled := range []bool{false, true} {
		m := flow()
		// Both builds' programs loaded first: the steps below then run
		// within microseconds, inside the second of the flow's last note
		// (loading a build takes seconds under load).
		out, in := m.out, m.in
		m.useObjects(fmt.Sprintf("old%d", m.podPort), oldTo, oldFrom)
		oldOut, oldIn := m.out, m.in
		m.out, m.in = out, in
		m.open(at)
		m.fromPod("data", m.p+1, m.s+1, ackFlag|0x08, []byte("0123456789"))
		if fl := m.fwdFlags(); fl&snatRoom == 0 {
			t.Fatalf("rolled %v: the pod's first data: forward flags %#x, want the room", rolled, fl)
		}
		if rolled {
			m.out, m.in = oldOut, oldIn
		}
		m.fromPod("more data", m.p+11, m.s+1, ackFlag|0x08, []byte("abcdefghij"))
		if h, fl := m.fwdEnd(), m.fwdFlags(); h != m.p+21 || fl&snatRoom == 0 {
			t.Errorf("rolled %v: more data: H %#x, forward flags %#x; want H %#x, the bit kept", rolled, h, fl, m.p+21)
		}
		m.fromPod("raw FIN ahead of data", m.p+31, m.s+1, finFlag|ackFlag, nil)
		if rolled {
			m.out, m.in = out, in
		}
		m.fromPod("data over the FIN's end", m.p+21, m.s+1, ackFlag|0x08, []byte("0123456789abcdefghij"))
		m.fromServer("ACK of the data", at, m.s+1, m.p+41, ackFlag, nil)
		fl, share := m.state()
		t.Logf("rolled %v: the pod's raw FIN, data over its end, the server's ACK of the data: flags %#x, share %d", rolled, fl, share)
		if !rolled && fl&(1<<4) != 0 {
			t.Errorf("this build throughout: the pod's raw FIN counted at the server's ACK of the data over it: flags %#x; want the wait ended", fl)
		}
		if rolled && fl&(1<<4) == 0 {
			t.Errorf("rolled back and forward: flags %#x; docs/upgrade.md: the stale bit moves the FIN's end to the data's, the ACK counts it", fl)
		}
	}
}
