package compile

import (
	"net/netip"
	"slices"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// atom is one resolved allowance: addresses in prefix but in none of except
// may use ports. A NetworkPolicy rule becomes one atom per ipBlock, one per
// pod address its selectors match, and one per pod address a named egress
// port resolves on.
type atom struct {
	prefix netip.Prefix // masked
	except []netip.Prefix
	ports  portSet
}

func (a atom) contains(addr netip.Addr) bool {
	if !a.prefix.Contains(addr) {
		return false
	}
	for _, e := range a.except {
		if e.Contains(addr) {
			return false
		}
	}
	return true
}

// prefixCovers reports whether every address of p is in q.
func prefixCovers(q, p netip.Prefix) bool {
	return q.Bits() <= p.Bits() && q.Contains(p.Addr())
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// flatten turns the union of atoms into the longest-prefix-match form of
// policy.Rules. The prefixes that matter are every atom's prefix and every
// except hole; for each such P the value is the union of the ports of every
// atom covering P whose holes do not cover P. That is exact for every address
// A whose longest matching prefix is P: the prefixes containing A form a
// chain, so an atom's prefix (or hole) contains A exactly when it covers P.
// An entry whose value equals its nearest enclosing entry's (or that is
// empty with none) changes no answer and is dropped.
func flatten(atoms []atom) []policy.Allow {
	if len(atoms) == 0 {
		return nil
	}
	items := flatItems(atoms)

	type frame struct {
		prefix netip.Prefix
		cum    portSet // atoms without holes at this prefix and every enclosing one
		value  portSet // the entry's answer
		holed  int     // len(chain) when pushed
	}
	var (
		stack   []frame
		chain   []int // atoms with holes at the prefixes on the stack
		out     []policy.Allow
		scratch []policy.PortRange
	)
	for i := 0; i < len(items); {
		p := items[i].prefix
		// This prefix's atoms: those without holes merge into one set.
		plain := portSet{}
		scratch = scratch[:0]
		f := frame{prefix: p}
		// Leave the prefixes that do not enclose p.
		for len(stack) > 0 && !prefixCovers(stack[len(stack)-1].prefix, p) {
			chain = chain[:stack[len(stack)-1].holed]
			stack = stack[:len(stack)-1]
		}
		f.holed = len(chain)
		for ; i < len(items) && items[i].prefix == p; i++ {
			ai := items[i].atom
			if ai < 0 {
				continue
			}
			a := atoms[ai]
			switch {
			case len(a.except) > 0:
				chain = append(chain, ai)
			case a.ports.all:
				plain = allPorts
			case !plain.all:
				scratch = append(scratch, a.ports.ranges...)
			}
		}
		if !plain.all && len(scratch) > 0 {
			plain = portSet{ranges: normalize(slices.Clone(scratch))}
		}
		var parent portSet // nothing encloses p: the answer there is deny
		if len(stack) > 0 {
			parent = stack[len(stack)-1].value
			f.cum = union(stack[len(stack)-1].cum, plain)
		} else {
			f.cum = plain
		}
		f.value = withUnholed(atoms, chain, p, f.cum)
		stack = append(stack, f)
		if f.value.equal(parent) {
			continue
		}
		out = append(out, policy.Allow{Prefix: p, AllPorts: f.value.all, Ports: slices.Clone(f.value.ranges)})
	}
	return aggregate(out)
}

// flatItem is a prefix that matters to flatten, with the atom it carries
// (-1: a hole only).
type flatItem struct {
	prefix netip.Prefix
	atom   int
}

// flatItems lists every prefix that matters, sorted by address then
// length: each prefix comes after the prefixes enclosing it, so a stack
// holds the chain of enclosing prefixes.
func flatItems(atoms []atom) []flatItem {
	items := make([]flatItem, 0, len(atoms))
	for i, a := range atoms {
		if a.ports.empty() {
			continue
		}
		items = append(items, flatItem{a.prefix, i})
		for _, e := range a.except {
			items = append(items, flatItem{e, -1})
		}
	}
	slices.SortFunc(items, func(x, y flatItem) int {
		if c := comparePrefix(x.prefix, y.prefix); c != 0 {
			return c
		}
		return x.atom - y.atom
	})
	return items
}

// withUnholed is v with the ports of each atom of chain none of whose holes
// covers p.
func withUnholed(atoms []atom, chain []int, p netip.Prefix, v portSet) portSet {
	for _, ai := range chain {
		if v.all {
			break
		}
		a := atoms[ai]
		holed := false
		for _, e := range a.except {
			if prefixCovers(e, p) {
				holed = true
				break
			}
		}
		if !holed {
			v = union(v, a.ports)
		}
	}
	return v
}

func allowValue(a policy.Allow) portSet { return portSet{all: a.AllPorts, ranges: a.Ports} }

func parentPrefix(p netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(p.Addr(), p.Bits()-1).Masked()
}

// aggregate merges the two halves of a prefix into it when both are entries
// with the same value: neighbouring pod addresses allowed alike (a node's
// pods are numbered in a row) cost one entry. The merged entry answers for
// exactly the halves' addresses, as they did (what lies inside a half stays
// and, longer, still decides for its own addresses); an entry that was at
// the parent prefix was wholly shadowed by the halves and goes. Bottom-up, so
// merges cascade; then entries equal to their enclosing entry drop again.
func aggregate(in []policy.Allow) []policy.Allow {
	if len(in) < 2 {
		return in
	}
	entries := make(map[netip.Prefix]policy.Allow, len(in))
	var levels [129][]netip.Prefix
	for _, e := range in {
		entries[e.Prefix] = e
		levels[e.Prefix.Bits()] = append(levels[e.Prefix.Bits()], e.Prefix)
	}
	merged := false
	for bits := 128; bits > 0; bits-- {
		for _, p := range levels[bits] {
			e, ok := entries[p]
			if !ok {
				continue // merged with its other half already
			}
			q := otherHalf(p)
			f, ok := entries[q]
			if !ok || !allowValue(e).equal(allowValue(f)) {
				continue
			}
			delete(entries, p)
			delete(entries, q)
			parent := parentPrefix(p)
			if _, ok := entries[parent]; !ok {
				levels[bits-1] = append(levels[bits-1], parent)
			}
			entries[parent] = policy.Allow{Prefix: parent, AllPorts: e.AllPorts, Ports: e.Ports}
			merged = true
		}
	}
	if !merged {
		return in
	}
	out := make([]policy.Allow, 0, len(entries))
	for _, e := range entries {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b policy.Allow) int { return comparePrefix(a.Prefix, b.Prefix) })
	return dropRedundant(out)
}

// otherHalf is the prefix of the same length sharing p's parent.
func otherHalf(p netip.Prefix) netip.Prefix {
	b := p.Addr().AsSlice()
	i := p.Bits() - 1
	b[i/8] ^= 0x80 >> (i % 8)
	a, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(a, p.Bits())
}

// dropRedundant removes entries equal to their nearest enclosing entry and
// empty entries that nothing encloses.
func dropRedundant(in []policy.Allow) []policy.Allow {
	out := in[:0]
	var stack []policy.Allow
	for _, e := range in {
		for len(stack) > 0 && !prefixCovers(stack[len(stack)-1].Prefix, e.Prefix) {
			stack = stack[:len(stack)-1]
		}
		var parent portSet
		if len(stack) > 0 {
			parent = allowValue(stack[len(stack)-1])
		}
		stack = append(stack, e)
		if !allowValue(e).equal(parent) {
			out = append(out, e)
		}
	}
	return out
}
