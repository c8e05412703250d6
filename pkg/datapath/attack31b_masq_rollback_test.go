package datapath

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
)

// preAttack31Commit is main before attack31's and pkt31's waiting FIN/RST
// rules (docs/upgrade.md: a same-layout rollback).
const preAttack31Commit = "8e9cbb2"

// uplinkObjectsAt is the to_uplink and from_uplink objects of an earlier
// commit of this repository (its history: a shallow clone fails the test,
// as testenv.BuildAt).
func uplinkObjectsAt(t *testing.T, commit string) (to, from *object) {
	t.Helper()
	at := func(name string) *object {
		b, err := exec.Command("git", "show", commit+":pkg/datapath/"+name+"_bpfel.o").Output()
		if err != nil {
			t.Fatalf("%s's %s object (a shallow clone? git fetch --unshallow): %v", commit, name, err)
		}
		return &object{name: name + "_" + commit, bytes: b,
			load: func() (*ebpf.CollectionSpec, error) { return ebpf.LoadCollectionSpecFromReader(bytes.NewReader(b)) }}
	}
	return at("to_uplink"), at("from_uplink")
}

// useObjects loads the uplink programs of to and from over the flow's maps
// (pinned under dir below the datapath's pin root) and sends the flow's
// next segments through them: another build on the same node, its maps
// as they are.
func (m *masqFlow) useObjects(dir string, to, from *object) {
	m.t.Helper()
	out := map[string]*ebpf.Program{}
	m.t.Cleanup(func() { closePrograms(out) })
	for _, o := range []*object{to, from} {
		var progs []Program
		for _, p := range uplinkPrograms() {
			if p.obj == objToUplink && o == to || p.obj == objFromUplink && o == from {
				progs = append(progs, p)
			}
		}
		must(m.t, loadObject(filepath.Join(m.dp.PinRoot, dir), m.dp.Maps, o, progs, true, out))
	}
	t := m.t
	m.out = func(f []byte, in uint32) (uint32, parsed) { return runFromFrame(t, out["cni_to_uplink"], f, in) }
	m.in = func(f []byte, in uint32) (uint32, parsed) { return runFromFrame(t, out["cni_from_uplink"], f, in) }
}

const snatPeerRST = 1 << 11 // SNAT_F_PEER_RST, on forward entries

// TestAttack31bMasqRollbackWaitingRST checks what docs/upgrade.md says of
// pkt31's waiting RST across a rollback to the build before it
// (preAttack31Commit, same layout) and forward again:
//   - an RST waiting (bits 9 and 11) when the node rolls back: the older
//     build reads a waiting FIN at the RST's number, and the pod's ACK of
//     it counts a FIN of the server's (FLOW_F_FIN_REPLY), not closing; bit
//     11 stays on the forward entry.
//   - a forged RST waiting, rolled back, the server's real FIN out of order
//     put to wait by the older build beside the bit 11 it leaves, rolled
//     forward: this build reads a waiting RST at the FIN's end, and the
//     pod's ACK of it closes the flow (FLOW_F_CLOSING, 10 s) instead of
//     counting the server's FIN (a half-closed flow whose pod still sends
//     loses its translation 10 s later). What docs/upgrade.md says; kept
//     here so that a change of it is seen.
func TestAttack31bMasqRollbackWaitingRST(t *testing.T) {
	flow := masq30cFlows(t, 170)
	at := nodeIP
	oldTo, oldFrom := uplinkObjectsAt(t, preAttack31Commit)

	m := flow()
	m.open(at)
	m.reordered(at, m.p+1)
	m.fromServer("RST at the pod's next", at, m.s+21, 0, rstFlag, nil)
	if fl := m.fwdFlags(); fl&(snatPeerFIN|snatPeerRST) != snatPeerFIN|snatPeerRST {
		t.Fatalf("the RST ahead of end does not wait: forward flags %#x", fl)
	}
	m.useObjects("old1", oldTo, oldFrom)
	m.fromPod("ACK of the reordered data (before the RST)", m.p+1, m.s+21, ackFlag, nil)
	fl, share := m.state()
	t.Logf("rolled back with an RST waiting, the pod's ACK of its number: flags %#x, share %d, forward flags %#x", fl, share, m.fwdFlags())
	if fl&flowFinReply == 0 || fl&flowClosingBit != 0 {
		t.Errorf("rolled back, the pod's ACK of the waiting RST's number: flags %#x; docs/upgrade.md: a FIN of the server's counted, not closing", fl)
	}
	if ff := m.fwdFlags(); ff&(snatPeerFIN|snatPeerRST) != snatPeerRST {
		t.Errorf("rolled back, the wait counted: forward flags %#x; docs/upgrade.md: bit 11 kept alone", ff)
	}

	m = flow()
	m.open(at)
	m.reordered(at, m.p+1)
	m.fromServer("forged RST far ahead", at, m.s+5000, 0, rstFlag, nil)
	m.useObjects("old2", oldTo, oldFrom)
	m.fromServer("real FIN out of order (the older build)", at, m.s+21, m.p+1, finFlag|ackFlag, nil)
	if ff := m.fwdFlags(); ff&(snatPeerFIN|snatPeerRST) != snatPeerFIN|snatPeerRST {
		t.Fatalf("the older build's waiting FIN beside bit 11: forward flags %#x", ff)
	}
	m.useObjects("new2", objToUplink, objFromUplink)
	m.fromPod("ACK of the FIN (this build again)", m.p+1, m.s+22, ackFlag, nil)
	fl, share = m.state()
	t.Logf("rolled forward, the older build's FIN read as an RST, the pod's ACK of its end: flags %#x, share %d", fl, share)
	if fl&flowClosingBit == 0 || fl&flowFinReply != 0 {
		t.Errorf("rolled forward, the pod's ACK of the older build's waiting FIN beside bit 11: flags %#x; docs/upgrade.md: closing, the server's FIN not counted", fl)
	}
}
