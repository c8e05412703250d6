package compile

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// Pods share the compile work at two levels:
//
//   - a policy's contribution (one direction of one policy, flattened) is
//     computed once per change of its peers and reused by every pod it
//     selects; ingress named ports resolve on the selected pod, so the
//     ingress contribution is kept per distinct resolution (namedSig);
//   - a pod's answer is the longest-prefix union of the contributions of
//     the policies selecting it (mergeAllows), and pods with the same key
//     (namespace, selecting policies, their named-port resolutions) share
//     one answer: nothing else of the pod enters compile.
//
// Merging flattened tables costs their entries, not the atoms behind them:
// a policy admitting 1000 peers numbered in a row flattens to a few
// prefixes once, and each pod it selects merges those.

// compile is the endpoint of pod, from its group's answer when a pod with
// the same key was compiled since the last change. Callers hold s.mu.
func (s *Snapshot) compile(pod *Pod) policy.Endpoint {
	if pod.HostNetwork {
		return policy.Endpoint{}
	}
	sel := s.selecting(pod)
	key := s.groupKey(pod, sel)
	if ep, ok := s.groups[key]; ok {
		return ep
	}
	var ep policy.Endpoint
	var in, eg [][]policy.Allow
	for _, pe := range sel {
		ep.Policies = append(ep.Policies, pod.Namespace+"/"+pe.key.Name)
		res := s.resolve(pe)
		if pe.ingress {
			ep.Ingress.Isolated = true
			in = append(in, res.ingressFor(pod))
		}
		if pe.egress {
			ep.Egress.Isolated = true
			eg = append(eg, res.egressFlat())
		}
	}
	ep.Ingress.Allows = mergeAllows(in)
	ep.Egress.Allows = mergeAllows(eg)
	s.groups[key] = ep
	return ep
}

// selecting returns the policies selecting pod, by name.
func (s *Snapshot) selecting(pod *Pod) []*policyEntry {
	by := s.selectedBy[PodKey{pod.Namespace, pod.Name}]
	sel := make([]*policyEntry, 0, len(by))
	for pe := range by {
		sel = append(sel, pe)
	}
	slices.SortFunc(sel, func(a, b *policyEntry) int { return strings.Compare(a.key.Name, b.key.Name) })
	return sel
}

// groupKey says everything compile reads of pod: its namespace, the
// policies selecting it and, of those with ingress named ports, how they
// resolve on it. Names hold no NUL; a signature's length follows from its
// policy (see namedSig), so the key is unambiguous.
func (s *Snapshot) groupKey(pod *Pod, sel []*policyEntry) string {
	var b []byte
	b = append(b, pod.Namespace...)
	for _, pe := range sel {
		b = append(b, 0)
		b = append(b, pe.key.Name...)
		b = append(b, 0)
		if pe.ingress {
			b = s.resolve(pe).appendNamedSig(b, pod)
		}
	}
	return string(b)
}

// appendNamedSig appends how the ingress named ports of the rules resolve
// on pod: per rule with named ports (their number is the policy's), the
// count of resolved ranges, then each range.
func (res *resolved) appendNamedSig(b []byte, pod *Pod) []byte {
	for _, rr := range res.in {
		if len(rr.named) == 0 {
			continue
		}
		own := namedOn(pod, rr.named)
		b = binary.BigEndian.AppendUint16(b, uint16(len(own.ranges)))
		for _, r := range own.ranges {
			b = append(b, r.Proto)
			b = binary.BigEndian.AppendUint16(b, r.First)
			b = binary.BigEndian.AppendUint16(b, r.Last)
		}
	}
	return b
}

// ingressAtoms is the policy's ingress for pod before flattening: the
// numeric rules' atoms and the named-port rules' peers with the ports the
// names resolve to on pod.
func (res *resolved) ingressAtoms(pod *Pod) []atom {
	var atoms []atom
	for _, rr := range res.in {
		atoms = append(atoms, rr.atoms...)
		if len(rr.named) == 0 {
			continue
		}
		own := namedOn(pod, rr.named)
		if own.empty() {
			continue
		}
		for _, a := range rr.peers {
			a.ports = own
			atoms = append(atoms, a)
		}
	}
	return atoms
}

// ingressFor is the policy's ingress contribution for pod: the numeric
// rules' atoms and, for the named ports, the peers with the ports they
// resolve to on pod; flattened once per distinct resolution.
func (res *resolved) ingressFor(pod *Pod) []policy.Allow {
	sig := string(res.appendNamedSig(nil, pod))
	if flat, ok := res.inFlat[sig]; ok {
		return flat
	}
	flat := flatten(res.ingressAtoms(pod))
	if res.inFlat == nil {
		res.inFlat = map[string][]policy.Allow{}
	}
	res.inFlat[sig] = flat
	return flat
}

// egressFlat is the policy's egress contribution, the same for every pod
// it selects (egress named ports resolve on the destinations).
func (res *resolved) egressFlat() []policy.Allow {
	if !res.egDone {
		var atoms []atom
		for _, rr := range res.eg {
			atoms = append(atoms, rr.atoms...)
		}
		res.egFlat, res.egDone = flatten(atoms), true
	}
	return res.egFlat
}

// mergeAllows is the union of longest-prefix tables: for every address,
// the ports any of them allows it. Halves are merged pairwise so k tables
// of n entries cost n log k, then the result is aggregated like flatten's.
func mergeAllows(tables [][]policy.Allow) []policy.Allow {
	switch len(tables) {
	case 0:
		return nil
	case 1:
		return tables[0] // flatten's output: canonical already
	}
	var merge func([][]policy.Allow) []policy.Allow
	merge = func(t [][]policy.Allow) []policy.Allow {
		if len(t) == 1 {
			return t[0]
		}
		return merge2(merge(t[:len(t)/2]), merge(t[len(t)/2:]))
	}
	out := aggregate(merge(tables))
	if len(out) == 0 {
		return nil
	}
	return out
}

// merge2 is the union of two longest-prefix tables, each sorted by address
// then length. The prefixes that matter are both tables' own; at each, the
// union's value is a's answer there (its longest entry covering it, or
// nothing) with b's. That is exact for every address whose longest prefix
// among both tables is P: any entry of either table containing the address
// covers P. Entries equal to their enclosing one are dropped, as in
// flatten.
func merge2(a, b []policy.Allow) []policy.Allow {
	type frame struct {
		prefix netip.Prefix
		value  portSet
	}
	// leave drops the frames that do not enclose p: in this order, a
	// prefix that does not cover p covers nothing after it either.
	leave := func(st []frame, p netip.Prefix) []frame {
		for len(st) > 0 && !prefixCovers(st[len(st)-1].prefix, p) {
			st = st[:len(st)-1]
		}
		return st
	}
	top := func(st []frame) portSet {
		if len(st) == 0 {
			return portSet{}
		}
		return st[len(st)-1].value
	}
	var sa, sb, so []frame
	out := make([]policy.Allow, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		var p netip.Prefix
		switch {
		case j == len(b):
			p = a[i].Prefix
		case i == len(a):
			p = b[j].Prefix
		case comparePrefix(a[i].Prefix, b[j].Prefix) <= 0:
			p = a[i].Prefix
		default:
			p = b[j].Prefix
		}
		sa, sb, so = leave(sa, p), leave(sb, p), leave(so, p)
		if i < len(a) && a[i].Prefix == p {
			sa = append(sa, frame{p, allowValue(a[i])})
			i++
		}
		if j < len(b) && b[j].Prefix == p {
			sb = append(sb, frame{p, allowValue(b[j])})
			j++
		}
		v := union(top(sa), top(sb))
		parent := top(so)
		so = append(so, frame{p, v})
		if v.equal(parent) {
			continue
		}
		out = append(out, policy.Allow{Prefix: p, AllPorts: v.all, Ports: v.ranges})
	}
	return out
}
