package compile

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// lpmValue is table's answer for the addresses whose longest prefix is p:
// its longest entry covering p (none: nothing allowed).
func lpmValue(table []policy.Allow, p netip.Prefix) portSet {
	best := -1
	for i, e := range table {
		if prefixCovers(e.Prefix, p) && (best < 0 || e.Prefix.Bits() > table[best].Prefix.Bits()) {
			best = i
		}
	}
	if best < 0 {
		return portSet{}
	}
	return allowValue(table[best])
}

// equivalent reports whether two longest-prefix tables answer alike for
// every address, and else a prefix where they differ. The addresses whose
// longest prefix among both tables is P (those of P outside every longer
// prefix of either) get each table's longest entry covering P; checking
// every such P that keeps an address is exhaustive, and an address inside
// no prefix is denied by both.
func equivalent(a, b []policy.Allow) (netip.Prefix, bool) {
	var all []netip.Prefix
	for _, t := range [][]policy.Allow{a, b} {
		for _, e := range t {
			all = append(all, e.Prefix)
		}
	}
	for _, p := range all {
		if !coveredByLonger(p, all) && !lpmValue(a, p).equal(lpmValue(b, p)) {
			return p, false
		}
	}
	return netip.Prefix{}, true
}

// coveredByLonger reports whether the prefixes of all strictly inside p
// cover every address of p.
func coveredByLonger(p netip.Prefix, all []netip.Prefix) bool {
	var inside []netip.Prefix
	for _, q := range all {
		if q.Bits() > p.Bits() && prefixCovers(p, q) {
			inside = append(inside, q)
		}
	}
	// Count the addresses of the outermost ones (the others are inside
	// those): all of p's when they cover it.
	n, size := new(big.Int), new(big.Int).Lsh(big.NewInt(1), uint(p.Addr().BitLen()-p.Bits()))
	for i, q := range inside {
		outer := true
		for j, o := range inside {
			if j != i && prefixCovers(o, q) && (o.Bits() < q.Bits() || j < i) {
				outer = false
				break
			}
		}
		if outer {
			n.Add(n, new(big.Int).Lsh(big.NewInt(1), uint(q.Addr().BitLen()-q.Bits())))
		}
	}
	return n.Cmp(size) == 0
}

// checkCanonical fails when table is not what flatten would leave: sorted,
// no entry equal to its enclosing one (or empty with none), no two halves
// of a prefix alike.
func checkCanonical(t *testing.T, what string, table []policy.Allow) {
	t.Helper()
	if !slices.IsSortedFunc(table, func(a, b policy.Allow) int { return comparePrefix(a.Prefix, b.Prefix) }) {
		t.Fatalf("%s: not sorted: %v", what, table)
	}
	for i, e := range table {
		parent := -1
		for j, q := range table {
			if j != i && q.Prefix.Bits() < e.Prefix.Bits() && prefixCovers(q.Prefix, e.Prefix) &&
				(parent < 0 || q.Prefix.Bits() > table[parent].Prefix.Bits()) {
				parent = j
			}
		}
		pv := portSet{}
		if parent >= 0 {
			pv = allowValue(table[parent])
		}
		if allowValue(e).equal(pv) {
			t.Fatalf("%s: entry %v changes nothing (enclosing %d)\n%v", what, e, parent, table)
		}
		for _, f := range table[i+1:] {
			if e.Prefix.Bits() > 0 && e.Prefix.Bits() == f.Prefix.Bits() && parentPrefix(e.Prefix) == parentPrefix(f.Prefix) &&
				allowValue(e).equal(allowValue(f)) {
				t.Fatalf("%s: halves %v and %v not merged", what, e, f)
			}
		}
	}
}

// TestMergeAllowsProperty: random atoms split among 1 to 6 tables, each
// flattened on its own; merging the tables answers like flattening all the
// atoms together, for every address (equivalent), and stays canonical.
func TestMergeAllowsProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	bases := []netip.Prefix{pfx("10.0.0.0/24"), pfx("fd00::/120")}
	iterations := 3000
	if raceEnabled {
		iterations = 300
	}
	entries := 0
	for iter := range iterations {
		k := 1 + r.IntN(6)
		groups := make([][]atom, k)
		var all []atom
		for range 1 + r.IntN(12) {
			base := bases[r.IntN(2)]
			a := randomAtom(r, base)
			g := r.IntN(k)
			groups[g] = append(groups[g], a)
			all = append(all, a)
			if r.IntN(4) == 0 { // a run of neighbours alike, in one table or spread
				next := randomAddr(r, base)
				for range 2 + r.IntN(6) {
					n := atom{prefix: netip.PrefixFrom(next, next.BitLen()), ports: a.ports}
					g := r.IntN(k)
					groups[g] = append(groups[g], n)
					all = append(all, n)
					next = next.Next()
				}
			}
		}
		tables := make([][]policy.Allow, k)
		for i, g := range groups {
			tables[i] = flatten(g)
		}
		got := mergeAllows(tables)
		want := flatten(all)
		if p, ok := equivalent(got, want); !ok {
			t.Fatalf("iteration %d: at %s merged %v, flattened together %v\nmerged %v\nwant %v\natoms %s",
				iter, p, lpmValue(got, p), lpmValue(want, p), got, want, fmtAtoms(all))
		}
		// And against the atoms themselves, at each prefix's first address.
		for _, e := range append(slices.Clone(got), want...) {
			for _, proto := range []uint8{policy.ProtoTCP, policy.ProtoUDP} {
				for port := uint16(0); port < 26; port += 5 {
					if Match(policy.Rules{Isolated: true, Allows: got}, e.Prefix.Addr(), proto, port) != bruteForce(all, e.Prefix.Addr(), proto, port) {
						t.Fatalf("iteration %d: %s proto %d port %d differs from the atoms", iter, e.Prefix.Addr(), proto, port)
					}
				}
			}
		}
		checkCanonical(t, fmt.Sprintf("iteration %d", iter), got)
		if len(want) == 0 && got != nil {
			t.Fatalf("iteration %d: nothing allowed but %#v", iter, got)
		}
		entries += len(got)
	}
	t.Logf("%d iterations, %d merged entries", iterations, entries)
}

// denseWorld is a random world with more policies per namespace, so pods
// are selected by several at once, alike and not, and some policies have
// the rules of another (sameRules).
func denseWorld(r *rand.Rand) *world {
	w := randWorld(r)
	for _, ns := range rNS {
		for i := 3; i < 3+r.IntN(5); i++ {
			k := PodKey{ns, fmt.Sprintf("p%d", i)}
			w.policies[k] = randPolicy(r, ns, k.Name)
		}
		for range 2 {
			if np := twinPolicy(r, w, ns); np != nil {
				w.policies[PodKey{ns, np.Name}] = np
			}
		}
	}
	return w
}

// twinPolicy is a policy of ns (p0 to p9) with the rules of another policy
// of the world (of ns or not) and a selector of its own; nil: none to copy.
func twinPolicy(r *rand.Rand, w *world, ns string) *networkingv1.NetworkPolicy {
	var from []*networkingv1.NetworkPolicy
	for _, np := range w.policies {
		from = append(from, np)
	}
	if len(from) == 0 {
		return nil
	}
	slices.SortFunc(from, func(a, b *networkingv1.NetworkPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	np := pick(r, from).DeepCopy()
	np.Namespace, np.Name = ns, fmt.Sprintf("p%d", r.IntN(10))
	if r.IntN(3) > 0 {
		np.Spec.PodSelector = *randSelector(r)
	}
	return np
}

// checkSameAnswer fails unless got (shared compile) answers as the
// per-pod compile does for every address, with the same isolation and
// policy names.
func checkSameAnswer(t *testing.T, what string, got, want policy.Endpoint) {
	t.Helper()
	if got.Ingress.Isolated != want.Ingress.Isolated || got.Egress.Isolated != want.Egress.Isolated ||
		!slices.Equal(got.Policies, want.Policies) {
		t.Fatalf("%s: shared %+v, per pod %+v", what, got, want)
	}
	for _, d := range []struct {
		dir       string
		got, want []policy.Allow
	}{{"ingress", got.Ingress.Allows, want.Ingress.Allows}, {"egress", got.Egress.Allows, want.Egress.Allows}} {
		if p, ok := equivalent(d.got, d.want); !ok {
			t.Fatalf("%s %s: at %s shared %v, per pod %v\nshared %v\nper pod %v", what, d.dir, p,
				lpmValue(d.got, p), lpmValue(d.want, p), d.got, d.want)
		}
		checkCanonical(t, what+" "+d.dir, d.got)
	}
}

// TestSharedMatchesPerPod: random clusters with several policies per
// namespace, then random updates; after each, every pod's Endpoint (shared
// contributions, shared answers per group) answers exactly as the per-pod
// compile of the same snapshot. Pods are compiled in a random order each
// step, so an answer cached for a group meets the other pods of the group.
func TestSharedMatchesPerPod(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	iterations := 120
	if raceEnabled {
		iterations = 15
	}
	compared, shared := 0, 0
	for iter := range iterations {
		w := denseWorld(r)
		s := w.snapshot(t)
		for step := range 30 {
			var keys []PodKey
			for k := range w.pods {
				keys = append(keys, k)
			}
			r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
			seen := map[string]bool{}
			for _, k := range keys {
				got, ok := s.Endpoint(k.Namespace, k.Name)
				want, wok := s.endpointPerPod(k.Namespace, k.Name)
				if ok != wok {
					t.Fatalf("iteration %d step %d: %s known %v, per pod %v", iter, step, k, ok, wok)
				}
				checkSameAnswer(t, fmt.Sprintf("iteration %d step %d %s", iter, step, k), got, want)
				compared++
				// Counted by the backing arrays: equal ones were computed once.
				if len(got.Ingress.Allows)+len(got.Egress.Allows) > 0 {
					sig := fmt.Sprintf("%p %p", got.Ingress.Allows, got.Egress.Allows)
					if seen[sig] {
						shared++
					}
					seen[sig] = true
				}
			}
			// One random update, as TestIncrementalMatchesFresh draws them.
			ns := pick(r, rNS)
			switch r.IntN(6) {
			case 0:
				k := PodKey{ns, pick(r, rPodNames)}
				p := randPod(r, w, k.Namespace, k.Name)
				if old, ok := w.pods[k]; ok && r.IntN(2) == 0 {
					old.Labels = randLabels(r) // relabel only
					p = old
				}
				w.pods[k] = p
				s.UpsertPod(p)
			case 1:
				k := PodKey{ns, pick(r, rPodNames)}
				delete(w.pods, k)
				s.DeletePod(k.Namespace, k.Name)
			case 2:
				l := randLabels(r)
				l[nsKey] = ns
				s.UpsertNamespace(ns, l)
			case 3:
				s.DeleteNamespace(ns)
			case 4:
				np := randPolicy(r, ns, fmt.Sprintf("p%d", r.IntN(10)))
				if r.IntN(2) == 0 {
					if tw := twinPolicy(r, w, ns); tw != nil {
						np = tw
					}
				}
				w.policies[PodKey{ns, np.Name}] = np
				if err := s.UpsertPolicy(np); err != nil {
					t.Fatal(err)
				}
			case 5:
				k := PodKey{ns, fmt.Sprintf("p%d", r.IntN(10))}
				delete(w.policies, k)
				s.DeletePolicy(k.Namespace, k.Name)
			}
			s.TakeDirty()
		}
	}
	t.Logf("%d answers compared, %d taken from another pod's", compared, shared)
	if shared == 0 {
		t.Fatal("degenerate: no two pods shared an answer")
	}
}

func namedIngressPolicy(name string, sel map[string]string, port string) *networkingv1.NetworkPolicy {
	return ingressPolicy("x", name, sel, intstr.FromString(port), sel)
}

// ingressPolicy selects sel in namespace ns and admits, on port, the pods
// of ns that one of from selects.
func ingressPolicy(ns, name string, sel map[string]string, port intstr.IntOrString, from ...map[string]string) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{}
	np.Namespace, np.Name = ns, name
	np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: sel}
	var peers []networkingv1.NetworkPolicyPeer
	for _, f := range from {
		peers = append(peers, networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: f}})
	}
	np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
		From:  peers,
		Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
	}}
	return np
}

// TestNamedPortSplitsPods: pods alike but for the number behind a named
// port get different answers (each its own port, from the same peers,
// each other included); a third like the first shares its answer; and a
// pod with a port of that name only on another protocol gets none.
func TestNamedPortSplitsPods(t *testing.T) {
	lbl := map[string]string{"app": "web"}
	mk := func(name, ip string, ports ...ContainerPort) Pod {
		return Pod{Namespace: "x", Name: name, Labels: lbl, IPs: addrs(ip), Ports: ports}
	}
	a := mk("a", "10.0.0.1", ContainerPort{Name: "http", Proto: policy.ProtoTCP, Port: 8080})
	b := mk("b", "10.0.0.2", ContainerPort{Name: "http", Proto: policy.ProtoTCP, Port: 9090})
	c := mk("c", "10.0.0.3", ContainerPort{Name: "http", Proto: policy.ProtoTCP, Port: 8080})
	d := mk("d", "10.0.0.4", ContainerPort{Name: "http", Proto: policy.ProtoUDP, Port: 8080})
	s := snap(t, []Pod{a, b, c, d}, namedIngressPolicy("p", lbl, "http"))
	peers := []netip.Addr{a.IPs[0], b.IPs[0], c.IPs[0], d.IPs[0]}
	for _, tc := range []struct {
		pod      string
		open, no uint16
	}{{"a", 8080, 9090}, {"b", 9090, 8080}, {"c", 8080, 9090}} {
		ep := mustEndpoint(t, s, "x", tc.pod)
		for _, peer := range peers { // itself among them, as any peer
			if !Match(ep.Ingress, peer, policy.ProtoTCP, tc.open) || Match(ep.Ingress, peer, policy.ProtoTCP, tc.no) {
				t.Fatalf("%s from %s: want tcp/%d only: %+v", tc.pod, peer, tc.open, ep.Ingress)
			}
		}
		if want, _ := s.endpointPerPod("x", tc.pod); !reflect.DeepEqual(ep, want) {
			t.Fatalf("%s: shared %+v, per pod %+v", tc.pod, ep, want)
		}
	}
	ea, ec := mustEndpoint(t, s, "x", "a"), mustEndpoint(t, s, "x", "c")
	if &ea.Ingress.Allows[0] != &ec.Ingress.Allows[0] {
		t.Fatal("a and c resolve alike but were compiled apart")
	}
	if ed := mustEndpoint(t, s, "x", "d"); !ed.Ingress.Isolated || len(ed.Ingress.Allows) != 0 {
		t.Fatalf("d's http is UDP, the rule's TCP: %+v", ed.Ingress)
	}
}

// TestSharedAnswerFollowsChanges: a group's answer is not reused across a
// change: a is compiled, the policy changes, then b (a's twin, never
// compiled) must see the new rules; likewise after a peer appears.
func TestSharedAnswerFollowsChanges(t *testing.T) {
	lbl := map[string]string{"app": "web"}
	a := Pod{Namespace: "x", Name: "a", Labels: lbl, IPs: addrs("10.0.0.1")}
	b := Pod{Namespace: "x", Name: "b", Labels: lbl, IPs: addrs("10.0.0.2")}
	np := func(port int32) *networkingv1.NetworkPolicy {
		p := namedIngressPolicy("p", lbl, "")
		v := intstr.FromInt32(port)
		p.Spec.Ingress[0].Ports[0].Port = &v
		return p
	}
	s := snap(t, []Pod{a, b}, np(80))
	mustEndpoint(t, s, "x", "a")
	if err := s.UpsertPolicy(np(81)); err != nil {
		t.Fatal(err)
	}
	if ep := mustEndpoint(t, s, "x", "b"); !Match(ep.Ingress, a.IPs[0], policy.ProtoTCP, 81) || Match(ep.Ingress, a.IPs[0], policy.ProtoTCP, 80) {
		t.Fatalf("b after the change: %+v", ep.Ingress)
	}
	c := Pod{Namespace: "x", Name: "c", Labels: lbl, IPs: addrs("10.0.0.9")}
	s.UpsertPod(c)
	for _, n := range []string{"a", "b", "c"} {
		if ep := mustEndpoint(t, s, "x", n); !Match(ep.Ingress, c.IPs[0], policy.ProtoTCP, 81) {
			t.Fatalf("%s after peer c appeared: %+v", n, ep.Ingress)
		}
	}
}

// TestEqualRulesShareResolution: two policies of a namespace with the same
// rules and different selectors resolve their peers once; a pod that
// becomes a peer reaches both; a policy whose selector alone changes keeps
// its resolution; one of another namespace with the same rules does not
// share (its podSelector peers are its own namespace's pods).
func TestEqualRulesShareResolution(t *testing.T) {
	web, db := map[string]string{"app": "web"}, map[string]string{"app": "db"}
	cli := map[string]string{"role": "cli"}
	np := func(ns, name string, sel map[string]string) *networkingv1.NetworkPolicy {
		p := namedIngressPolicy(name, sel, "")
		p.Namespace = ns
		v := intstr.FromInt32(80)
		p.Spec.Ingress[0].From[0].PodSelector.MatchLabels = cli
		p.Spec.Ingress[0].Ports[0].Port = &v
		return p
	}
	w := Pod{Namespace: "x", Name: "w", Labels: web, IPs: addrs("10.0.0.1")}
	d := Pod{Namespace: "x", Name: "d", Labels: db, IPs: addrs("10.0.0.2")}
	c1 := Pod{Namespace: "x", Name: "c1", Labels: cli, IPs: addrs("10.0.0.3")}
	y := Pod{Namespace: "y", Name: "yw", Labels: web, IPs: addrs("10.0.1.1")}
	yc := Pod{Namespace: "y", Name: "yc", Labels: cli, IPs: addrs("10.0.1.3")}
	s := snap(t, []Pod{w, d, c1, y, yc}, np("x", "pw", web), np("x", "pd", db), np("y", "pw", web))
	allows := func(pod Pod, from netip.Addr) bool {
		ep := mustEndpoint(t, s, pod.Namespace, pod.Name)
		return Match(ep.Ingress, from, policy.ProtoTCP, 80)
	}
	if !allows(w, c1.IPs[0]) || !allows(d, c1.IPs[0]) || allows(w, yc.IPs[0]) || !allows(y, yc.IPs[0]) || allows(y, c1.IPs[0]) {
		t.Fatal("wrong answers before any change")
	}
	res := func(ns, name string) *resolved { return s.policies[ns][name].res }
	if res("x", "pw") == nil || res("x", "pw") != res("x", "pd") || res("y", "pw") == res("x", "pw") {
		t.Fatalf("resolutions: x/pw %p, x/pd %p, y/pw %p", res("x", "pw"), res("x", "pd"), res("y", "pw"))
	}
	c2 := Pod{Namespace: "x", Name: "c2", Labels: cli, IPs: addrs("10.0.0.4")}
	s.UpsertPod(c2)
	if !allows(w, c2.IPs[0]) || !allows(d, c2.IPs[0]) || allows(y, c2.IPs[0]) {
		t.Fatal("a new peer does not reach both policies")
	}
	before := res("x", "pw")
	if err := s.UpsertPolicy(np("x", "pw", map[string]string{"app": "other"})); err != nil {
		t.Fatal(err)
	}
	if res("x", "pw") != before {
		t.Fatal("a selector change resolved the peers again")
	}
	if ep := mustEndpoint(t, s, "x", "w"); ep.Ingress.Isolated {
		t.Fatalf("w no longer selected: %+v", ep)
	}
}

// TestDeletedPodLeavesSelection: a deleted pod leaves the policies'
// selected sets: a later change of the policy that selected it marks only
// the pods still there (and the sets do not grow with pod churn).
func TestDeletedPodLeavesSelection(t *testing.T) {
	lbl := map[string]string{"app": "web"}
	a := Pod{Namespace: "x", Name: "a", Labels: lbl, IPs: addrs("10.0.0.1")}
	b := Pod{Namespace: "x", Name: "b", Labels: lbl, IPs: addrs("10.0.0.2")}
	s := snap(t, []Pod{a, b}, namedIngressPolicy("p", lbl, "http"))
	s.DeletePod("x", "b")
	s.TakeDirty()
	if err := s.UpsertPolicy(namedIngressPolicy("p", lbl, "https")); err != nil {
		t.Fatal(err)
	}
	if d := s.TakeDirty(); !reflect.DeepEqual(d, []PodKey{{"x", "a"}}) {
		t.Fatalf("dirty after the change: %v, want only x/a", d)
	}
	if sel := s.policies["x"]["p"].selected; len(sel) != 1 {
		t.Fatalf("selected %v", sel)
	}
	if by, ok := s.selectedBy[PodKey{"x", "b"}]; ok {
		t.Fatalf("x/b still selected by %v", by)
	}
}

// TestUnchangedAnswerStaysEqual: a change that leaves a pod's answer alone
// (b is also selected by a policy allowing everything) gives an Endpoint
// equal to the one before, entry for entry, so the agent, which compares
// them, does not rewrite b; a, whose answer changed, differs.
func TestUnchangedAnswerStaysEqual(t *testing.T) {
	web := map[string]string{"app": "web"}
	a := Pod{Namespace: "x", Name: "a", Labels: web, IPs: addrs("10.0.0.1", "fd00::1")}
	b := Pod{Namespace: "x", Name: "b", Labels: map[string]string{"app": "web", "open": "yes"}, IPs: addrs("10.0.0.2", "fd00::2")}
	port := func(n int32) *networkingv1.NetworkPolicy {
		p := namedIngressPolicy("p", web, "")
		v := intstr.FromInt32(n)
		p.Spec.Ingress[0].Ports[0].Port = &v
		return p
	}
	open := &networkingv1.NetworkPolicy{}
	open.Namespace, open.Name = "x", "open"
	open.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"open": "yes"}}
	open.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
	s := snap(t, []Pod{a, b}, port(80), open)
	ea, eb := mustEndpoint(t, s, "x", "a"), mustEndpoint(t, s, "x", "b")
	if err := s.UpsertPolicy(port(81)); err != nil {
		t.Fatal(err)
	}
	if d := s.TakeDirty(); len(d) != 2 {
		t.Fatalf("dirty %v, want a and b", d)
	}
	if got := mustEndpoint(t, s, "x", "b"); !reflect.DeepEqual(got, eb) {
		t.Fatalf("b's answer did not change but its Endpoint did:\n%+v\n%+v", eb, got)
	}
	if got := mustEndpoint(t, s, "x", "a"); reflect.DeepEqual(got, ea) {
		t.Fatal("a's answer changed but its Endpoint did not")
	}
}
