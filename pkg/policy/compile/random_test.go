package compile

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// world is a small random cluster: few label values, few addresses, so
// selectors, blocks and pods overlap often.
type world struct {
	namespaces map[string]map[string]string
	pods       map[PodKey]Pod
	policies   map[PodKey]*networkingv1.NetworkPolicy
	selectors  map[*metav1.LabelSelector]labels.Selector // the oracle's parse cache
}

var (
	rNS        = []string{"x", "y", "z"}
	rPodNames  = []string{"a", "b", "c", "d"}
	rKeys      = []string{"app", "tier"}
	rValues    = []string{"1", "2"}
	rPortNames = []string{"http", "dns"}
	rProtos    = []corev1.Protocol{"", corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
	rV4        = pfx("10.0.0.0/28")
	rV6        = pfx("fd00::/124")
)

func pick[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

func randLabels(r *rand.Rand) map[string]string {
	l := map[string]string{}
	for _, k := range rKeys {
		if r.IntN(3) > 0 {
			l[k] = pick(r, rValues)
		}
	}
	return l
}

func randSelector(r *rand.Rand) *metav1.LabelSelector {
	s := &metav1.LabelSelector{}
	switch r.IntN(4) {
	case 0: // empty: everything
	case 1:
		s.MatchLabels = map[string]string{pick(r, rKeys): pick(r, rValues)}
	default:
		op := pick(r, []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist})
		req := metav1.LabelSelectorRequirement{Key: pick(r, rKeys), Operator: op}
		if op == metav1.LabelSelectorOpIn || op == metav1.LabelSelectorOpNotIn {
			req.Values = []string{pick(r, rValues)}
		}
		s.MatchExpressions = []metav1.LabelSelectorRequirement{req}
	}
	return s
}

func randNsSelector(r *rand.Rand) *metav1.LabelSelector {
	if r.IntN(3) == 0 {
		return &metav1.LabelSelector{MatchLabels: map[string]string{nsKey: pick(r, rNS)}}
	}
	return randSelector(r)
}

func randIPs(r *rand.Rand, w *world) []netip.Addr {
	used := map[netip.Addr]bool{}
	for _, p := range w.pods {
		for _, a := range p.IPs {
			used[a] = true
		}
	}
	var out []netip.Addr
	for _, base := range []netip.Prefix{rV4, rV6} {
		if r.IntN(5) == 0 {
			continue // single-stack or none
		}
		a := randomAddr(r, base)
		if !used[a] {
			out = append(out, a)
		}
	}
	return out
}

func randPod(r *rand.Rand, w *world, ns, name string) Pod {
	p := Pod{Namespace: ns, Name: name, Labels: randLabels(r), HostNetwork: r.IntN(12) == 0}
	// A pod keeps unique addresses: drop its own first so it may keep them.
	delete(w.pods, PodKey{ns, name})
	p.IPs = randIPs(r, w)
	for range r.IntN(3) {
		n, _ := protoNumber(pick(r, rProtos))
		p.Ports = append(p.Ports, ContainerPort{Name: pick(r, rPortNames), Proto: n, Port: uint16(1 + r.IntN(6))})
	}
	return p
}

func randPeer(r *rand.Rand) networkingv1.NetworkPolicyPeer {
	switch r.IntN(4) {
	case 0:
		base := pick(r, []netip.Prefix{rV4, rV6})
		cidr := randomPrefix(r, netip.PrefixFrom(base.Addr(), base.Bits()-2).Masked())
		b := &networkingv1.IPBlock{CIDR: cidr.String()}
		for range r.IntN(3) {
			e := randomPrefix(r, base)
			if e.Bits() > cidr.Bits() && cidr.Contains(e.Addr()) {
				b.Except = append(b.Except, e.String())
			}
		}
		return networkingv1.NetworkPolicyPeer{IPBlock: b}
	case 1:
		return networkingv1.NetworkPolicyPeer{PodSelector: randSelector(r)}
	case 2:
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: randNsSelector(r)}
	default:
		return networkingv1.NetworkPolicyPeer{PodSelector: randSelector(r), NamespaceSelector: randNsSelector(r)}
	}
}

func randPorts(r *rand.Rand) []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for range r.IntN(3) {
		var p networkingv1.NetworkPolicyPort
		if proto := pick(r, rProtos); proto != "" {
			p.Protocol = &proto
		}
		switch r.IntN(4) {
		case 0: // every port of the protocol
		case 1:
			v := intstr.FromString(pick(r, rPortNames))
			p.Port = &v
		default:
			first := int32(1 + r.IntN(6))
			v := intstr.FromInt32(first)
			p.Port = &v
			if r.IntN(2) == 0 {
				end := first + int32(r.IntN(3))
				p.EndPort = &end
			}
		}
		out = append(out, p)
	}
	return out
}

func randPolicy(r *rand.Rand, ns, name string) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{}
	np.Namespace, np.Name = ns, name
	np.Spec.PodSelector = *randSelector(r)
	hasIn, hasEg := r.IntN(4) > 0, r.IntN(2) == 0
	for range r.IntN(3) {
		var rule networkingv1.NetworkPolicyIngressRule
		for range r.IntN(3) {
			rule.From = append(rule.From, randPeer(r))
		}
		rule.Ports = randPorts(r)
		np.Spec.Ingress = append(np.Spec.Ingress, rule)
	}
	for range r.IntN(3) {
		var rule networkingv1.NetworkPolicyEgressRule
		for range r.IntN(3) {
			rule.To = append(rule.To, randPeer(r))
		}
		rule.Ports = randPorts(r)
		np.Spec.Egress = append(np.Spec.Egress, rule)
	}
	// Sometimes leave policyTypes to the defaulting.
	if r.IntN(4) > 0 {
		if hasIn {
			np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		}
		if hasEg {
			np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		}
	}
	return np
}

func randWorld(r *rand.Rand) *world {
	w := &world{namespaces: map[string]map[string]string{}, pods: map[PodKey]Pod{}, policies: map[PodKey]*networkingv1.NetworkPolicy{}}
	for _, ns := range rNS {
		if r.IntN(5) > 0 { // some namespaces unseen: default label only
			l := randLabels(r)
			l[nsKey] = ns
			w.namespaces[ns] = l
		}
		for _, n := range rPodNames {
			if r.IntN(4) > 0 {
				w.pods[PodKey{ns, n}] = randPod(r, w, ns, n)
			}
		}
		for i := range r.IntN(3) {
			k := PodKey{ns, fmt.Sprintf("p%d", i)}
			w.policies[k] = randPolicy(r, ns, k.Name)
		}
	}
	return w
}

func (w *world) snapshot(t *testing.T) *Snapshot {
	s := New()
	// Policies first, pods last: the order must not matter.
	for _, np := range w.policies {
		if err := s.UpsertPolicy(np); err != nil {
			t.Fatal(err)
		}
	}
	for n, l := range w.namespaces {
		s.UpsertNamespace(n, l)
	}
	for _, p := range w.pods {
		s.UpsertPod(p)
	}
	return s
}

// oracle answers from the API objects directly, the way the NetworkPolicy
// documentation reads, without addresses flattened or peers resolved ahead.
func (w *world) oracle(target Pod, dir policy.Direction, addr netip.Addr, proto uint8, port uint16) bool {
	if target.HostNetwork {
		return true
	}
	nsLabels := func(ns string) labels.Set {
		if l, ok := w.namespaces[ns]; ok {
			return l
		}
		return labels.Set{nsKey: ns}
	}
	sel := func(s *metav1.LabelSelector, l map[string]string) bool {
		if w.selectors == nil {
			w.selectors = map[*metav1.LabelSelector]labels.Selector{}
		}
		x, ok := w.selectors[s]
		if !ok {
			var err error
			if x, err = metav1.LabelSelectorAsSelector(s); err != nil {
				panic(err)
			}
			w.selectors[s] = x
		}
		return x.Matches(labels.Set(l))
	}
	owner := func() *Pod { // the non-host pod with addr, if any
		for _, p := range w.pods {
			if !p.HostNetwork && slices.Contains(p.IPs, addr) {
				return &p
			}
		}
		return nil
	}()
	isolated, allowed := false, false
	for _, np := range w.policies {
		if np.Namespace != target.Namespace || !sel(&np.Spec.PodSelector, target.Labels) {
			continue
		}
		types := np.Spec.PolicyTypes
		if len(types) == 0 {
			types = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
			if len(np.Spec.Egress) > 0 {
				types = append(types, networkingv1.PolicyTypeEgress)
			}
		}
		want := networkingv1.PolicyTypeIngress
		if dir == policy.Egress {
			want = networkingv1.PolicyTypeEgress
		}
		if !slices.Contains(types, want) {
			continue
		}
		isolated = true
		type rule struct {
			peers []networkingv1.NetworkPolicyPeer
			ports []networkingv1.NetworkPolicyPort
		}
		var rules []rule
		if dir == policy.Ingress {
			for _, r := range np.Spec.Ingress {
				rules = append(rules, rule{r.From, r.Ports})
			}
		} else {
			for _, r := range np.Spec.Egress {
				rules = append(rules, rule{r.To, r.Ports})
			}
		}
		for _, r := range rules {
			peerOK := len(r.peers) == 0
			for _, pe := range r.peers {
				if pe.IPBlock != nil {
					in := pfx(pe.IPBlock.CIDR).Contains(addr)
					for _, e := range pe.IPBlock.Except {
						if pfx(e).Contains(addr) {
							in = false
						}
					}
					peerOK = peerOK || in
					continue
				}
				if owner == nil {
					continue
				}
				nsOK := owner.Namespace == np.Namespace
				if pe.NamespaceSelector != nil {
					nsOK = sel(pe.NamespaceSelector, nsLabels(owner.Namespace))
				}
				podOK := pe.PodSelector == nil || sel(pe.PodSelector, owner.Labels)
				peerOK = peerOK || (nsOK && podOK)
			}
			portOK := len(r.ports) == 0
			for _, po := range r.ports {
				pp := policy.ProtoTCP
				if po.Protocol != nil {
					pp, _ = protoNumber(*po.Protocol)
				}
				if pp != proto {
					continue
				}
				switch {
				case po.Port == nil:
					portOK = true
				case po.Port.Type == intstr.String:
					// Ingress: the target's own port; egress: the destination pod's.
					holder := &target
					if dir == policy.Egress {
						holder = owner
					}
					if holder != nil {
						for _, cp := range holder.Ports {
							if cp.Name == po.Port.StrVal && cp.Proto == proto && cp.Port == port {
								portOK = true
							}
						}
					}
				default:
					end := po.Port.IntVal
					if po.EndPort != nil {
						end = *po.EndPort
					}
					if int32(port) >= po.Port.IntVal && int32(port) <= end {
						portOK = true
					}
				}
			}
			if peerOK && portOK {
				allowed = true
			}
		}
	}
	return !isolated || allowed
}

// TestCompileMatchesOracle: random clusters and policies; every pod's
// compiled rules answer like the direct reading of the API objects, for pod
// addresses, other addresses in and around the blocks, every protocol and
// ports around the rules'.
func TestCompileMatchesOracle(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	probes, allowed, isolated := 0, 0, 0
	iterations := 200
	if raceEnabled {
		iterations = 20
	}
	for iter := range iterations {
		w := randWorld(r)
		s := w.snapshot(t)
		var addrs []netip.Addr
		for _, p := range w.pods {
			addrs = append(addrs, p.IPs...)
		}
		for range 12 {
			addrs = append(addrs, randomAddr(r, pick(r, []netip.Prefix{rV4, rV6})))
		}
		addrs = append(addrs, netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1"))
		for k, p := range w.pods {
			ep, ok := s.Endpoint(k.Namespace, k.Name)
			if !ok {
				t.Fatalf("%s unknown", k)
			}
			for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
				rules := ep.Ingress
				if dir == policy.Egress {
					rules = ep.Egress
				}
				if rules.Isolated {
					isolated++
				}
				for _, a := range addrs {
					for _, proto := range []uint8{policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP, 1} {
						for port := uint16(0); port <= 9; port++ {
							want := w.oracle(p, dir, a, proto, port)
							got := Match(rules, a, proto, port)
							probes++
							if want {
								allowed++
							}
							if got != want {
								t.Fatalf("iteration %d: %s %s peer %s proto %d port %d: compiled %v, oracle %v\npod %+v\nrules %+v\npolicies %s",
									iter, k, dir, a, proto, port, got, want, p, rules, dumpPolicies(w))
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d probes, %d allowed, %d isolated directions", probes, allowed, isolated)
	if allowed == 0 || allowed == probes || isolated == 0 {
		t.Fatal("degenerate random worlds")
	}
}

func dumpPolicies(w *world) string {
	s := ""
	for k, np := range w.policies {
		s += fmt.Sprintf("\n%s: %+v", k, np.Spec)
	}
	return s
}

// TestIncrementalMatchesFresh: random updates (pods relabelled, readdressed,
// added and deleted; namespaces relabelled and deleted; policies replaced and
// deleted) applied one by one. After each, every pod's Endpoint equals the one
// a snapshot built from scratch computes, and every pod whose Endpoint changed
// is in TakeDirty.
func TestIncrementalMatchesFresh(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	steps, dirtyTotal, changedTotal := 0, 0, 0
	iterations := 60
	if raceEnabled {
		iterations = 10
	}
	for iter := range iterations {
		w := randWorld(r)
		s := w.snapshot(t)
		s.TakeDirty()
		prev := map[PodKey]policy.Endpoint{}
		for k := range w.pods {
			prev[k], _ = s.Endpoint(k.Namespace, k.Name)
		}
		for step := range 60 {
			ns := pick(r, rNS)
			var op string
			switch r.IntN(7) {
			case 0, 1:
				k := PodKey{ns, pick(r, rPodNames)}
				p := randPod(r, w, k.Namespace, k.Name)
				if r.IntN(2) == 0 {
					if old, ok := w.pods[k]; ok { // relabel only
						old.Labels = randLabels(r)
						p = old
					}
				}
				w.pods[k] = p
				s.UpsertPod(p)
				op = "upsert pod " + k.String()
			case 2:
				k := PodKey{ns, pick(r, rPodNames)}
				delete(w.pods, k)
				s.DeletePod(k.Namespace, k.Name)
				op = "delete pod " + k.String()
			case 3:
				l := randLabels(r)
				l[nsKey] = ns
				w.namespaces[ns] = l
				s.UpsertNamespace(ns, l)
				op = "upsert namespace " + ns
			case 4:
				delete(w.namespaces, ns)
				s.DeleteNamespace(ns)
				op = "delete namespace " + ns
			case 5:
				k := PodKey{ns, fmt.Sprintf("p%d", r.IntN(3))}
				np := randPolicy(r, k.Namespace, k.Name)
				w.policies[k] = np
				if err := s.UpsertPolicy(np); err != nil {
					t.Fatal(err)
				}
				op = "upsert policy " + k.String()
			case 6:
				k := PodKey{ns, fmt.Sprintf("p%d", r.IntN(3))}
				delete(w.policies, k)
				s.DeletePolicy(k.Namespace, k.Name)
				op = "delete policy " + k.String()
			}
			steps++
			dirty := map[PodKey]bool{}
			for _, k := range s.TakeDirty() {
				dirty[k] = true
			}
			dirtyTotal += len(dirty)
			fresh := w.snapshot(t)
			cur := map[PodKey]policy.Endpoint{}
			for _, name := range rPodNames {
				for _, n := range rNS {
					k := PodKey{n, name}
					got, ok := s.Endpoint(n, name)
					want, wok := fresh.Endpoint(n, name)
					if ok != wok || !reflect.DeepEqual(got, want) {
						t.Fatalf("iteration %d step %d (%s): %s incremental %v %+v, fresh %v %+v", iter, step, op, k, ok, got, wok, want)
					}
					p, had := prev[k]
					if had != ok || !reflect.DeepEqual(p, got) {
						changedTotal++
						if !dirty[k] {
							t.Fatalf("iteration %d step %d (%s): %s changed but is not in TakeDirty", iter, step, op, k)
						}
					}
					if ok {
						cur[k] = got
					}
				}
			}
			prev = cur
		}
	}
	t.Logf("%d steps, %d endpoints changed, %d reported dirty", steps, changedTotal, dirtyTotal)
	if changedTotal == 0 {
		t.Fatal("degenerate: no step changed an endpoint")
	}
}
