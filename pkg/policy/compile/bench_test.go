package compile

import (
	"fmt"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The bench cluster: 20 namespaces of 50 pods (dual-stack, ports http and
// metrics named), 25 policies per namespace of five kinds: in-namespace
// allow by pod label and port, cross-namespace allow on a named port,
// egress to DNS anywhere plus an ipBlock with a hole, egress on a named port,
// and a namespace-wide default deny.
const (
	benchNamespaces = 20
	benchPodsPerNS  = 50
	benchPolsPerNS  = 25
)

func benchPod(ns, i, gen int) Pod {
	n := ns*benchPodsPerNS + i
	return Pod{
		Namespace: fmt.Sprintf("ns%d", ns),
		Name:      fmt.Sprintf("pod%d", i),
		Labels:    map[string]string{"app": fmt.Sprintf("app%d", (i+gen)%10), "tier": fmt.Sprintf("t%d", (i+gen)%3)},
		IPs: []netip.Addr{
			netip.AddrFrom4([4]byte{10, 244, byte(n >> 8), byte(n)}),
			netip.AddrFrom16([16]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(n >> 8), byte(n)}),
		},
		Ports: []ContainerPort{{Name: "http", Proto: 6, Port: 8080}, {Name: "metrics", Proto: 6, Port: 9090}},
	}
}

func benchPolicy(ns, i int) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{}
	np.Namespace, np.Name = fmt.Sprintf("ns%d", ns), fmt.Sprintf("pol%d", i)
	app := func(k int) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", k%10)}}
	}
	port := func(p int32, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
		v := intstr.FromInt32(p)
		return networkingv1.NetworkPolicyPort{Port: &v, Protocol: &proto}
	}
	named := func(n string) networkingv1.NetworkPolicyPort {
		v := intstr.FromString(n)
		return networkingv1.NetworkPolicyPort{Port: &v}
	}
	switch i % 10 {
	case 0, 1, 2, 3:
		np.Spec.PodSelector = *app(i)
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: app(i + 1)}, {PodSelector: app(i + 2)}},
			Ports: []networkingv1.NetworkPolicyPort{port(8080, corev1.ProtocolTCP), port(8443, corev1.ProtocolTCP)},
		}}
	case 4, 5:
		np.Spec.PodSelector = *app(i)
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{fmt.Sprintf("team%d", i%4)}}}},
				PodSelector:       app(i + 3),
			}},
			Ports: []networkingv1.NetworkPolicyPort{named("http")},
		}}
	case 6, 7:
		np.Spec.PodSelector = *app(i)
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{
			{
				To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{nsNameLabel: "ns0"}}, PodSelector: app(0)}},
				Ports: []networkingv1.NetworkPolicyPort{port(53, corev1.ProtocolUDP), port(53, corev1.ProtocolTCP)},
			},
			{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.244.0.0/16"}}}},
				Ports: []networkingv1.NetworkPolicyPort{port(443, corev1.ProtocolTCP)},
			},
		}
	case 8:
		np.Spec.PodSelector = *app(i)
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
			To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: app(i + 1)}},
			Ports: []networkingv1.NetworkPolicyPort{named("metrics")},
		}}
	case 9:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	}
	return np
}

func benchSnapshot(b *testing.B) *Snapshot {
	s := New()
	for ns := range benchNamespaces {
		s.UpsertNamespace(fmt.Sprintf("ns%d", ns), map[string]string{"team": fmt.Sprintf("team%d", ns%4)})
		for i := range benchPodsPerNS {
			s.UpsertPod(benchPod(ns, i, 0))
		}
		for i := range benchPolsPerNS {
			if err := s.UpsertPolicy(benchPolicy(ns, i)); err != nil {
				b.Fatal(err)
			}
		}
	}
	return s
}

// compileAll computes every pod's endpoint; it returns how many entries.
func compileAll(s *Snapshot) int {
	n := 0
	for ns := range benchNamespaces {
		for i := range benchPodsPerNS {
			ep, _ := s.Endpoint(fmt.Sprintf("ns%d", ns), fmt.Sprintf("pod%d", i))
			n += len(ep.Ingress.Allows) + len(ep.Egress.Allows)
		}
	}
	return n
}

// cpuTime is the process's user+system time: on a shared machine the wall
// clock of ns/op measures the neighbours too, the CPU time measures us
// (garbage collection included).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds cpu-ms/op from a start taken before the loop.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
}

func recompileDirty(s *Snapshot) int {
	d := s.TakeDirty()
	for _, k := range d {
		s.Endpoint(k.Namespace, k.Name)
	}
	return len(d)
}

// BenchmarkCompileAll: 1000 pods x 500 policies from nothing: load the
// objects and compile every pod's endpoint (an agent start compiles only its
// node's pods; this is the whole cluster).
func BenchmarkCompileAll(b *testing.B) {
	b.ReportAllocs()
	entries := 0
	start := cpuTime(b)
	for b.Loop() {
		s := benchSnapshot(b)
		entries = compileAll(s)
	}
	reportCPU(b, start)
	b.ReportMetric(float64(entries)/float64(benchNamespaces*benchPodsPerNS), "entries/pod")
	// The snapshot's steady memory: what the agent holds.
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := benchSnapshot(b)
	compileAll(s)
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
	runtime.KeepAlive(s)
}

// BenchmarkCompilePodRelabel: one pod's labels change on a compiled snapshot;
// the snapshot invalidates what it may affect, and the dirty pods recompile.
func BenchmarkCompilePodRelabel(b *testing.B) {
	s := benchSnapshot(b)
	compileAll(s)
	s.TakeDirty()
	b.ReportAllocs()
	dirty, gen := 0, 0
	start := cpuTime(b)
	for b.Loop() {
		gen++
		s.UpsertPod(benchPod(gen%benchNamespaces, gen%benchPodsPerNS, gen))
		dirty += recompileDirty(s)
	}
	reportCPU(b, start)
	b.ReportMetric(float64(dirty)/float64(b.N), "dirty-pods/op")
}

// BenchmarkCompilePodAdd: a new pod appears (and goes): the common event.
func BenchmarkCompilePodAdd(b *testing.B) {
	s := benchSnapshot(b)
	compileAll(s)
	s.TakeDirty()
	b.ReportAllocs()
	dirty, gen := 0, 0
	start := cpuTime(b)
	for b.Loop() {
		gen++
		p := benchPod(gen%benchNamespaces, benchPodsPerNS+gen%7, 0)
		p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 245, byte(gen >> 8), byte(gen)})}
		s.UpsertPod(p)
		dirty += recompileDirty(s)
		s.DeletePod(p.Namespace, p.Name)
		dirty += recompileDirty(s)
	}
	reportCPU(b, start)
	b.ReportMetric(float64(dirty)/float64(b.N), "dirty-pods/op")
}

// BenchmarkCompilePolicyUpdate: one policy is replaced.
func BenchmarkCompilePolicyUpdate(b *testing.B) {
	s := benchSnapshot(b)
	compileAll(s)
	s.TakeDirty()
	b.ReportAllocs()
	dirty, gen := 0, 0
	start := cpuTime(b)
	for b.Loop() {
		gen++
		np := benchPolicy(gen%benchNamespaces, gen%benchPolsPerNS)
		// A change of its rules (an equal spec would be a resync: nothing
		// to do): one more ingress port, another at each op.
		v := intstr.FromInt32(int32(1000 + gen%2))
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Port: &v}}})
		if err := s.UpsertPolicy(np); err != nil {
			b.Fatal(err)
		}
		dirty += recompileDirty(s)
	}
	reportCPU(b, start)
	b.ReportMetric(float64(dirty)/float64(b.N), "dirty-pods/op")
}

// BenchmarkCompileNamespaceRelabel: a namespace's labels change so
// namespaceSelector peers flip.
func BenchmarkCompileNamespaceRelabel(b *testing.B) {
	s := benchSnapshot(b)
	compileAll(s)
	s.TakeDirty()
	b.ReportAllocs()
	dirty, gen := 0, 0
	start := cpuTime(b)
	for b.Loop() {
		gen++
		ns := gen % benchNamespaces // its team moves on by one each time: selectors flip
		s.UpsertNamespace(fmt.Sprintf("ns%d", ns), map[string]string{"team": fmt.Sprintf("team%d", (ns+1+gen/benchNamespaces)%4)})
		dirty += recompileDirty(s)
	}
	reportCPU(b, start)
	b.ReportMetric(float64(dirty)/float64(b.N), "dirty-pods/op")
}

// BenchmarkCompileWidePeer: the widest selector peer, every pod of the
// cluster (namespaceSelector {}), on top of the bench policies: one pod's
// compile and its entry count. The bench numbers its pods in a row, so
// aggregation folds their addresses into a few prefixes; with every other
// address skipped nothing folds: one entry per pod address.
func BenchmarkCompileWidePeer(b *testing.B) {
	for _, c := range []struct {
		name   string
		stride int
	}{{"consecutive", 1}, {"every-other-address", 2}} {
		b.Run(c.name, func(b *testing.B) {
			s := benchSnapshot(b)
			spread := func(p Pod) Pod {
				for i, a := range p.IPs {
					raw := a.AsSlice()
					n := (int(raw[len(raw)-2])<<8 | int(raw[len(raw)-1])) * c.stride
					raw[len(raw)-2], raw[len(raw)-1] = byte(n>>8), byte(n)
					raw[len(raw)-3] += byte(n >> 16)
					p.IPs[i], _ = netip.AddrFromSlice(raw)
				}
				return p
			}
			for ns := range benchNamespaces {
				for i := range benchPodsPerNS {
					s.UpsertPod(spread(benchPod(ns, i, 0)))
				}
			}
			np := &networkingv1.NetworkPolicy{}
			np.Namespace, np.Name = "ns0", "from-everyone"
			np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "app0"}}
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}}}
			if err := s.UpsertPolicy(np); err != nil {
				b.Fatal(err)
			}
			compileAll(s)
			b.ReportAllocs()
			entries := 0
			start := cpuTime(b)
			gen := 0
			for b.Loop() {
				// A label no selector reads, another at each op: dirties
				// ns0/pod0 only (an equal pod would be a resync).
				gen++
				p := spread(benchPod(0, 0, 0))
				p.Labels["gen"] = fmt.Sprint(gen % 2)
				s.UpsertPod(p)
				ep, _ := s.Endpoint("ns0", "pod0")
				entries = len(ep.Ingress.Allows)
			}
			reportCPU(b, start)
			b.ReportMetric(float64(entries), "ingress-entries")
		})
	}
}

// BenchmarkCompileNodeChange is test/bench/netpol's "policy change to
// enforcement" without the writer: 1000 pods of one namespace, 500
// policies, the node's 110 local pods each selected by a policy of its own
// (app=a<i>) and by "local" (role=local), both admitting all 1000 pods on a
// port; one op: "local" moves its port and the 110 local pods recompile.
// "shared" is Snapshot.Endpoint; "per-pod" compiles each pod on its own
// from all its atoms, as before the pods shared work.
const nodePods, nodeLocal, nodePolicies = 1000, 110, 500

// nodePolicy is a policy of BenchmarkCompileNodeChange's namespace.
func nodePolicy(name string, sel map[string]string, port int32) *networkingv1.NetworkPolicy {
	return ingressPolicy("bench", name, sel, intstr.FromInt32(port), map[string]string{"role": "peer"}, map[string]string{"role": "local"})
}

// nodePod is pod i of BenchmarkCompileNodeChange's namespace (the first
// nodeLocal are the node's).
func nodePod(i int) Pod {
	role := "peer"
	if i < nodeLocal {
		role = "local"
	}
	return Pod{Namespace: "bench", Name: fmt.Sprintf("p%04d", i),
		Labels: map[string]string{"app": fmt.Sprintf("a%d", i%nodePolicies), "role": role},
		IPs:    []netip.Addr{netip.AddrFrom4([4]byte{10, 245, byte(i / 256), byte(i % 256)})}}
}

// BenchmarkCompileFirstList: an agent's first list at the scale of
// BenchmarkCompileNodeChange, the policies delivered before the pods (each
// new pod is a peer of all 500), then the 110 local pods compiled.
func BenchmarkCompileFirstList(b *testing.B) {
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		s := New()
		for i := range nodePolicies - 1 {
			if err := s.UpsertPolicy(nodePolicy(fmt.Sprintf("p%03d", i), map[string]string{"app": fmt.Sprintf("a%d", i)}, 80)); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.UpsertPolicy(nodePolicy("local", map[string]string{"role": "local"}, 6000)); err != nil {
			b.Fatal(err)
		}
		for i := range nodePods {
			s.UpsertPod(nodePod(i))
		}
		for i := range nodeLocal {
			s.Endpoint("bench", nodePod(i).Name)
		}
	}
	reportCPU(b, start)
}

func BenchmarkCompileNodeChange(b *testing.B) {
	const pods, local, policies = nodePods, nodeLocal, nodePolicies
	pol := nodePolicy
	for _, mode := range []string{"shared", "per-pod"} {
		b.Run(mode, func(b *testing.B) {
			s := New()
			var locals []PodKey
			for i := range pods {
				p := nodePod(i)
				s.UpsertPod(p)
				if i < local {
					locals = append(locals, PodKey{p.Namespace, p.Name})
				}
			}
			for i := range policies - 1 {
				if err := s.UpsertPolicy(pol(fmt.Sprintf("p%03d", i), map[string]string{"app": fmt.Sprintf("a%d", i)}, 80)); err != nil {
					b.Fatal(err)
				}
			}
			isLocal := map[PodKey]bool{}
			for _, k := range locals {
				isLocal[k] = true
			}
			endpoint := s.Endpoint
			if mode == "per-pod" {
				endpoint = s.endpointPerPod
			}
			port := int32(6000)
			change := func() int {
				port++
				if err := s.UpsertPolicy(pol("local", map[string]string{"role": "local"}, port)); err != nil {
					b.Fatal(err)
				}
				entries := 0
				for _, k := range s.TakeDirty() {
					if isLocal[k] {
						ep, _ := endpoint(k.Namespace, k.Name)
						entries += len(ep.Ingress.Allows)
					}
				}
				return entries
			}
			change() // the first pass: every policy resolved
			b.ReportAllocs()
			entries := 0
			start := cpuTime(b)
			for b.Loop() {
				entries = change()
			}
			reportCPU(b, start)
			b.ReportMetric(float64(entries)/local, "entries/pod")
		})
	}
}
