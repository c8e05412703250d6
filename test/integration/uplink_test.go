// Uplinks: re-created uplinks, other programs on the hook, a second pin
// directory in one netns refused.

package integration

import (
	"net"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// The node-level uplink hooks: checked against the
// kernel's links, cooperative with other tcx programs, one pinDir per netns.

// TestUplinkRecreated: an uplink deleted and created again under its name
// (a new ifindex, as a re-created VLAN or bond gets) is given its programs
// by the next ADD that needs them, not only by the agent: hostPorts answer
// on it again and masquerade leaves through it.
func TestUplinkRecreated(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	e.Extra["ipMasq"] = true
	p1, p2 := e.NewPod(), e.NewPod()
	e.MustAddHP(p1, "p1", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "udp"})
	serve(t, p1, 80, "p1")
	serve(t, p2, 80, "p2")
	serve(t, e.remote, 7000, "remote")
	for _, proto := range []string{"tcp", "udp"} {
		expectServer(t, e.remote, proto, hp(uplinkIP4, 8080), "p1")
	}

	before := e.HostIfindex("uplink0")
	if err := e.InNode(func() error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		return netlink.LinkDel(l) // its peer in the remote netns goes with it
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.plugUplink(); err != nil {
		t.Fatal(err)
	}
	if after := e.HostIfindex("uplink0"); after == before {
		t.Fatalf("the new uplink0 has the old ifindex %d", before)
	}

	// The next ADD that needs the uplink programs attaches them.
	e.MustAddHP(p2, "p2", testenv.PM{HostPort: 8082, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 8082, ContainerPort: 80, Protocol: "udp"})
	for _, proto := range []string{"tcp", "udp"} {
		expectServer(t, e.remote, proto, hp(uplinkIP4, 8080), "p1")
		expectServer(t, e.remote, proto, hp(uplinkIP4, 8082), "p2")
		mustAsk(t, p2, proto, hp(remoteIP4, 7000), 0, "remote", uplinkIP4)
	}
	if err := e.CheckHP(p1, "p1", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "udp"}); err != nil {
		t.Errorf("CHECK after the uplink came back: %v", err)
	}
}

// countingProgram is a tc program that counts the packets it sees and
// passes them on.
func countingProgram(t *testing.T) (*ebpf.Program, *ebpf.Map) {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SchedCLS,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, m
}

func readCount(t *testing.T, m *ebpf.Map) uint64 {
	t.Helper()
	var k uint32
	var v uint64
	if err := m.Lookup(&k, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestUplinkNextProgramRuns: packets the uplink programs leave alone go on
// to the next tcx program of the link (another tool's, or a second
// pinDir's): a counter attached after them sees the node's own traffic in
// both directions, and masqueraded packets on their way out.
func TestUplinkNextProgramRuns(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	e.Extra["ipMasq"] = true
	p := e.NewPod()
	e.MustAddHP(p, "p", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	serve(t, e.remote, 7000, "remote")

	idx := e.HostIfindex("uplink0")
	counters := map[ebpf.AttachType]*ebpf.Map{}
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		prog, m := countingProgram(t)
		var l link.Link
		if err := e.InNode(func() error {
			var err error
			l, err = link.AttachTCX(link.TCXOptions{Interface: idx, Program: prog, Attach: at, Anchor: link.Tail()})
			return err
		}); err != nil {
			t.Fatalf("attach the counter to %s of uplink0: %v", at, err)
		}
		t.Cleanup(func() { l.Close() })
		counters[at] = m
	}
	if err := testenv.Ping(e.remote, uplinkIP4, 3); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Ping(e.remote, uplinkIP6, 3); err != nil {
		t.Fatal(err)
	}
	if n := readCount(t, counters[ebpf.AttachTCXIngress]); n < 6 {
		t.Errorf("the program after ebpf-cni's on uplink ingress saw %d packets, want the 6 echo requests at least", n)
	}
	egress := readCount(t, counters[ebpf.AttachTCXEgress])
	if egress < 6 {
		t.Errorf("the program after ebpf-cni's on uplink egress saw %d packets, want the 6 echo replies at least", egress)
	}
	// A masqueraded flow: translated by ebpf-cni, then still seen by the next one.
	mustAsk(t, p, "tcp", hp(remoteIP4, 7000), 0, "remote", uplinkIP4)
	if n := readCount(t, counters[ebpf.AttachTCXEgress]); n <= egress {
		t.Errorf("masqueraded packets did not reach the program after ebpf-cni's on uplink egress (%d, %d before)", n, egress)
	}
}

// TestUplinkSecondPinDirRefused: a second pin directory serving the same
// netns would attach uplink programs of its own beside the first's, with
// hostPorts and masquerade ports of its own: its ADDs that need them fail
// with error 50 naming the reason and leave nothing behind, and the first
// network keeps working. Plain pods of the second network still work.
func TestUplinkSecondPinDirRefused(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	p := e.NewPod()
	e.MustAddHP(p, "p", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	serve(t, p, 80, "p")

	y := e.Sibling(t)
	for _, c := range []struct {
		name  string
		extra map[string]any
		pms   []testenv.PM
	}{
		{"portMappings", map[string]any{"capabilities": map[string]bool{"portMappings": true}}, []testenv.PM{{HostPort: 9090, ContainerPort: 80, Protocol: "tcp"}}},
		{"ipMasq", map[string]any{"ipMasq": true}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			y.Extra = c.extra
			q := e.NewPod()
			id := "y-" + c.name
			y.CleanupDel(q, id)
			_, err := y.AddHP(q, id, c.pms...)
			if err == nil {
				t.Fatalf("ADD on a second pinDir of the netns succeeded")
			}
			if testenv.ErrCode(err) != 50 || !strings.Contains(err.Error(), "another pin directory") {
				t.Fatalf("error %d %q, want 50 naming the other pin directory", testenv.ErrCode(err), err)
			}
			y.AssertNothingOf(id)
		})
	}
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "p")

	y.Extra = nil
	q1, q2 := e.NewPod(), e.NewPod()
	y.CleanupDel(q1, "y1")
	y.CleanupDel(q2, "y2")
	y.Add(q1, "y1")
	r2 := y.Add(q2, "y2")
	v4, v6 := testenv.PodIPs(t, r2)
	for _, ip := range []net.IP{v4, v6} {
		if err := testenv.Ping(q1, ip, 2); err != nil {
			t.Error(err)
		}
	}
}
