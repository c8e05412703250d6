package datapath

import (
	"net"
	"testing"
)

// An RST of the server's that arrives while the masquerade's tracking lags
// behind the pod (pkt31, docs/masquerade.md "Reordered"): the tracking's
// end (the server's next sequence number) moves only with segments exactly
// in order, and catches up with data taken out of order only when the
// pod's ACK of it passes. An RST at the pod's next number that overtakes
// that ACK is inexact for the tracking: it counted nothing, the pod's TCP
// took it (exact for it) and sent nothing more, and the flow stayed
// established until its idle timeout. RFC 5961's rule stays: an RST in the
// window but not exact closes nothing by itself; it waits, and the pod's
// next acknowledgement decides. An ACK of exactly its number, sent before
// the pod took the RST, counts it (the flow closes); any other ACK not
// behind the tracking's end (the pod's challenge ACK: its next number is
// elsewhere) drops it, so a forged one cannot wait for the pod's data to
// reach its number later.
const rstFlag = 0x04

// waiting is whether the flow's forward entry holds a waiting FIN or RST
// of the server's.
func (m *masqFlow) waiting() bool {
	m.t.Helper()
	return m.fwdFlags()&snatPeerFIN != 0 // SNAT_F_PEER_FIN marks a waiting FIN or RST
}

// TestMasqPeerRSTReordered: IPv4 and IPv6, each case a connection of its
// own (masqFlow, TestMasqPeerFINReordered's): the server's data reordered
// (the tracking's end stays at s+11 while the pod has everything up to
// s+21), then:
//   - RST at s+21 (the pod's next), the pod's stale duplicate ACK of s+1
//     and its ACK of s+21 passing after it: closing. Red before (the flow
//     stayed established).
//   - RST forged at s+5000: the pod's challenge ACK of s+21, then the pod
//     acknowledging s+5000 (its data reached it): not closing.
//   - RST forged at s+5000 and no ACK from the pod yet: not closing.
//   - RST forged at s+15 (behind the pod's next): the pod's challenge ACK
//     of s+21 drops it (nothing waits), not closing.
//   - RST at s+11 (the tracking's end, exact): closing at once, as before.
func TestMasqPeerRSTReordered(t *testing.T) {
	dp, out, in := masqLab(t)

	for fi, fam := range []struct {
		name          string
		at            net.IP
		podISN, srvSN uint32
	}{
		{"IPv4", nodeIP, 1000, 0xfffffff5}, // the server's numbers wrap past 2^32
		{"IPv6", nodeIP6, 0x7ffffff0, 5000},
	} {
		pod, far := podIP, farIP
		if fi == 1 {
			pod, far = podIP6, farIP6
		}
		n := 0
		flow := func() *masqFlow {
			n++
			return &masqFlow{t: t, dp: dp, out: out, in: in, pod: pod, far: far,
				podPort: uint16(42000 + 10*fi + n), srvPort: uint16(masqPeerFINPort + 100 + 10*fi + n), p: fam.podISN, s: fam.srvSN}
		}
		closing := func(m *masqFlow) bool {
			fl, _ := m.state()
			return fl&flowClosingBit != 0
		}

		m := flow()
		m.open(fam.at)
		m.reordered(fam.at, m.p+1)
		m.fromServer("RST at the pod's next", fam.at, m.s+21, 0, rstFlag, nil)
		if closing(m) {
			t.Fatalf("%s an RST inexact for the tracking closed the flow before the pod's ACK", fam.name)
		}
		m.fromPod("stale duplicate ACK", m.p+1, m.s+1, ackFlag, nil)
		m.fromPod("ACK of the reordered data", m.p+1, m.s+21, ackFlag, nil)
		if fl, _ := m.state(); fl&flowClosingBit == 0 {
			t.Errorf("%s RST at the pod's next, its ACK after: flags %#x; want closing", fam.name, fl)
		}

		m = flow()
		m.open(fam.at)
		m.reordered(fam.at, m.p+1)
		m.fromServer("forged RST", fam.at, m.s+5000, 0, rstFlag, nil)
		m.fromPod("challenge ACK", m.p+1, m.s+21, ackFlag, nil)
		m.fromPod("ACK of data reaching the forged number", m.p+1, m.s+5000, ackFlag, nil)
		if fl, _ := m.state(); fl&flowClosingBit != 0 {
			t.Errorf("%s a forged RST, the pod's challenge ACK, then its ACK of the forged number: flags %#x; want not closing", fam.name, fl)
		}

		m = flow()
		m.open(fam.at)
		m.reordered(fam.at, m.p+1)
		m.fromServer("forged RST", fam.at, m.s+5000, 0, rstFlag, nil)
		if fl, _ := m.state(); fl&flowClosingBit != 0 || !m.waiting() {
			t.Errorf("%s a forged RST in the window: flags %#x, waiting %v; want not closing, the RST waiting", fam.name, fl, m.waiting())
		}

		m = flow()
		m.open(fam.at)
		m.reordered(fam.at, m.p+1)
		m.fromServer("forged RST behind the pod's next", fam.at, m.s+15, 0, rstFlag, nil)
		m.fromPod("challenge ACK", m.p+1, m.s+21, ackFlag, nil)
		if fl, _ := m.state(); fl&flowClosingBit != 0 || m.waiting() {
			t.Errorf("%s a forged RST behind the pod's next, its challenge ACK: flags %#x, waiting %v; want not closing, nothing waiting", fam.name, fl, m.waiting())
		}

		m = flow()
		m.open(fam.at)
		m.reordered(fam.at, m.p+1)
		m.fromServer("RST at the tracking's end", fam.at, m.s+11, 0, rstFlag, nil)
		if fl, _ := m.state(); fl&flowClosingBit == 0 {
			t.Errorf("%s an RST exactly at the tracking's end: flags %#x; want closing", fam.name, fl)
		}
	}
}
