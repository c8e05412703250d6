package compile

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s).Masked() }

func tcp(first, last uint16) policy.PortRange {
	return policy.PortRange{Proto: policy.ProtoTCP, First: first, Last: last}
}

func ports(r ...policy.PortRange) portSet { return portSet{ranges: normalize(r)} }

func TestNormalize(t *testing.T) {
	udp := func(f, l uint16) policy.PortRange { return policy.PortRange{Proto: policy.ProtoUDP, First: f, Last: l} }
	for _, c := range []struct {
		in, want []policy.PortRange
	}{
		{nil, nil},
		{[]policy.PortRange{tcp(80, 80)}, []policy.PortRange{tcp(80, 80)}},
		// overlapping, adjacent, contained, and another protocol kept apart
		{[]policy.PortRange{udp(80, 80), tcp(90, 100), tcp(80, 85), tcp(86, 89), tcp(95, 96)}, []policy.PortRange{tcp(80, 100), udp(80, 80)}},
		// the top of the range does not wrap into port 0
		{[]policy.PortRange{tcp(65535, 65535), tcp(0, 0)}, []policy.PortRange{tcp(0, 0), tcp(65535, 65535)}},
		{[]policy.PortRange{tcp(0, 65535), tcp(65535, 65535)}, []policy.PortRange{tcp(0, 65535)}},
	} {
		got := normalize(append([]policy.PortRange(nil), c.in...))
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("normalize(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestFlatten(t *testing.T) {
	for _, c := range []struct {
		name  string
		atoms []atom
		want  []policy.Allow
	}{
		{"nothing", nil, nil},
		{"one pod, one port",
			[]atom{{prefix: pfx("10.0.0.5/32"), ports: ports(tcp(80, 80))}},
			[]policy.Allow{{Prefix: pfx("10.0.0.5/32"), Ports: []policy.PortRange{tcp(80, 80)}}}},
		{"same prefix from two rules: union",
			[]atom{
				{prefix: pfx("10.0.0.5/32"), ports: ports(tcp(80, 80))},
				{prefix: pfx("10.0.0.5/32"), ports: ports(tcp(81, 90))},
			},
			[]policy.Allow{{Prefix: pfx("10.0.0.5/32"), Ports: []policy.PortRange{tcp(80, 90)}}}},
		{"except hole becomes an empty entry",
			[]atom{{prefix: pfx("10.0.0.0/8"), except: []netip.Prefix{pfx("10.1.0.0/16")}, ports: allPorts}},
			[]policy.Allow{
				{Prefix: pfx("10.0.0.0/8"), AllPorts: true},
				{Prefix: pfx("10.1.0.0/16")},
			}},
		{"pod inside the hole allowed by another rule gets only that rule",
			[]atom{
				{prefix: pfx("10.0.0.0/8"), except: []netip.Prefix{pfx("10.1.0.0/16")}, ports: ports(tcp(443, 443))},
				{prefix: pfx("10.1.2.3/32"), ports: ports(tcp(80, 80))},
			},
			[]policy.Allow{
				{Prefix: pfx("10.0.0.0/8"), Ports: []policy.PortRange{tcp(443, 443)}},
				{Prefix: pfx("10.1.0.0/16")},
				{Prefix: pfx("10.1.2.3/32"), Ports: []policy.PortRange{tcp(80, 80)}},
			}},
		{"pod inside the CIDR (not the hole) gets both",
			[]atom{
				{prefix: pfx("10.0.0.0/8"), except: []netip.Prefix{pfx("10.1.0.0/16")}, ports: ports(tcp(443, 443))},
				{prefix: pfx("10.2.0.1/32"), ports: ports(tcp(80, 80))},
			},
			[]policy.Allow{
				{Prefix: pfx("10.0.0.0/8"), Ports: []policy.PortRange{tcp(443, 443)}},
				{Prefix: pfx("10.1.0.0/16")},
				{Prefix: pfx("10.2.0.1/32"), Ports: []policy.PortRange{tcp(80, 80), tcp(443, 443)}},
			}},
		{"a pod the CIDR already allows the same way is dropped",
			[]atom{
				{prefix: pfx("10.0.0.0/8"), ports: allPorts},
				{prefix: pfx("10.2.0.1/32"), ports: ports(tcp(80, 80))},
			},
			[]policy.Allow{{Prefix: pfx("10.0.0.0/8"), AllPorts: true}}},
		{"a hole of one rule filled by a wider rule keeps the wider rule's value",
			[]atom{
				{prefix: pfx("0.0.0.0/0"), ports: ports(tcp(53, 53))},
				{prefix: pfx("10.0.0.0/8"), except: []netip.Prefix{pfx("10.1.0.0/16")}, ports: allPorts},
			},
			[]policy.Allow{
				{Prefix: pfx("0.0.0.0/0"), Ports: []policy.PortRange{tcp(53, 53)}},
				{Prefix: pfx("10.0.0.0/8"), AllPorts: true},
				{Prefix: pfx("10.1.0.0/16"), Ports: []policy.PortRange{tcp(53, 53)}},
			}},
		{"holes of an unrelated prefix add nothing, atoms without ports add nothing",
			[]atom{
				{prefix: pfx("10.0.0.0/8"), ports: allPorts},
				{prefix: pfx("11.0.0.0/8"), except: []netip.Prefix{pfx("11.1.0.0/16")}, ports: portSet{}},
			},
			[]policy.Allow{{Prefix: pfx("10.0.0.0/8"), AllPorts: true}}},
		{"neighbouring pods alike merge, up the tree",
			[]atom{
				{prefix: pfx("10.0.0.4/32"), ports: ports(tcp(80, 80))},
				{prefix: pfx("10.0.0.5/32"), ports: ports(tcp(80, 80))},
				{prefix: pfx("10.0.0.6/32"), ports: ports(tcp(80, 80))},
				{prefix: pfx("10.0.0.7/32"), ports: ports(tcp(80, 80))},
				{prefix: pfx("10.0.0.8/32"), ports: ports(tcp(80, 80))}, // its half 10.0.0.9 is no entry
				{prefix: pfx("10.0.0.10/32"), ports: ports(tcp(81, 81))},
				{prefix: pfx("10.0.0.11/32"), ports: ports(tcp(80, 80))}, // alike, not the same value
			},
			[]policy.Allow{
				{Prefix: pfx("10.0.0.4/30"), Ports: []policy.PortRange{tcp(80, 80)}},
				{Prefix: pfx("10.0.0.8/32"), Ports: []policy.PortRange{tcp(80, 80)}},
				{Prefix: pfx("10.0.0.10/32"), Ports: []policy.PortRange{tcp(81, 81)}},
				{Prefix: pfx("10.0.0.11/32"), Ports: []policy.PortRange{tcp(80, 80)}},
			}},
		{"merged halves replace their parent's entry and may then equal the enclosing one",
			[]atom{
				{prefix: pfx("10.0.0.0/24"), ports: ports(tcp(80, 80))},
				{prefix: pfx("10.0.0.0/24"), except: []netip.Prefix{pfx("10.0.0.4/30")}, ports: ports(tcp(443, 443))},
				{prefix: pfx("10.0.0.4/31"), ports: ports(tcp(443, 443))},
				{prefix: pfx("10.0.0.6/31"), ports: ports(tcp(443, 443))},
			},
			[]policy.Allow{{Prefix: pfx("10.0.0.0/24"), Ports: []policy.PortRange{tcp(80, 80), tcp(443, 443)}}}},
		{"v4 and v6 apart, v4 first",
			[]atom{
				{prefix: pfx("::/0"), ports: allPorts},
				{prefix: pfx("0.0.0.0/0"), ports: allPorts},
				{prefix: pfx("fd00::1/128"), ports: ports(tcp(80, 80))},
			},
			[]policy.Allow{{Prefix: pfx("0.0.0.0/0"), AllPorts: true}, {Prefix: pfx("::/0"), AllPorts: true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := flatten(c.atoms)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("flatten:\n got %v\nwant %v", got, c.want)
			}
		})
	}
}

// bruteForce is the meaning of the atoms before flattening: allowed when any
// atom contains the address and allows the port.
func bruteForce(atoms []atom, addr netip.Addr, proto uint8, port uint16) bool {
	for _, a := range atoms {
		if a.contains(addr) && a.ports.allows(proto, port) {
			return true
		}
	}
	return false
}

// randomPrefix draws prefixes inside base (so they overlap a lot) with
// lengths from base's to the full address.
func randomPrefix(r *rand.Rand, base netip.Prefix) netip.Prefix {
	a := randomAddr(r, base)
	bits := base.Bits() + r.IntN(a.BitLen()-base.Bits()+1)
	return netip.PrefixFrom(a, bits).Masked()
}

func randomAddr(r *rand.Rand, base netip.Prefix) netip.Addr {
	b := base.Addr().AsSlice()
	for i := base.Bits(); i < len(b)*8; i++ {
		if r.IntN(2) == 1 {
			b[i/8] |= 0x80 >> (i % 8)
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func randomPorts(r *rand.Rand) portSet {
	if r.IntN(6) == 0 {
		return allPorts
	}
	var rs []policy.PortRange
	for range r.IntN(4) {
		proto := []uint8{policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP}[r.IntN(3)]
		first := uint16(r.IntN(20))
		rs = append(rs, policy.PortRange{Proto: proto, First: first, Last: first + uint16(r.IntN(4))})
	}
	return portSet{ranges: normalize(rs)}
}

// lastAddr is the highest address of p, a boundary worth probing.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// randomAtom is an allowed prefix of base's family: everything of the
// family, a pod, or a random prefix (sometimes with holes), with random
// ports.
func randomAtom(r *rand.Rand, base netip.Prefix) atom {
	var a atom
	switch r.IntN(10) {
	case 0:
		a.prefix = netip.PrefixFrom(base.Addr(), 0).Masked() // everything of the family
	case 1, 2, 3:
		a.prefix = netip.PrefixFrom(randomAddr(r, base), base.Addr().BitLen()) // a pod
	default:
		a.prefix = randomPrefix(r, base)
	}
	if a.prefix.Bits() < a.prefix.Addr().BitLen() && r.IntN(2) == 0 {
		for range 1 + r.IntN(3) {
			e := randomPrefix(r, base)
			if e.Bits() > a.prefix.Bits() && a.prefix.Contains(e.Addr()) {
				a.except = append(a.except, e)
			}
		}
	}
	a.ports = randomPorts(r)
	return a
}

// TestFlattenProperty: for random overlapping rules (ipBlocks with holes,
// pod addresses, both families) the longest-prefix answer of the flattened
// entries equals the brute-force answer of the rules, for random addresses,
// every prefix's first and last address, and random protocols and ports.
func TestFlattenProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	bases := []netip.Prefix{pfx("10.0.0.0/24"), pfx("fd00::/120")}
	probes, checked := 0, 0
	iterations := 3000
	if raceEnabled {
		iterations = 300
	}
	for iter := range iterations {
		var atoms []atom
		for range 1 + r.IntN(8) {
			base := bases[r.IntN(2)]
			a := randomAtom(r, base)
			atoms = append(atoms, a)
			// Sometimes a run of neighbouring pods allowed alike, the
			// case aggregation merges.
			if r.IntN(4) == 0 {
				next := randomAddr(r, base)
				for range 2 + r.IntN(6) {
					atoms = append(atoms, atom{prefix: netip.PrefixFrom(next, next.BitLen()), ports: a.ports})
					next = next.Next()
				}
			}
		}
		allows := flatten(atoms)
		rules := policy.Rules{Isolated: true, Allows: allows}
		var addrs []netip.Addr
		for _, a := range atoms {
			addrs = append(addrs, a.prefix.Addr(), lastAddr(a.prefix))
			for _, e := range a.except {
				addrs = append(addrs, e.Addr(), lastAddr(e))
			}
		}
		for range 40 {
			addrs = append(addrs, randomAddr(r, bases[r.IntN(2)]))
		}
		addrs = append(addrs, netip.MustParseAddr("192.168.0.1"), netip.MustParseAddr("2001:db8::1"))
		for _, addr := range addrs {
			for range 8 {
				proto := []uint8{policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP, 1}[r.IntN(4)]
				port := uint16(r.IntN(26))
				want := bruteForce(atoms, addr, proto, port)
				if got := Match(rules, addr, proto, port); got != want {
					t.Fatalf("iteration %d: %s proto %d port %d: flattened %v, rules %v\natoms %s\nentries %v", iter, addr, proto, port, got, want, fmtAtoms(atoms), allows)
				}
				probes++
				if want {
					checked++
				}
			}
		}
		// Canonical: no entry equal to its nearest enclosing entry, no
		// empty entry without an enclosing one.
		for i, e := range allows {
			parent := -1
			for j, q := range allows {
				if j != i && prefixCovers(q.Prefix, e.Prefix) && q.Prefix.Bits() < e.Prefix.Bits() && (parent < 0 || q.Prefix.Bits() > allows[parent].Prefix.Bits()) {
					parent = j
				}
			}
			if parent < 0 && !e.AllPorts && len(e.Ports) == 0 {
				t.Fatalf("iteration %d: empty entry %v encloses nothing", iter, e)
			}
			if parent >= 0 && reflect.DeepEqual(allows[parent].Ports, e.Ports) && allows[parent].AllPorts == e.AllPorts {
				t.Fatalf("iteration %d: entry %v repeats %v", iter, e, allows[parent])
			}
		}
		// Aggregated: no two halves of a prefix left as entries alike.
		for i, e := range allows {
			for _, f := range allows[i+1:] {
				if e.Prefix.Bits() > 0 && e.Prefix.Bits() == f.Prefix.Bits() && parentPrefix(e.Prefix) == parentPrefix(f.Prefix) &&
					allowValue(e).equal(allowValue(f)) {
					t.Fatalf("iteration %d: %v and %v not merged", iter, e, f)
				}
			}
		}
	}
	if checked == 0 || checked == probes {
		t.Fatalf("degenerate test: %d of %d probes allowed", checked, probes)
	}
	t.Logf("%d probes, %d allowed", probes, checked)
}

func fmtAtoms(atoms []atom) string {
	s := ""
	for _, a := range atoms {
		s += fmt.Sprintf("\n  %s except %v ports %+v", a.prefix, a.except, a.ports)
	}
	return s
}
