package maps

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestPortPrefixes: every range is covered by its prefixes exactly, each
// port once, in at most 30 prefixes.
func TestPortPrefixes(t *testing.T) {
	for _, r := range [][2]uint16{{80, 80}, {0, 65535}, {1, 65535}, {8000, 8100}, {1024, 2047}, {65535, 65535}, {3, 5}, {32767, 32768}} {
		ps := portPrefixes(r[0], r[1])
		if len(ps) > 30 {
			t.Errorf("%d-%d: %d prefixes", r[0], r[1], len(ps))
		}
		seen := map[uint32]int{}
		for _, p := range ps {
			n := uint32(1) << (16 - p.bits)
			if uint32(p.port)%n != 0 {
				t.Errorf("%d-%d: prefix %d/%d is not aligned", r[0], r[1], p.port, p.bits)
			}
			for q := uint32(p.port); q < uint32(p.port)+n; q++ {
				seen[q]++
			}
		}
		for q := uint32(0); q <= 65535; q++ {
			in := q >= uint32(r[0]) && q <= uint32(r[1])
			if (in && seen[q] != 1) || (!in && seen[q] != 0) {
				t.Fatalf("%d-%d: port %d covered %d times", r[0], r[1], q, seen[q])
			}
		}
	}
}

func trieLen(t *testing.T, m *Maps, name string) int {
	t.Helper()
	n := 0
	it := m.byName[name].Iterate()
	var k, v []byte
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPolicyWriter: what Apply writes reads back as given; a second Apply
// writes new sets beside the old ones, which go once retired (Flush); bad
// rules are refused without touching the programmed state; Sweep finds the
// sets a DEL left.
func TestPolicyWriter(t *testing.T) {
	m := testMaps(t, DefaultSizing)
	w := m.Policy().Writer()
	ep := policy.Endpoint{
		Ingress: policy.Rules{Isolated: true, Allows: []policy.Allow{
			{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Ports: []policy.PortRange{{Proto: policy.ProtoTCP, First: 80, Last: 80}, {Proto: policy.ProtoTCP, First: 8000, Last: 8100}, {Proto: policy.ProtoUDP, First: 53, Last: 53}}},
			{Prefix: netip.MustParsePrefix("10.1.2.3/32")},
			{Prefix: netip.MustParsePrefix("fd00::/64"), AllPorts: true},
		}},
		Egress:   policy.Rules{Isolated: true},
		Policies: []string{"ns/a", "ns/b"},
	}
	must(t, setPending(m.Policy(), 7))
	if p, ok, err := m.Policy().Read(7); err != nil || !ok || p.Mode != [2]string{"pending", "pending"} {
		t.Fatalf("pending: %+v %v %v", p, ok, err)
	}
	must(t, w.Apply(7, ep))
	got, ok, err := m.Policy().Read(7)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	want := ProgrammedPolicy{Ifindex: 7, Mode: [2]string{"isolated", "isolated"}, Ingress: ep.Ingress, Egress: ep.Egress}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read back\n%+v\nwant\n%+v", got, want)
	}
	if names := w.applied[7].Policies; !reflect.DeepEqual(names, ep.Policies) {
		t.Fatalf("policy names the writer keeps: %v, want %v", names, ep.Policies)
	}
	addrs, ports := trieLen(t, m, namePolAddrs), trieLen(t, m, namePolPorts)
	// Ports: 80; 8000-8100 as 8000/10, 8064/11, 8096/14, 8100/16; UDP 53.
	if addrs != 3 || ports != 6 {
		t.Errorf("entries: %d addresses, %d port prefixes; want 3 and 6", addrs, ports)
	}

	// A change: both sets live until retired.
	ep2 := ep
	ep2.Ingress = policy.Rules{Isolated: true, Allows: []policy.Allow{{Prefix: netip.MustParsePrefix("0.0.0.0/0"), AllPorts: true}}}
	must(t, w.Apply(7, ep2))
	if n := trieLen(t, m, namePolAddrs); n != addrs+1 {
		t.Errorf("after the switch: %d address entries, want the old %d and the new 1", n, addrs)
	}
	w.Flush()
	if n := trieLen(t, m, namePolAddrs); n != 1 {
		t.Errorf("after the old set retired: %d address entries, want 1", n)
	}
	if n := trieLen(t, m, namePolPorts); n != 0 {
		t.Errorf("after the old set retired: %d port entries, want 0", n)
	}
	// The same rules again: nothing written.
	st, _, _ := m.Policy().StateOf(7)
	must(t, w.Apply(7, ep2))
	if st2, _, _ := m.Policy().StateOf(7); st2 != st {
		t.Errorf("an unchanged policy was rewritten: %+v -> %+v", st, st2)
	}

	for _, bad := range []struct {
		r    policy.Rules
		want string
	}{
		{policy.Rules{Isolated: true, Allows: []policy.Allow{{Prefix: netip.MustParsePrefix("10.0.0.1/8")}}}, "not a masked"},
		{policy.Rules{Isolated: true, Allows: []policy.Allow{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}, {Prefix: netip.MustParsePrefix("10.0.0.0/8")}}}, "twice"},
		{policy.Rules{Isolated: true, Allows: []policy.Allow{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Ports: []policy.PortRange{{Proto: 1, First: 1, Last: 1}}}}}, "protocol 1"},
		{policy.Rules{Isolated: true, Allows: []policy.Allow{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Ports: []policy.PortRange{{Proto: 6, First: 9, Last: 1}}}}}, "upside down"},
		{policy.Rules{Allows: []policy.Allow{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), AllPorts: true}}}, "not isolated"},
	} {
		err := w.Apply(7, policy.Endpoint{Ingress: bad.r})
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Apply of %+v: %v, want an error saying %q", bad.r, err, bad.want)
		}
	}
	if st2, _, _ := m.Policy().StateOf(7); st2 != st {
		t.Errorf("a refused policy changed the state: %+v -> %+v", st, st2)
	}

	// DEL forgets the state only; the writer's Sweep finds the set.
	must(t, m.Policy().DeleteOf(7))
	if n, err := w.Sweep(); err != nil || n != 1 {
		t.Errorf("Sweep after DEL: %d, %v; want the one set", n, err)
	}
	if n := trieLen(t, m, namePolAddrs); n != 0 {
		t.Errorf("after Sweep: %d address entries", n)
	}
	// A writer started afresh (an agent restart) finds what is there, and
	// deletes what nothing refers to (a DEL while it was away).
	must(t, w.Apply(9, ep))
	must(t, m.Policy().DeleteOf(9))
	must(t, m.Policy().Writer().Apply(10, policy.Endpoint{}))
	if a := trieLen(t, m, namePolAddrs); a != 0 {
		t.Errorf("a new writer left %d address entries of a deleted interface", a)
	}
	must(t, w.Apply(8, ep))
	w2 := m.Policy().Writer()
	must(t, w2.Remove(8))
	w2.Flush()
	if a, p := trieLen(t, m, namePolAddrs), trieLen(t, m, namePolPorts); a != 0 || p != 0 {
		t.Errorf("a new writer's Remove left %d address and %d port entries", a, p)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestPolicyWriterFull: a policy the trie cannot hold is refused naming the
// map, what was written of it is deleted, and the interface fails closed:
// the direction the policy isolates denies all (its rule set 0), never left
// at the previous policy, which may allow what the new one takes away. A
// retry that fits programs it.
func TestPolicyWriterFull(t *testing.T) {
	m := testMaps(t, Sizing{MaxPods: 1, HostPortsPerPod: 1}) // 512 peer prefixes in all
	w := m.Policy().Writer()
	small := policy.Endpoint{Ingress: policy.Rules{Isolated: true, Allows: []policy.Allow{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), AllPorts: true}}}}
	must(t, w.Apply(3, small))
	var big []policy.Allow
	for i := 0; i < 600; i++ {
		big = append(big, policy.Allow{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)}), 32), AllPorts: true})
	}
	err := w.Apply(3, policy.Endpoint{Ingress: policy.Rules{Isolated: true, Allows: big}})
	if !IsFull(err) || !strings.Contains(err.Error(), namePolAddrs) {
		t.Fatalf("Apply of 600 prefixes into 512: %v, want a full %s", err, namePolAddrs)
	}
	want := PolicyState{}
	want.Mode[DirIngress] = PolicyIsolated
	if after, _, _ := m.Policy().StateOf(3); after != want {
		t.Errorf("state after a refused policy: %+v, want ingress isolated with no rule set: %+v", after, want)
	}
	if n := trieLen(t, m, namePolAddrs); n > 1 {
		t.Errorf("%d address entries after the refusal, want at most the old policy's 1 (retired)", n)
	}
	// The same policy as before the refusal is written again, not taken
	// for the one programmed.
	must(t, w.Apply(3, small))
	if after, _, _ := m.Policy().StateOf(3); after.Rules[DirIngress] == 0 {
		t.Errorf("state after a retry that fits: %+v, want its rule set", after)
	}
}

// TestPolicyWriterFullRestart: a restarted writer (the agent's) rewrites
// every interface beside the old sets; with the trie more than half full
// that cannot fit, and an interface whose old sets already hold exactly
// the policy keeps them rather than failing closed.
func TestPolicyWriterFullRestart(t *testing.T) {
	m := testMaps(t, Sizing{MaxPods: 1, HostPortsPerPod: 1}) // 512 peer prefixes in all
	var allows []policy.Allow
	for i := 0; i < 300; i++ {
		allows = append(allows, policy.Allow{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)}), 32), AllPorts: true})
	}
	ep := policy.Endpoint{Ingress: policy.Rules{Isolated: true, Allows: allows}}
	must(t, m.Policy().Writer().Apply(3, ep))
	before, _, _ := m.Policy().StateOf(3)
	if err := m.Policy().Writer().Apply(3, ep); err != nil {
		t.Fatalf("a restarted writer's Apply of the policy programmed: %v", err)
	}
	if after, _, _ := m.Policy().StateOf(3); after != before {
		t.Errorf("state %+v -> %+v, want the old sets kept", before, after)
	}
	// Another policy that does not fit still fails closed.
	other := policy.Endpoint{Ingress: policy.Rules{Isolated: true, Allows: allows[:299]}}
	if err := m.Policy().Writer().Apply(3, other); !IsFull(err) {
		t.Fatalf("Apply of another 299 prefixes beside 300 in 512: %v, want full", err)
	}
	if after, _, _ := m.Policy().StateOf(3); after.Rules[DirIngress] != 0 || after.Mode[DirIngress] != PolicyIsolated {
		t.Errorf("state after a refused change: %+v, want ingress isolated with no rule set", after)
	}
}
