package compile

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func mustEndpoint(t *testing.T, s *Snapshot, ns, name string) policy.Endpoint {
	t.Helper()
	ep, ok := s.Endpoint(ns, name)
	if !ok {
		t.Fatalf("%s/%s unknown", ns, name)
	}
	return ep
}

func TestPodFromAPI(t *testing.T) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "sidecar", ContainerPort: 15000}}}},
			Containers: []corev1.Container{
				{Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {ContainerPort: 9999}}},
				{Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}, {Name: "bad", ContainerPort: 70000}}},
			},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}}},
	}
	got := PodFromAPI(p)
	want := Pod{
		Namespace: "ns", Name: "p", Labels: map[string]string{"app": "web"},
		IPs: addrs("10.0.0.1", "fd00::1"),
		Ports: []ContainerPort{
			{Name: "sidecar", Proto: policy.ProtoTCP, Port: 15000},
			{Name: "http", Proto: policy.ProtoTCP, Port: 8080},
			{Name: "dns", Proto: policy.ProtoUDP, Port: 53},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("PodFromAPI:\n got %+v\nwant %+v", got, want)
	}
	p.Status.PodIPs = nil // an older API server: podIP only
	if got := PodFromAPI(p); !reflect.DeepEqual(got.IPs, addrs("10.0.0.1")) {
		t.Fatalf("podIP fallback: %v", got.IPs)
	}
	p.Status.Phase = corev1.PodSucceeded // its address may be someone else's now
	if got := PodFromAPI(p); len(got.IPs) != 0 {
		t.Fatalf("finished pod keeps %v", got.IPs)
	}
	p.Spec.HostNetwork = true
	if !PodFromAPI(p).HostNetwork {
		t.Fatal("hostNetwork lost")
	}
}

// snap builds ns "x" with the pods given and the policies given.
func snap(t *testing.T, pods []Pod, nps ...*networkingv1.NetworkPolicy) *Snapshot {
	t.Helper()
	s := New()
	for _, p := range pods {
		s.UpsertPod(p)
	}
	for _, np := range nps {
		if np.Namespace == "" {
			np.Namespace = "x"
		}
		if err := s.UpsertPolicy(np); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestNamedPortProtocolMustMatch(t *testing.T) {
	srv := Pod{Namespace: "x", Name: "srv", Labels: map[string]string{"pod": "srv"}, IPs: addrs("10.0.0.1"),
		Ports: []ContainerPort{{Name: "http", Proto: policy.ProtoTCP, Port: 80}}}
	np := genPolicyLabels("p", map[string]string{"pod": "srv"},
		ingressRules(networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{namedPortOf("http", &protoUDP)}}))
	ep := mustEndpoint(t, snap(t, []Pod{srv}, np), "x", "srv")
	if !ep.Ingress.Isolated || len(ep.Ingress.Allows) != 0 {
		t.Fatalf("UDP named port resolved on a TCP container port: %+v", ep.Ingress)
	}
}

func TestNamedEgressPortPerDestination(t *testing.T) {
	cli := Pod{Namespace: "x", Name: "cli", Labels: map[string]string{"pod": "cli"}, IPs: addrs("10.0.0.1", "fd00::1")}
	b := Pod{Namespace: "x", Name: "b", Labels: map[string]string{"pod": "b"}, IPs: addrs("10.0.0.2", "fd00::2"),
		Ports: []ContainerPort{{Name: "http", Proto: policy.ProtoTCP, Port: 8080}}}
	c := Pod{Namespace: "y", Name: "c", Labels: map[string]string{"pod": "c"}, IPs: addrs("10.0.0.3"),
		Ports: []ContainerPort{{Name: "http", Proto: policy.ProtoTCP, Port: 8081}}}
	d := Pod{Namespace: "y", Name: "d", Labels: map[string]string{"pod": "d"}, IPs: addrs("10.0.0.4")} // no such port
	h := Pod{Namespace: "y", Name: "h", HostNetwork: true, IPs: addrs("192.168.1.1"),
		Ports: []ContainerPort{{Name: "http", Proto: policy.ProtoTCP, Port: 80}}}
	np := genPolicyLabels("p", map[string]string{"pod": "cli"},
		egressRules(networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{namedPortOf("http", nil)}}))
	ep := mustEndpoint(t, snap(t, []Pod{cli, b, c, d, h}, np), "x", "cli")
	p := func(first uint16) []policy.PortRange { return []policy.PortRange{tcp(first, first)} }
	want := []policy.Allow{
		{Prefix: pfx("10.0.0.2/32"), Ports: p(8080)},
		{Prefix: pfx("10.0.0.3/32"), Ports: p(8081)},
		{Prefix: pfx("fd00::2/128"), Ports: p(8080)},
	}
	if !reflect.DeepEqual(ep.Egress.Allows, want) || !ep.Egress.Isolated || ep.Ingress.Isolated {
		t.Fatalf("egress named port:\n got %+v\nwant %+v", ep.Egress, want)
	}
}

func TestEndPortAndEmptyPeers(t *testing.T) {
	srv := Pod{Namespace: "x", Name: "srv", IPs: addrs("10.0.0.1")}
	first := intstr.FromInt32(8000)
	end := int32(8100)
	np := genPolicy("p", metav1.LabelSelector{},
		ingressRules(networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Port: &first, EndPort: &end}}}))
	ep := mustEndpoint(t, snap(t, []Pod{srv}, np), "x", "srv")
	want := []policy.Allow{
		{Prefix: pfx("0.0.0.0/0"), Ports: []policy.PortRange{tcp(8000, 8100)}},
		{Prefix: pfx("::/0"), Ports: []policy.PortRange{tcp(8000, 8100)}},
	}
	if !reflect.DeepEqual(ep.Ingress.Allows, want) {
		t.Fatalf("endPort:\n got %+v\nwant %+v", ep.Ingress.Allows, want)
	}
}

func TestIPBlockIsPerFamilyAndMatchesPods(t *testing.T) {
	srv := Pod{Namespace: "x", Name: "srv", IPs: addrs("10.0.0.1", "fd00::1")}
	np := genPolicy("p", metav1.LabelSelector{},
		ingressRules(from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/24", Except: []string{"10.0.0.128/25"}}})))
	ep := mustEndpoint(t, snap(t, []Pod{srv}, np), "x", "srv")
	for _, c := range []struct {
		addr string
		want bool
	}{{"10.0.0.5", true}, {"10.0.0.200", false}, {"10.0.1.1", false}, {"fd00::5", false}} {
		if got := Match(ep.Ingress, netip.MustParseAddr(c.addr), policy.ProtoTCP, 80); got != c.want {
			t.Errorf("%s: %v, want %v (%+v)", c.addr, got, c.want, ep.Ingress)
		}
	}
	// An IPv4-mapped block means its IPv4 addresses.
	np = genPolicy("p", metav1.LabelSelector{},
		ingressRules(from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "::ffff:10.0.0.0/120"}})))
	ep = mustEndpoint(t, snap(t, []Pod{srv}, np), "x", "srv")
	if !reflect.DeepEqual(ep.Ingress.Allows, []policy.Allow{{Prefix: pfx("10.0.0.0/24"), AllPorts: true}}) {
		t.Fatalf("mapped block: %+v", ep.Ingress.Allows)
	}
}

func TestHostNetworkAndAddresslessPods(t *testing.T) {
	srv := Pod{Namespace: "x", Name: "srv", Labels: map[string]string{"app": "srv"}, IPs: addrs("10.0.0.1")}
	host := Pod{Namespace: "x", Name: "host", Labels: map[string]string{"app": "cli"}, HostNetwork: true, IPs: addrs("192.168.1.1")}
	pending := Pod{Namespace: "x", Name: "pending", Labels: map[string]string{"app": "cli"}}
	cli := Pod{Namespace: "x", Name: "cli", Labels: map[string]string{"app": "cli"}, IPs: addrs("10.0.0.2")}
	np := genPolicy("p", metav1.LabelSelector{},
		ingressRules(from(networkingv1.NetworkPolicyPeer{PodSelector: podSel(map[string]string{"app": "cli"})})))
	s := snap(t, []Pod{srv, host, pending, cli}, np)
	ep := mustEndpoint(t, s, "x", "srv")
	if !reflect.DeepEqual(ep.Ingress.Allows, []policy.Allow{{Prefix: pfx("10.0.0.2/32"), AllPorts: true}}) {
		t.Fatalf("selector peers must be the addressed, pod-network pods only: %+v", ep.Ingress.Allows)
	}
	if ep := mustEndpoint(t, s, "x", "host"); ep.Ingress.Isolated || ep.Egress.Isolated {
		t.Fatalf("a host-network pod isolated: %+v", ep)
	}
	if ep := mustEndpoint(t, s, "x", "pending"); !ep.Ingress.Isolated {
		t.Fatalf("a pod without addresses yet is still selected: %+v", ep)
	}
}

func TestPolicyTypesDefaulting(t *testing.T) {
	pod := Pod{Namespace: "x", Name: "a", IPs: addrs("10.0.0.1")}
	egressOnlyRules := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
		Egress: []networkingv1.NetworkPolicyEgressRule{{}}}}
	egressOnlyRules.Name = "eg"
	ep := mustEndpoint(t, snap(t, []Pod{pod}, egressOnlyRules), "x", "a")
	if !ep.Ingress.Isolated || !ep.Egress.Isolated || len(ep.Ingress.Allows) != 0 || len(ep.Egress.Allows) != 2 {
		t.Fatalf("no policyTypes with egress rules: ingress isolated (deny), egress allow-all: %+v", ep)
	}
	ingressRulesOnly := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{{}}}}
	ingressRulesOnly.Name = "in"
	ep = mustEndpoint(t, snap(t, []Pod{pod}, ingressRulesOnly), "x", "a")
	if !ep.Ingress.Isolated || ep.Egress.Isolated {
		t.Fatalf("no policyTypes, ingress rules only: %+v", ep)
	}
	typesWin := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Ingress:     []networkingv1.NetworkPolicyIngressRule{{}}}}
	typesWin.Name = "types"
	ep = mustEndpoint(t, snap(t, []Pod{pod}, typesWin), "x", "a")
	if ep.Ingress.Isolated || !ep.Egress.Isolated || len(ep.Egress.Allows) != 0 {
		t.Fatalf("policyTypes [Egress] with ingress rules: %+v", ep)
	}
}

// TestInvalidFailsClosed: what the API server would reject never opens
// traffic: the policy still isolates, the bad part allows nothing.
func TestInvalidFailsClosed(t *testing.T) {
	pod := Pod{Namespace: "x", Name: "a", Labels: map[string]string{"app": "a"}, IPs: addrs("10.0.0.1")}
	other := Pod{Namespace: "x", Name: "b", Labels: map[string]string{"app": "b"}, IPs: addrs("10.0.0.2")}
	bogus := corev1.Protocol("ICMP")
	for _, c := range []struct {
		name string
		np   *networkingv1.NetworkPolicy
		err  string
	}{
		{"bad cidr", genPolicy("p", metav1.LabelSelector{}, ingressRules(from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/33"}}))), "ipBlock.cidr"},
		{"bad except", genPolicy("p", metav1.LabelSelector{}, ingressRules(from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"nonsense"}}}))), "ipBlock.except"},
		{"bad protocol", genPolicy("p", metav1.LabelSelector{}, ingressRules(networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &bogus}}})), "unknown protocol"},
		{"bad port", genPolicy("p", metav1.LabelSelector{}, ingressRules(networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{numPort(0, nil)}})), "out of range"},
		{"empty peer", genPolicy("p", metav1.LabelSelector{}, ingressRules(from(networkingv1.NetworkPolicyPeer{}))), "no podSelector"},
		{"bad peer selector", genPolicy("p", metav1.LabelSelector{}, ingressRules(from(networkingv1.NetworkPolicyPeer{PodSelector: exprSel("app", "Near", "a")}))), "podSelector"},
		{"bad pod selector", genPolicy("p", *exprSel("app", metav1.LabelSelectorOpIn), ingressRules(networkingv1.NetworkPolicyIngressRule{})), "spec.podSelector"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := New()
			s.UpsertPod(pod)
			s.UpsertPod(other)
			c.np.Namespace = "x"
			err := s.UpsertPolicy(c.np)
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("error %v, want one naming %q", err, c.err)
			}
			ep := mustEndpoint(t, s, "x", "a")
			if !ep.Ingress.Isolated || len(ep.Ingress.Allows) != 0 {
				t.Fatalf("fails open: %+v", ep.Ingress)
			}
		})
	}
}

func TestNamespaceLabelsDefaultAndDelete(t *testing.T) {
	srv := Pod{Namespace: "x", Name: "srv", IPs: addrs("10.0.0.1")}
	cli := Pod{Namespace: "y", Name: "cli", IPs: addrs("10.0.0.2")}
	np := genPolicy("p", metav1.LabelSelector{},
		ingressRules(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{nsKey: "y"})}),
			from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{"team": "blue"})})))
	s := snap(t, []Pod{srv, cli}, np)
	cliAddr := netip.MustParseAddr("10.0.0.2")
	// Namespace y not seen yet: its name label is known anyway.
	if !Match(mustEndpoint(t, s, "x", "srv").Ingress, cliAddr, policy.ProtoTCP, 80) {
		t.Fatal("unseen namespace does not match its name label")
	}
	np2 := genPolicy("p", metav1.LabelSelector{},
		ingressRules(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{"team": "blue"})})))
	np2.Namespace = "x"
	if err := s.UpsertPolicy(np2); err != nil {
		t.Fatal(err)
	}
	s.TakeDirty()
	if Match(mustEndpoint(t, s, "x", "srv").Ingress, cliAddr, policy.ProtoTCP, 80) {
		t.Fatal("team label matched before any namespace had it")
	}
	s.UpsertNamespace("y", map[string]string{"team": "blue"})
	if d := s.TakeDirty(); !reflect.DeepEqual(d, []PodKey{{"x", "srv"}}) {
		t.Fatalf("dirty after the namespace relabel: %v", d)
	}
	if !Match(mustEndpoint(t, s, "x", "srv").Ingress, cliAddr, policy.ProtoTCP, 80) {
		t.Fatal("relabelled namespace does not match")
	}
	s.DeleteNamespace("y")
	if Match(mustEndpoint(t, s, "x", "srv").Ingress, cliAddr, policy.ProtoTCP, 80) {
		t.Fatal("deleted namespace keeps its labels")
	}
	s.DeletePod("y", "cli")
	if d := s.TakeDirty(); !reflect.DeepEqual(d, []PodKey{{"x", "srv"}, {"y", "cli"}}) {
		t.Fatalf("dirty after the delete: %v", d)
	}
	if _, ok := s.Endpoint("y", "cli"); ok {
		t.Fatal("deleted pod still known")
	}
}

// TestPoliciesOfOtherNamespacesDoNotSelect: a policy selects pods of its own
// namespace only, however wide its podSelector.
func TestPoliciesOfOtherNamespacesDoNotSelect(t *testing.T) {
	a := Pod{Namespace: "x", Name: "a", IPs: addrs("10.0.0.1")}
	np := genPolicy("deny", metav1.LabelSelector{}, ingressRules())
	np.Namespace = "y"
	ep := mustEndpoint(t, snap(t, []Pod{a}, np), "x", "a")
	if ep.Ingress.Isolated || len(ep.Policies) != 0 {
		t.Fatalf("selected across namespaces: %+v", ep)
	}
}

// TestResyncIsNoOp: the informers redeliver unchanged objects (resyncs, pod
// status updates, policy metadata edits); nothing recompiles for them, and a
// real change still does.
func TestResyncIsNoOp(t *testing.T) {
	a := Pod{Namespace: "x", Name: "a", Labels: map[string]string{"app": "a"}, IPs: addrs("10.0.0.1"),
		Ports: []ContainerPort{{Name: "http", Proto: policy.ProtoTCP, Port: 80}}}
	b := Pod{Namespace: "x", Name: "b", Labels: map[string]string{"app": "b"}, IPs: addrs("10.0.0.2")}
	np := genPolicy("p", metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}},
		ingressRules(from(networkingv1.NetworkPolicyPeer{PodSelector: podSel(map[string]string{"app": "b"})})))
	s := snap(t, []Pod{a, b}, np)
	mustEndpoint(t, s, "x", "a")
	s.TakeDirty()

	s.UpsertPod(Pod{Namespace: "x", Name: "a", Labels: map[string]string{"app": "a"}, IPs: addrs("10.0.0.1"),
		Ports: []ContainerPort{{Name: "http", Proto: policy.ProtoTCP, Port: 80}}})
	s.UpsertPod(b)
	s.UpsertNamespace("x", nil)
	s.TakeDirty() // the first sight of namespace x may dirty; its repeat may not
	s.UpsertNamespace("x", nil)
	again := np.DeepCopy()
	again.Annotations = map[string]string{"touched": "yes"}
	again.ResourceVersion = "2"
	if err := s.UpsertPolicy(again); err != nil {
		t.Fatal(err)
	}
	if d := s.TakeDirty(); len(d) != 0 {
		t.Fatalf("unchanged objects dirtied %v", d)
	}

	changed := again.DeepCopy()
	changed.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app"] = "c"
	if err := s.UpsertPolicy(changed); err != nil {
		t.Fatal(err)
	}
	if d := s.TakeDirty(); !reflect.DeepEqual(d, []PodKey{{"x", "a"}}) {
		t.Fatalf("a changed policy dirtied %v", d)
	}
	if Match(mustEndpoint(t, s, "x", "a").Ingress, netip.MustParseAddr("10.0.0.2"), policy.ProtoTCP, 80) {
		t.Fatal("the change was not compiled")
	}
	b.Labels = map[string]string{"app": "c"}
	s.UpsertPod(b)
	if d := s.TakeDirty(); !reflect.DeepEqual(d, []PodKey{{"x", "a"}, {"x", "b"}}) {
		t.Fatalf("a relabel dirtied %v", d)
	}
}
