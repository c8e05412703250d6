package compile

// The [Feature:NetworkPolicy] specs of kubernetes v1.34
// test/e2e/network/netpol/network_policy.go, replayed on the compiler: the
// same namespaces x, y, z with pods a, b, c serving the same ports (container
// ports named serve-<port>-<proto>), the same policies, and the same 9x9
// reachability tables, where a connection passes when the client's egress
// rules allow the server's address and the server's ingress rules allow the
// client's. Every spec runs over IPv4 and over IPv6 addresses (the pods are
// dual-stack), as upstream's single-stack runs would.

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

const nsKey = "kubernetes.io/metadata.name"

var (
	protoTCP  = corev1.ProtocolTCP
	protoUDP  = corev1.ProtocolUDP
	protoSCTP = corev1.ProtocolSCTP
	nsNames   = []string{"x", "y", "z"}
	podNames  = []string{"a", "b", "c"}
)

// model is upstream's cluster: one Snapshot, nine pods, each with an IPv4 and
// an IPv6 address, evaluated in one family.
type model struct {
	t      *testing.T
	s      *Snapshot
	v6     bool
	pods   []string // "x/a" ...
	addr   map[string]netip.Addr
	protos []corev1.Protocol
	ports  []int32
}

func newModel(t *testing.T, v6 bool, protos []corev1.Protocol, ports []int32) *model {
	m := &model{t: t, s: New(), v6: v6, addr: map[string]netip.Addr{}, protos: protos, ports: ports}
	for i, ns := range nsNames {
		m.s.UpsertNamespace(ns, map[string]string{nsKey: ns})
		for j, name := range podNames {
			m.s.UpsertPod(m.pod(ns, name, i, j, map[string]string{"pod": name}))
			m.pods = append(m.pods, ns+"/"+name)
		}
	}
	return m
}

func (m *model) pod(ns, name string, i, j int, lbls map[string]string) Pod {
	a4 := netip.AddrFrom4([4]byte{10, 0, byte(i), byte(10 + j)})
	a6 := netip.MustParseAddr(fmt.Sprintf("fd00::%d:%d", i, 10+j))
	p := Pod{Namespace: ns, Name: name, Labels: lbls, IPs: []netip.Addr{a4, a6}}
	// Upstream runs one container per port and protocol, its port named
	// serve-<port>-<proto>.
	for _, port := range m.ports {
		for _, proto := range m.protos {
			n, _ := protoNumber(proto)
			p.Ports = append(p.Ports, ContainerPort{Name: fmt.Sprintf("serve-%d-%s", port, strings.ToLower(string(proto))), Proto: n, Port: uint16(port)})
		}
	}
	if m.v6 {
		m.addr[ns+"/"+name] = a6
	} else {
		m.addr[ns+"/"+name] = a4
	}
	return p
}

// relabel replaces a pod's labels as AddPodLabels / ResetPodLabels do.
func (m *model) relabel(ns, name string, lbls map[string]string) {
	for i, n := range nsNames {
		for j, pn := range podNames {
			if n == ns && pn == name {
				m.s.UpsertPod(m.pod(ns, name, i, j, lbls))
			}
		}
	}
}

func (m *model) create(ns string, np *networkingv1.NetworkPolicy) {
	m.t.Helper()
	np.Namespace = ns
	if err := m.s.UpsertPolicy(np); err != nil {
		m.t.Fatal(err)
	}
}

// hostCIDR is the pod's address as a /32 or /128, in the model's family.
func (m *model) hostCIDR(pod string) string {
	return hostPrefix(m.addr[pod]).String()
}

// largeCIDR is upstream's makeLargeCIDRForIP: the /4 around the IPv4
// address, and (for IPv6, where upstream uses the /4 of the 128-bit address)
// the same.
func (m *model) largeCIDR(pod string) string {
	return netip.PrefixFrom(m.addr[pod], 4).Masked().String()
}

// allowed is one probe: client egress and server ingress must both pass.
func (m *model) allowed(from, to string, proto corev1.Protocol, port int) bool {
	f := strings.SplitN(from, "/", 2)
	d := strings.SplitN(to, "/", 2)
	src, ok1 := m.s.Endpoint(f[0], f[1])
	dst, ok2 := m.s.Endpoint(d[0], d[1])
	if !ok1 || !ok2 {
		m.t.Fatalf("unknown pod %s or %s", from, to)
	}
	n, _ := protoNumber(proto)
	return Match(src.Egress, m.addr[to], n, uint16(port)) && Match(dst.Ingress, m.addr[from], n, uint16(port))
}

// validate is upstream's ValidateOrFail; like upstream it ignores a pod's
// traffic to itself (loopback, never seen by the datapath).
func (m *model) validate(port int, proto corev1.Protocol, r *reachability) {
	m.t.Helper()
	wrong := 0
	var exp, obs strings.Builder
	header := "-\t" + strings.Join(m.pods, "\t") + "\n"
	exp.WriteString(header)
	obs.WriteString(header)
	for _, from := range m.pods {
		exp.WriteString(from)
		obs.WriteString(from)
		for _, to := range m.pods {
			want := r.get(from, to)
			got := m.allowed(from, to, proto, port)
			mark := func(b bool) string {
				if b {
					return "."
				}
				return "X"
			}
			exp.WriteString("\t" + mark(want))
			sep := "\t"
			if from != to && got != want {
				wrong++
				sep = "\t*"
			}
			obs.WriteString(sep + mark(got))
		}
		exp.WriteString("\n")
		obs.WriteString("\n")
	}
	if wrong > 0 {
		m.t.Errorf("%s/%d: %d wrong\nexpected:\n%s\nobserved (* wrong):\n%s", proto, port, wrong, exp.String(), obs.String())
	}
}

// reachability is upstream's truth table of expectations.
type reachability struct {
	pods []string
	m    map[[2]string]bool
}

func (m *model) reach(def bool) *reachability {
	r := &reachability{pods: m.pods, m: map[[2]string]bool{}}
	for _, a := range m.pods {
		for _, b := range m.pods {
			r.m[[2]string{a, b}] = def
		}
	}
	return r
}

func (r *reachability) get(from, to string) bool { return r.m[[2]string{from, to}] }

func (r *reachability) expect(from, to string, v bool) { r.m[[2]string{from, to}] = v }

// peer matches "ns/pod" with "" as a wildcard for either part.
type peer struct{ ns, pod string }

func (p peer) matches(s string) bool {
	f := strings.SplitN(s, "/", 2)
	return (p.ns == "" || p.ns == f[0]) && (p.pod == "" || p.pod == f[1])
}

func (r *reachability) expectPeer(from, to peer, v bool) {
	for _, a := range r.pods {
		for _, b := range r.pods {
			if from.matches(a) && to.matches(b) {
				r.expect(a, b, v)
			}
		}
	}
}

func (r *reachability) expectAllIngress(pod string, v bool) { r.expectPeer(peer{}, peerOf(pod), v) }
func (r *reachability) expectAllEgress(pod string, v bool)  { r.expectPeer(peerOf(pod), peer{}, v) }

func peerOf(s string) peer {
	f := strings.SplitN(s, "/", 2)
	return peer{f[0], f[1]}
}

// The policy builders of upstream's policies.go.
type setFunc func(*networkingv1.NetworkPolicy)

func genPolicy(name string, sel metav1.LabelSelector, fns ...setFunc) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{}
	np.Name = name
	np.Spec.PodSelector = sel
	for _, f := range fns {
		f(np)
	}
	return np
}

func genPolicyLabels(name string, match map[string]string, fns ...setFunc) *networkingv1.NetworkPolicy {
	return genPolicy(name, metav1.LabelSelector{MatchLabels: match}, fns...)
}

func ingressRules(rules ...networkingv1.NetworkPolicyIngressRule) setFunc {
	return func(np *networkingv1.NetworkPolicy) {
		if np.Spec.Ingress == nil {
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{}
			np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		}
		np.Spec.Ingress = append(np.Spec.Ingress, rules...)
	}
}

func egressRules(rules ...networkingv1.NetworkPolicyEgressRule) setFunc {
	return func(np *networkingv1.NetworkPolicy) {
		if np.Spec.Egress == nil {
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{}
			np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		}
		np.Spec.Egress = append(np.Spec.Egress, rules...)
	}
}

func from(peers ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: peers}
}

func to(peers ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: peers}
}

func podSel(l map[string]string) *metav1.LabelSelector { return &metav1.LabelSelector{MatchLabels: l} }

func exprSel(key string, op metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

func numPort(p int32, proto *corev1.Protocol) networkingv1.NetworkPolicyPort {
	v := intstr.FromInt32(p)
	return networkingv1.NetworkPolicyPort{Port: &v, Protocol: proto}
}

func namedPortOf(name string, proto *corev1.Protocol) networkingv1.NetworkPolicyPort {
	v := intstr.FromString(name)
	return networkingv1.NetworkPolicyPort{Port: &v, Protocol: proto}
}

type spec struct {
	name   string
	protos []corev1.Protocol
	ports  []int32
	run    func(m *model)
}

var tcpOnly = []corev1.Protocol{protoTCP}

var upstreamSpecs = []spec{
	{"should support a 'default-deny-ingress' policy", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicy("deny-ingress", metav1.LabelSelector{}, ingressRules()))
		r := m.reach(true)
		r.expectPeer(peer{}, peer{ns: "x"}, false)
		m.validate(80, protoTCP, r)
	}},
	{"should support a 'default-deny-all' policy", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicy("deny-all", metav1.LabelSelector{}, ingressRules(), egressRules()))
		r := m.reach(true)
		r.expectPeer(peer{}, peer{ns: "x"}, false)
		r.expectPeer(peer{ns: "x"}, peer{}, false)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy to allow traffic from pods within server namespace based on PodSelector", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("x-a-allows-x-b", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{PodSelector: podSel(map[string]string{"pod": "b"})}))))
		r := m.reach(true)
		r.expectAllIngress("x/a", false)
		r.expect("x/b", "x/a", true)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy to allow ingress traffic for a target", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicy("deny-all", metav1.LabelSelector{}, ingressRules()))
		m.create("x", genPolicyLabels("allow-all-to-a", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{}, NamespaceSelector: &metav1.LabelSelector{}}))))
		r := m.reach(true)
		r.expectAllIngress("x/a", true)
		r.expectAllIngress("x/b", false)
		r.expectAllIngress("x/c", false)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy to allow ingress traffic from pods in all namespaces", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-from-another-ns", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{})}))))
		m.validate(80, protoTCP, m.reach(true))
	}},
	{"should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-client-a-via-ns-selector", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{nsKey: "y"})}))))
		r := m.reach(true)
		r.expectPeer(peer{ns: "x"}, peer{"x", "a"}, false)
		r.expectPeer(peer{ns: "z"}, peer{"x", "a"}, false)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy based on PodSelector with MatchExpressions", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("x-a-allows-x-b", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{PodSelector: exprSel("pod", metav1.LabelSelectorOpIn, "b")}))))
		r := m.reach(true)
		r.expectAllIngress("x/a", false)
		r.expect("x/b", "x/a", true)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy based on NamespaceSelector with MatchExpressions", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-ns-y-match-selector", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: exprSel(nsKey, metav1.LabelSelectorOpIn, "y")}))))
		r := m.reach(true)
		r.expectPeer(peer{ns: "x"}, peer{"x", "a"}, false)
		r.expectPeer(peer{ns: "z"}, peer{"x", "a"}, false)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy based on PodSelector or NamespaceSelector", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-ns-y-match-selector", map[string]string{"pod": "a"},
			ingressRules(from(
				networkingv1.NetworkPolicyPeer{NamespaceSelector: exprSel(nsKey, metav1.LabelSelectorOpNotIn, "x")},
				networkingv1.NetworkPolicyPeer{PodSelector: podSel(map[string]string{"pod": "b"})}))))
		r := m.reach(true)
		r.expect("x/a", "x/a", false)
		r.expect("x/c", "x/a", false)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy based on PodSelector and NamespaceSelector", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-ns-y-podselector-and-nsselector", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{
				NamespaceSelector: exprSel(nsKey, metav1.LabelSelectorOpNotIn, "x"),
				PodSelector:       podSel(map[string]string{"pod": "b"})}))))
		r := m.reach(true)
		r.expectAllIngress("x/a", false)
		r.expect("y/b", "x/a", true)
		r.expect("z/b", "x/a", true)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy based on Multiple PodSelectors and NamespaceSelectors", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-ns-y-z-pod-b-c", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{
				NamespaceSelector: exprSel(nsKey, metav1.LabelSelectorOpNotIn, "x"),
				PodSelector:       exprSel("pod", metav1.LabelSelectorOpIn, "b", "c")}))))
		r := m.reach(true)
		r.expectPeer(peer{ns: "x"}, peer{"x", "a"}, false)
		r.expect("y/a", "x/a", false)
		r.expect("z/a", "x/a", false)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy based on any PodSelectors", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-ns-x-pod-b-c", map[string]string{"pod": "a"},
			ingressRules(from(
				networkingv1.NetworkPolicyPeer{PodSelector: podSel(map[string]string{"pod": "b"})},
				networkingv1.NetworkPolicyPeer{PodSelector: podSel(map[string]string{"pod": "c"})}))))
		r := m.reach(true)
		r.expectAllIngress("x/a", false)
		r.expect("x/b", "x/a", true)
		r.expect("x/c", "x/a", true)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-ns-y-pod-a-via-namespace-pod-selector", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{
				NamespaceSelector: podSel(map[string]string{nsKey: "y"}),
				PodSelector:       podSel(map[string]string{"pod": "a"})}))))
		r := m.reach(true)
		r.expectAllIngress("x/a", false)
		r.expect("y/a", "x/a", true)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy based on Ports", tcpOnly, []int32{81}, func(m *model) {
		rule := from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{nsKey: "y"})})
		rule.Ports = append(rule.Ports, numPort(81, &protoTCP))
		m.create("x", genPolicyLabels("allow-client-a-via-ns-selector", map[string]string{"pod": "a"}, ingressRules(rule)))
		r := m.reach(true)
		r.expectPeer(peer{ns: "x"}, peer{"x", "a"}, false)
		r.expectPeer(peer{ns: "y"}, peer{"x", "a"}, true)
		r.expectPeer(peer{ns: "z"}, peer{"x", "a"}, false)
		m.validate(81, protoTCP, r)
	}},
	{"should enforce multiple, stacked policies with overlapping podSelectors", tcpOnly, []int32{80, 81}, func(m *model) {
		rule := from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{nsKey: "y"})})
		rule.Ports = append(rule.Ports, numPort(81, &protoTCP))
		m.create("x", genPolicyLabels("allow-client-a-via-ns-selector", map[string]string{"pod": "a"}, ingressRules(rule)))
		allow := m.reach(true)
		allow.expectPeer(peer{ns: "x"}, peer{"x", "a"}, false)
		allow.expectPeer(peer{ns: "y"}, peer{"x", "a"}, true)
		allow.expectPeer(peer{ns: "z"}, peer{"x", "a"}, false)
		m.validate(81, protoTCP, allow)
		deny := m.reach(true)
		deny.expectAllIngress("x/a", false)
		m.validate(80, protoTCP, deny)

		rule = from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{nsKey: "y"})})
		rule.Ports = append(rule.Ports, numPort(80, &protoTCP))
		m.create("x", genPolicyLabels("allow-client-a-via-ns-selector-80", map[string]string{"pod": "a"}, ingressRules(rule)))
		m.validate(80, protoTCP, allow)
	}},
	{"should support allow-all policy", tcpOnly, []int32{80, 81}, func(m *model) {
		m.create("x", genPolicyLabels("allow-all", map[string]string{}, ingressRules(networkingv1.NetworkPolicyIngressRule{})))
		m.validate(80, protoTCP, m.reach(true))
		m.validate(81, protoTCP, m.reach(true))
	}},
	{"should allow ingress access on one named port", tcpOnly, []int32{80, 81}, func(m *model) {
		rule := networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{namedPortOf("serve-81-tcp", nil)}}
		m.create("x", genPolicyLabels("allow-all", map[string]string{}, ingressRules(rule)))
		m.validate(81, protoTCP, m.reach(true))
		r := m.reach(true)
		r.expectPeer(peer{}, peer{ns: "x"}, false)
		m.validate(80, protoTCP, r)
	}},
	{"should allow ingress access from namespace on one named port", tcpOnly, []int32{80, 81}, func(m *model) {
		rule := from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{nsKey: "y"})})
		rule.Ports = append(rule.Ports, namedPortOf("serve-80-tcp", &protoTCP))
		m.create("x", genPolicyLabels("allow-client-a-via-ns-selector-80", map[string]string{"pod": "a"}, ingressRules(rule)))
		r := m.reach(true)
		r.expectPeer(peer{ns: "x"}, peer{"x", "a"}, false)
		r.expectPeer(peer{ns: "z"}, peer{"x", "a"}, false)
		m.validate(80, protoTCP, r)
		fail := m.reach(true)
		fail.expectAllIngress("x/a", false)
		m.validate(81, protoTCP, fail)
	}},
	{"should allow egress access on one named port", tcpOnly, []int32{80, 81}, func(m *model) {
		rule := networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{namedPortOf("serve-80-tcp", nil)}}
		m.create("x", genPolicyLabels("allow-egress", map[string]string{}, egressRules(rule)))
		m.validate(80, protoTCP, m.reach(true))
		r := m.reach(true)
		r.expectPeer(peer{ns: "x"}, peer{}, false)
		m.validate(81, protoTCP, r)
	}},
	{"should enforce updated policy", tcpOnly, []int32{81}, func(m *model) {
		np := genPolicyLabels("allow-all-mutate-to-deny-all", map[string]string{}, ingressRules(networkingv1.NetworkPolicyIngressRule{}))
		m.create("x", np)
		m.validate(81, protoTCP, m.reach(true))
		np = np.DeepCopy()
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{}
		m.create("x", np) // UpdatePolicy
		r := m.reach(true)
		r.expectPeer(peer{}, peer{ns: "x"}, false)
		m.validate(81, protoTCP, r)
	}},
	{"should allow ingress access from updated namespace", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-client-a-via-ns-selector", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{"ns2": "updated"})}))))
		r := m.reach(true)
		r.expectAllIngress("x/a", false)
		m.validate(80, protoTCP, r)
		m.s.UpsertNamespace("y", map[string]string{nsKey: "y", "ns2": "updated"})
		r = m.reach(true)
		r.expectAllIngress("x/a", false)
		r.expectPeer(peer{ns: "y"}, peer{}, true)
		m.validate(80, protoTCP, r)
	}},
	{"should allow ingress access from updated pod", tcpOnly, []int32{80}, func(m *model) {
		match := map[string]string{"pod": "b", "pod2": "updated"}
		m.create("x", genPolicyLabels("allow-client-a-via-pod-selector", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{PodSelector: podSel(match)}))))
		r := m.reach(true)
		r.expectAllIngress("x/a", false)
		m.validate(80, protoTCP, r)
		m.relabel("x", "b", match)
		r = m.reach(true)
		r.expectAllIngress("x/a", false)
		r.expect("x/b", "x/a", true)
		m.validate(80, protoTCP, r)
	}},
	{"should deny ingress from pods on other namespaces", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicy("deny-empty-policy", metav1.LabelSelector{},
			ingressRules(from(networkingv1.NetworkPolicyPeer{PodSelector: podSel(map[string]string{})}))))
		r := m.reach(true)
		r.expectPeer(peer{ns: "y"}, peer{ns: "x"}, false)
		r.expectPeer(peer{ns: "z"}, peer{ns: "x"}, false)
		m.validate(80, protoTCP, r)
	}},
	{"should deny ingress access to updated pod", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicy("deny-ingress-via-label-selector", metav1.LabelSelector{MatchLabels: map[string]string{"target": "isolated"}}, ingressRules()))
		m.validate(80, protoTCP, m.reach(true))
		m.relabel("x", "a", map[string]string{"pod": "a", "target": "isolated"})
		r := m.reach(true)
		r.expectAllIngress("x/a", false)
		m.validate(80, protoTCP, r)
	}},
	{"should deny egress from pods based on PodSelector", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicy("deny-egress-pod-a", metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}}, egressRules()))
		r := m.reach(true)
		r.expectAllEgress("x/a", false)
		m.validate(80, protoTCP, r)
	}},
	{"should deny egress from all pods in a namespace", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicy("deny-egress-ns-x", metav1.LabelSelector{}, egressRules()))
		r := m.reach(true)
		r.expectPeer(peer{ns: "x"}, peer{}, false)
		m.validate(80, protoTCP, r)
	}},
	{"should work with Ingress, Egress specified together", tcpOnly, []int32{80, 81}, func(m *model) {
		np := genPolicyLabels("allow-client-a-via-pod-selector", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{PodSelector: podSel(map[string]string{"pod": "b"})})))
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{numPort(80, nil)}}}
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress, networkingv1.PolicyTypeIngress}
		m.create("x", np)
		r80 := m.reach(true)
		r80.expectAllIngress("x/a", false)
		r80.expect("x/b", "x/a", true)
		m.validate(80, protoTCP, r80)
		r81 := m.reach(true)
		r81.expectAllIngress("x/a", false)
		r81.expectAllEgress("x/a", false)
		r81.expect("x/b", "x/a", true)
		m.validate(81, protoTCP, r81)
	}},
	{"should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-to-ns-y-pod-a", map[string]string{"pod": "a"},
			egressRules(to(networkingv1.NetworkPolicyPeer{
				NamespaceSelector: podSel(map[string]string{nsKey: "y"}),
				PodSelector:       podSel(map[string]string{"pod": "a"})}))))
		in := from(networkingv1.NetworkPolicyPeer{
			NamespaceSelector: podSel(map[string]string{nsKey: "x"}),
			PodSelector:       podSel(map[string]string{"pod": "a"})})
		m.create("y", genPolicyLabels("allow-from-xa-on-ya-match-selector", map[string]string{"pod": "a"}, ingressRules(in)))
		m.create("y", genPolicyLabels("allow-from-xa-on-yb-match-selector", map[string]string{"pod": "b"}, ingressRules(in)))
		r := m.reach(true)
		r.expectPeer(peer{"x", "a"}, peer{}, false)
		r.expectPeer(peer{}, peer{"y", "a"}, false)
		r.expectPeer(peer{"x", "a"}, peer{"y", "a"}, true)
		r.expectPeer(peer{}, peer{"y", "b"}, false)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-to-ns-y-pod-a", map[string]string{"pod": "a"},
			egressRules(to(networkingv1.NetworkPolicyPeer{
				NamespaceSelector: podSel(map[string]string{nsKey: "y"}),
				PodSelector:       podSel(map[string]string{"pod": "a"})}))))
		r := m.reach(true)
		r.expectAllEgress("x/a", false)
		r.expect("x/a", "y/a", true)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce ingress policy allowing any port traffic to a server on a specific protocol", []corev1.Protocol{protoTCP, protoUDP}, []int32{80}, func(m *model) {
		rule := networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &protoTCP}}}
		m.create("x", genPolicyLabels("allow-ingress-by-proto", map[string]string{"pod": "a"}, ingressRules(rule)))
		m.validate(80, protoTCP, m.reach(true))
		r := m.reach(true)
		r.expectPeer(peer{}, peer{"x", "a"}, false)
		m.validate(80, protoUDP, r)
	}},
	{"should enforce multiple ingress policies with ingress allow-all policy taking precedence", tcpOnly, []int32{81}, func(m *model) {
		rule := networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{numPort(80, nil)}}
		m.create("x", genPolicyLabels("allow-ingress-port-80", map[string]string{}, ingressRules(rule)))
		r := m.reach(true)
		r.expectPeer(peer{}, peer{ns: "x"}, false)
		m.validate(81, protoTCP, r)
		m.create("x", genPolicyLabels("allow-ingress", map[string]string{}, ingressRules(networkingv1.NetworkPolicyIngressRule{})))
		m.validate(81, protoTCP, m.reach(true))
	}},
	{"should enforce multiple egress policies with egress allow-all policy taking precedence", tcpOnly, []int32{81}, func(m *model) {
		rule := networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{numPort(80, nil)}}
		m.create("x", genPolicyLabels("allow-egress-port-80", map[string]string{}, egressRules(rule)))
		r := m.reach(true)
		r.expectPeer(peer{ns: "x"}, peer{}, false)
		m.validate(81, protoTCP, r)
		m.create("x", genPolicyLabels("allow-egress", map[string]string{}, egressRules(networkingv1.NetworkPolicyEgressRule{})))
		m.validate(81, protoTCP, m.reach(true))
	}},
	{"should stop enforcing policies after they are deleted", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicy("deny-all", metav1.LabelSelector{}, ingressRules(), egressRules()))
		r := m.reach(true)
		r.expectPeer(peer{ns: "x"}, peer{}, false)
		r.expectPeer(peer{}, peer{ns: "x"}, false)
		m.validate(80, protoTCP, r)
		m.s.DeletePolicy("x", "deny-all")
		m.validate(80, protoTCP, m.reach(true))
	}},
	{"should allow egress access to server in CIDR block", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-client-a-via-cidr-egress-rule", map[string]string{"pod": "a"},
			egressRules(to(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: m.hostCIDR("y/b")}}))))
		r := m.reach(true)
		r.expectAllEgress("x/a", false)
		r.expect("x/a", "y/b", true)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce except clause while egress access to server in CIDR block", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-client-a-via-cidr-egress-rule", map[string]string{"pod": "a"},
			egressRules(to(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: m.largeCIDR("x/b"), Except: []string{m.hostCIDR("x/b")}}}))))
		r := m.reach(true)
		r.expect("x/a", "x/b", false)
		m.validate(80, protoTCP, r)
	}},
	{"should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-client-a-via-cidr-egress-rule", map[string]string{"pod": "a"},
			egressRules(to(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: m.largeCIDR("x/b"), Except: []string{m.hostCIDR("x/b")}}}))))
		r := m.reach(true)
		r.expect("x/a", "x/b", false)
		m.validate(80, protoTCP, r)
		m.create("x", genPolicyLabels("allow-client-a-via-cidr-egress-rule", map[string]string{"pod": "a"},
			egressRules(to(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: m.hostCIDR("x/b")}}))))
		r = m.reach(true)
		r.expectAllEgress("x/a", false)
		r.expect("x/a", "x/b", true)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector", tcpOnly, []int32{80}, func(m *model) {
		target := map[string]string{"pod": "a"}
		m.create("x", genPolicy("allow-egress-for-target", metav1.LabelSelector{MatchLabels: target}, egressRules(networkingv1.NetworkPolicyEgressRule{})))
		m.validate(80, protoTCP, m.reach(true))
		m.create("x", genPolicy("deny-ingress-via-label-selector", metav1.LabelSelector{MatchLabels: target}, ingressRules()))
		r := m.reach(true)
		r.expectAllIngress("x/a", false)
		m.validate(80, protoTCP, r)
	}},
	{"should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP", tcpOnly, []int32{81}, func(m *model) {
		m.create("x", genPolicy("deny-ingress", metav1.LabelSelector{}, ingressRules()))
		rule := networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{numPort(81, &protoSCTP)}}
		m.create("x", genPolicyLabels("allow-only-sctp-ingress-on-port-81", map[string]string{"pod": "a"}, ingressRules(rule)))
		r := m.reach(true)
		r.expectPeer(peer{}, peer{ns: "x"}, false)
		m.validate(81, protoTCP, r)
	}},
	{"should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP", tcpOnly, []int32{81}, func(m *model) {
		rule := networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{numPort(80, &protoSCTP)}}
		m.create("x", genPolicyLabels("allow-only-sctp-ingress-on-port-80", map[string]string{"pod": "a"}, ingressRules(rule)))
		r := m.reach(true)
		r.expectAllIngress("x/a", false)
		m.validate(81, protoTCP, r)
	}},
	{"should not allow access by TCP when a policy specifies only UDP", tcpOnly, []int32{81}, func(m *model) {
		rule := networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{numPort(81, &protoUDP)}}
		m.create("x", genPolicyLabels("allow-only-udp-ingress-on-port-81", map[string]string{"pod": "a"}, ingressRules(rule)))
		r := m.reach(true)
		r.expectAllIngress("x/a", false)
		m.validate(81, protoTCP, r)
	}},
	{"should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-client-a-via-ns-selector-for-immutable-ns-label", map[string]string{"pod": "a"},
			ingressRules(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{corev1.LabelMetadataName: "y"})}))))
		r := m.reach(true)
		r.expectPeer(peer{ns: "x"}, peer{"x", "a"}, false)
		r.expectPeer(peer{ns: "z"}, peer{"x", "a"}, false)
		m.validate(80, protoTCP, r)
	}},
	{"should enforce policy based on NamespaceSelector with MatchExpressions using default ns label", tcpOnly, []int32{80}, func(m *model) {
		m.create("x", genPolicyLabels("allow-ns-y-match-selector-for-immutable-ns-label", map[string]string{"pod": "a"},
			egressRules(to(networkingv1.NetworkPolicyPeer{NamespaceSelector: exprSel(corev1.LabelMetadataName, metav1.LabelSelectorOpNotIn, "y")}))))
		r := m.reach(true)
		r.expectPeer(peer{"x", "a"}, peer{ns: "y"}, false)
		m.validate(80, protoTCP, r)
	}},
}

// The UDP and SCTP contexts run the same three specs with their protocol.
func init() {
	for _, proto := range []corev1.Protocol{protoUDP, protoSCTP} {
		p := proto
		upstreamSpecs = append(upstreamSpecs,
			spec{"using " + string(p) + ": should support a 'default-deny-ingress' policy", []corev1.Protocol{p}, []int32{80}, func(m *model) {
				m.create("x", genPolicy("deny-all", metav1.LabelSelector{}, ingressRules()))
				r := m.reach(true)
				r.expectPeer(peer{}, peer{ns: "x"}, false)
				m.validate(80, p, r)
			}},
			spec{"using " + string(p) + ": should enforce policy based on Ports", []corev1.Protocol{p}, []int32{81}, func(m *model) {
				rule := from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{nsKey: "y"})})
				rule.Ports = append(rule.Ports, numPort(81, &p))
				m.create("x", genPolicyLabels("allow-ingress-on-port-81-ns-x", map[string]string{"pod": "a"}, ingressRules(rule)))
				r := m.reach(true)
				r.expectPeer(peer{ns: "x"}, peer{"x", "a"}, false)
				r.expectPeer(peer{ns: "z"}, peer{"x", "a"}, false)
				m.validate(81, p, r)
			}},
			spec{"using " + string(p) + ": should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector", []corev1.Protocol{p}, []int32{80}, func(m *model) {
				m.create("x", genPolicyLabels("allow-ns-y-pod-a-via-namespace-pod-selector", map[string]string{"pod": "a"},
					ingressRules(from(networkingv1.NetworkPolicyPeer{
						NamespaceSelector: podSel(map[string]string{nsKey: "y"}),
						PodSelector:       podSel(map[string]string{"pod": "a"})}))))
				r := m.reach(true)
				r.expectAllIngress("x/a", false)
				r.expect("y/a", "x/a", true)
				m.validate(80, p, r)
			}},
		)
	}
}

// TestUpstreamNetworkPolicySpecs replays every [Feature:NetworkPolicy] spec of
// upstream's netpol suite (v1.34) on compiled rules, IPv4 and IPv6.
func TestUpstreamNetworkPolicySpecs(t *testing.T) {
	if len(upstreamSpecs) != 48 {
		t.Fatalf("%d specs, upstream v1.34 has 48 [Feature:NetworkPolicy] specs", len(upstreamSpecs))
	}
	for _, sp := range upstreamSpecs {
		for _, v6 := range []bool{false, true} {
			fam := "ipv4"
			if v6 {
				fam = "ipv6"
			}
			t.Run(fam+"/"+sp.name, func(t *testing.T) {
				sp.run(newModel(t, v6, sp.protos, sp.ports))
			})
		}
	}
}

// TestUpstreamBaseline: without a policy everything reaches everything, and
// the evaluator is not vacuous (a default-deny makes it answer false).
func TestUpstreamBaseline(t *testing.T) {
	m := newModel(t, false, tcpOnly, []int32{80})
	m.validate(80, protoTCP, m.reach(true))
	ep, _ := m.s.Endpoint("x", "a")
	if ep.Ingress.Isolated || ep.Egress.Isolated || len(ep.Policies) != 0 {
		t.Fatalf("no policy, yet %+v", ep)
	}
	m.create("x", genPolicy("deny-all", metav1.LabelSelector{}, ingressRules(), egressRules()))
	if m.allowed("y/a", "x/a", protoTCP, 80) || m.allowed("x/a", "y/a", protoTCP, 80) {
		t.Fatal("default deny-all still allows")
	}
	ep, _ = m.s.Endpoint("x", "a")
	if !ep.Ingress.Isolated || !ep.Egress.Isolated || len(ep.Ingress.Allows)+len(ep.Egress.Allows) != 0 || fmt.Sprint(ep.Policies) != "[x/deny-all]" {
		t.Fatalf("deny-all compiled to %+v", ep)
	}
	_ = policy.Endpoint{}
}
