// hostPort fragment notes under attack (lib/hostport.h, cni_hp_frag_notes):
// a flood of first fragments between a datagram's first and later
// fragments, and a later fragment that overtakes its first one, with the
// counters `ebpf-agent dump ct` shows (cni_hp_frag_stats).

package integration

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// hpFragCounters are the fragment counters of `ebpf-agent dump ct -o json`.
func hpFragCounters(t *testing.T, e *hpEnv) map[string]uint64 {
	t.Helper()
	out, err := e.AgentCmd("dump", "ct", "-o", "json", "--pin-dir", e.PinDir, "--state-dir", e.StateDir)
	if err != nil {
		t.Fatalf("ebpf-agent dump ct: %v\n%s", err, out)
	}
	var d struct {
		Counters map[string]uint64 `json:"counters"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("ebpf-agent dump ct -o json: %v\n%s", err, out)
	}
	for _, k := range []string{"frag_noted", "frag_later", "frag_no_note"} {
		if _, ok := d.Counters[k]; !ok {
			t.Fatalf("ebpf-agent dump ct has no counter %s: %v", k, d.Counters)
		}
	}
	return d.Counters
}

// fragLab is a hostPort lab with pod p's UDP hostPort 8101 (port 101,
// listened on), the legitimate clients' target, and pod q's UDP hostPort
// 8102, the flood's (its own netns: the flood fills q's reassembly memory,
// not p's).
type fragLab struct {
	*hpEnv
	got            map[int]func(time.Duration) []string
	remMAC, upMAC  net.HardwareAddr
	flood4, flood6 net.IP // the flooding client's addresses, on the remote host's link
}

func newFragLab(t *testing.T) *fragLab {
	e := newHPEnv(t)
	p, q := e.NewPod(), e.NewPod()
	e.MustAddHP(p, "fragp", testenv.PM{HostPort: 8101, ContainerPort: 101, Protocol: "udp"})
	e.MustAddHP(q, "fragq", testenv.PM{HostPort: 8102, ContainerPort: 102, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, p)
	testenv.WaitIPv6Ready(t, q)
	t.Cleanup(func() {
		e.MustDel(p, "fragp")
		e.MustDel(q, "fragq")
		e.AssertNoHostPorts()
	})
	return &fragLab{
		hpEnv: e, got: map[int]func(time.Duration) []string{4: listenUDP4(t, p, 101), 6: listenUDP6(t, p, 101)},
		remMAC: linkMAC(t, e.remote, "eth0"), upMAC: linkMAC(t, e.Node, "uplink0"),
		flood4: net.ParseIP("198.51.100.77").To4(), flood6: net.ParseIP("fd00:51::77"),
	}
}

// datagram is a datagram of the remote host to p's hostPort in two
// fragments (24 bytes, then the rest) with identification id.
func (l *fragLab) datagram(fam int, id uint32, payload []byte) (first, last []byte) {
	src, dst := map[int]net.IP{4: remoteIP4, 6: remoteIP6}[fam], map[int]net.IP{4: uplinkIP4, 6: uplinkIP6}[fam]
	d := udpDatagram(src, 40400, dst, 8101, payload)
	return fragFrame(l.remMAC, l.upMAC, src, dst, id, 0, true, d[:24]),
		fragFrame(l.remMAC, l.upMAC, src, dst, id, 3, false, d[24:])
}

// flood is n first fragments of the flooding client to q's hostPort, each
// a datagram of its own (identifications from base).
func (l *fragLab) flood(t *testing.T, fam int, n int, base uint32) {
	src, dst := map[int]net.IP{4: l.flood4, 6: l.flood6}[fam], map[int]net.IP{4: uplinkIP4, 6: uplinkIP6}[fam]
	d := udpDatagram(src, 40500, dst, 8102, make([]byte, 48))
	frames := make([][]byte, 0, n)
	for i := 0; i < n; i++ {
		frames = append(frames, fragFrame(l.remMAC, l.upMAC, src, dst, base+uint32(i), 0, true, d[:24]))
	}
	sendFramesCPU(t, l.remote, "eth0", frames, 0)
}

func (l *fragLab) arrived(fam int, payload []byte) bool {
	g := l.got[fam](2 * time.Second)
	return len(g) == 1 && strings.HasPrefix(g[0], string(payload)+" from ")
}

// oldNotes is the size of cni_hp_frags, the notes before cni_hp_frag_notes.
const oldNotes = 2048

// TestHostPortFragmentNoteFlood: a client (the remote host) sends a
// datagram's first fragment, another client floods 4 x 2048 first
// fragments (each its own datagram) to another pod's open hostPort, then
// the first client sends the datagram's last fragment; IPv4 and IPv6. The
// datagram arrives whole in the pod: its note outlives the flood (before,
// cni_hp_frags' 2048 notes were evicted by it and the datagram was lost),
// and the flood's notes are counted (frag_noted). The bound is what the
// notes hold (MAX_HP_FRAG_NOTES, 16384): a flood of 2 x 16384 evicts the
// note, the datagram is lost, and its later fragment is counted as having
// found none (frag_no_note).
func TestHostPortFragmentNoteFlood(t *testing.T) {
	l := newFragLab(t)
	for fam, id := range map[int]uint32{4: 0x1000, 6: 0x100000} {
		payload := []byte(strings.Repeat("flooded but whole ", 3))
		first, last := l.datagram(fam, id, payload)
		before := hpFragCounters(t, l.hpEnv)
		sendFramesCPU(t, l.remote, "eth0", [][]byte{first}, 0)
		l.flood(t, fam, 4*oldNotes, id+1)
		sendFrames(t, l.remote, "eth0", [][]byte{last})
		if !l.arrived(fam, payload) {
			t.Errorf("IPv%d: a datagram between whose fragments %d first fragments of another client came was lost", fam, 4*oldNotes)
		}
		after := hpFragCounters(t, l.hpEnv)
		if n := after["frag_noted"] - before["frag_noted"]; n < 4*oldNotes+1 {
			t.Errorf("IPv%d: frag_noted rose by %d, want the flood's %d and the datagram's", fam, n, 4*oldNotes)
		}
		if n := after["frag_no_note"] - before["frag_no_note"]; n != 0 {
			t.Errorf("IPv%d: frag_no_note rose by %d, want 0", fam, n)
		}

		// Past the bound: the note is evicted, and that is counted.
		first, last = l.datagram(fam, id+0x4000, payload)
		before = after
		// All on one CPU: a note another CPU wrote waits in that CPU's
		// list of the LRU, where this CPU's inserts do not evict it.
		sendFramesCPU(t, l.remote, "eth0", [][]byte{first}, 0)
		l.flood(t, fam, 2*16384, id+0x4001)
		sendFrames(t, l.remote, "eth0", [][]byte{last})
		if l.arrived(fam, payload) {
			t.Errorf("IPv%d: a datagram outlived a flood of %d first fragments between its fragments: the bound is not what docs/hostport.md says", fam, 2*16384)
		}
		after = hpFragCounters(t, l.hpEnv)
		if n := after["frag_no_note"] - before["frag_no_note"]; n != 1 {
			t.Errorf("IPv%d: frag_no_note rose by %d after a flood evicted a note, want 1", fam, n)
		}
		t.Logf("IPv%d: past the bound, frag_noted rose by %d", fam, after["frag_noted"]-before["frag_noted"])
	}
}

// TestHostPortFragmentOvertaken: the remote host sends a datagram's last
// fragment before its first (as some stacks do, and as multipath networks
// reorder). The last fragment finds no note, goes on to the node's stack
// untranslated (it may be a node socket's), and is counted (frag_no_note),
// IPv4 and IPv6. The datagram is lost (docs/hostport.md: the fragment is
// gone before the ports that would translate it arrive; Cilium drops it
// alike), which the test pins so a change of it is seen; the same
// datagram in order right after arrives.
func TestHostPortFragmentOvertaken(t *testing.T) {
	l := newFragLab(t)
	for fam, id := range map[int]uint32{4: 0x2000, 6: 0x200000} {
		payload := []byte(strings.Repeat("last first ", 4))
		first, last := l.datagram(fam, id, payload)
		before := hpFragCounters(t, l.hpEnv)
		sendFrames(t, l.remote, "eth0", [][]byte{last, first})
		if l.arrived(fam, payload) {
			t.Errorf("IPv%d: the datagram whose last fragment came first arrived: update docs/hostport.md and this test", fam)
		}
		after := hpFragCounters(t, l.hpEnv)
		if n := after["frag_no_note"] - before["frag_no_note"]; n != 1 {
			t.Errorf("IPv%d: frag_no_note rose by %d, want 1 (the overtaking fragment)", fam, n)
		}
		first, last = l.datagram(fam, id+1, payload)
		sendFrames(t, l.remote, "eth0", [][]byte{first, last})
		if !l.arrived(fam, payload) {
			t.Errorf("IPv%d: the datagram in order after it was lost", fam)
		}
	}
}
