// attack19: label and namespace changes of running pods, a pod selected by
// two policies (the union of their allows), a namespace default deny beside
// an allow, and podSelector peers that must stay within their namespace.

package integration

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// podIn is a19Lab.pod for a pod of namespace podNS.
func (l *a19Lab) podIn(t *testing.T, podNS, name string, labels map[string]string) (ns.NetNS, map[int]net.IP) {
	t.Helper()
	if podNS == "ns" {
		return l.pod(t, name, labels)
	}
	netns := l.NewPod()
	l.CleanupDel(netns, name)
	rc := &libcni.RuntimeConf{ContainerID: name, NetNS: netns.Path(), IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", podNS}, {"K8S_POD_NAME", name}}}
	var res *current.Result
	must(t, l.InNode(func() error {
		r, err := l.CNI.AddNetworkList(context.Background(), l.ConfList("1.1.0"), rc)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(r)
		return err
	}))
	if l.m == nil {
		l.start(t)
	}
	v4, v6 := resultIPs(res)
	p := k8sPod(name, labels, v4, v6)
	p.Namespace = podNS
	_, err := l.cs.CoreV1().Pods(podNS).Create(context.Background(), p, metav1.CreateOptions{})
	must(t, err)
	l.waitProgrammed(t, name)
	return netns, map[int]net.IP{4: v4, 6: v6}
}

func (l *a19Lab) relabelPod(t *testing.T, podNS, name string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	p, err := l.cs.CoreV1().Pods(podNS).Get(ctx, name, metav1.GetOptions{})
	must(t, err)
	p.Labels = labels
	_, err = l.cs.CoreV1().Pods(podNS).Update(ctx, p, metav1.UpdateOptions{})
	must(t, err)
	settle()
}

func (l *a19Lab) namespace(t *testing.T, name string, labels map[string]string, update bool) {
	t.Helper()
	labels["kubernetes.io/metadata.name"] = name
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	var err error
	if update {
		_, err = l.cs.CoreV1().Namespaces().Update(context.Background(), n, metav1.UpdateOptions{})
	} else {
		_, err = l.cs.CoreV1().Namespaces().Create(context.Background(), n, metav1.CreateOptions{})
	}
	must(t, err)
	settle()
}

// ingressPolicy: pods app=server accept TCP port from peers.
func ingressPolicy(name string, port int32, peers ...networkingv1.NetworkPolicyPeer) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	p := intstr.FromInt32(port)
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peers,
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}}},
		}}
}

func podPeer(labels map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: labels}}
}

func nsPeer(labels map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: labels}}
}

// wantTCP wants TCP from netns to each address on port to connect (ok) or
// not (denied).
func wantTCP(t *testing.T, what string, from ns.NetNS, ips map[int]net.IP, port int, ok bool) {
	t.Helper()
	for _, fam := range []int{4, 6} {
		if got := dialOK(from, ips[fam], port); got != ok {
			t.Errorf("%s: TCP to %s connected %v, want %v", what, hp(ips[fam], port), got, ok)
		}
	}
}

// TestAttack19Labels: in namespace ns a default deny of ingress for every
// pod, and server (app=server) selected by two policies: TCP 8080 from
// app=client of ns, TCP 9090 from any pod of a namespace labelled team=a.
// client (ns, app=client), outsider (ns2, team=a, app=client). Then
// relabels, with a connection of client's held open throughout.
func TestAttack19Labels(t *testing.T) {
	l := newA19Lab(t, nil)
	ctx := context.Background()
	for _, np := range []*networkingv1.NetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "default-deny"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
		ingressPolicy("from-clients", 8080, podPeer(map[string]string{"app": "client"})),
		ingressPolicy("from-team-a", 9090, nsPeer(map[string]string{"team": "a"})),
	} {
		_, err := l.cs.NetworkingV1().NetworkPolicies("ns").Create(ctx, np, metav1.CreateOptions{})
		must(t, err)
	}
	l.namespace(t, "ns2", map[string]string{"team": "a"}, false)
	server, sIP := l.pod(t, "server", map[string]string{"app": "server"})
	client, cIP := l.pod(t, "client", map[string]string{"app": "client"})
	outsider, _ := l.podIn(t, "ns2", "outsider", map[string]string{"app": "client"})
	for _, port := range []int{8080, 9090} {
		serve(t, server, port, "server")
		serve(t, client, port, "client")
	}

	t.Run("union-and-default-deny", func(t *testing.T) {
		wantTCP(t, "client 8080", client, sIP, 8080, true)
		wantTCP(t, "client 9090 (from-team-a only)", client, sIP, 9090, false)
		wantTCP(t, "outsider 9090 (ns2 team=a)", outsider, sIP, 9090, true)
		wantTCP(t, "outsider 8080 (app=client, but of ns2)", outsider, sIP, 8080, false)
		wantTCP(t, "server to client (default deny)", server, cIP, 8080, false)
		wantTCP(t, "outsider to client (default deny)", outsider, cIP, 9090, false)
	})

	accepted := acceptTCP(t, server, 4, net.JoinHostPort(sIP[4].String(), "7070"))
	// The held connection: its port is no policy's, so open it while the
	// from-clients policy allows everything of client's.
	wide := ingressPolicy("from-clients", 7070, podPeer(map[string]string{"app": "client"}))
	_, err := l.cs.NetworkingV1().NetworkPolicies("ns").Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "held"}, Spec: wide.Spec}, metav1.CreateOptions{})
	must(t, err)
	settle()
	held := dialPair(t, client, net.JoinHostPort(sIP[4].String(), "7070"), accepted, "held", 4)

	t.Run("pod-relabelled", func(t *testing.T) {
		l.relabelPod(t, "ns", "client", map[string]string{"app": "nobody"})
		wantTCP(t, "relabelled client 8080", client, sIP, 8080, false)
		wantTCP(t, "relabelled client 7070", client, sIP, 7070, false)
		// Documented: a flow outlives a policy change (docs/networkpolicy.md, Flows).
		exchange(t, held, "after the relabel")
		l.relabelPod(t, "ns", "client", map[string]string{"app": "client"})
		wantTCP(t, "client relabelled back, 8080", client, sIP, 8080, true)
	})

	t.Run("namespace-relabelled", func(t *testing.T) {
		l.namespace(t, "ns2", map[string]string{"team": "b"}, true)
		wantTCP(t, "outsider 9090, ns2 now team=b", outsider, sIP, 9090, false)
		l.namespace(t, "ns2", map[string]string{"team": "a"}, true)
		wantTCP(t, "outsider 9090, ns2 team=a again", outsider, sIP, 9090, true)
	})

	t.Run("namespace-deleted-and-recreated", func(t *testing.T) {
		must(t, l.cs.CoreV1().Namespaces().Delete(ctx, "ns2", metav1.DeleteOptions{}))
		settle()
		wantTCP(t, "outsider 9090, ns2 deleted", outsider, sIP, 9090, false)
	})
}

// exchange wants a round trip both ways on an established connection.
func exchange(t *testing.T, c connPair, when string) {
	t.Helper()
	for _, dir := range []struct {
		name string
		w, r net.Conn
	}{{"client->server", c.client, c.srv}, {"server->client", c.srv, c.client}} {
		if _, err := dir.w.Write([]byte("x")); err != nil {
			t.Errorf("%s %s: write: %v", when, dir.name, err)
			continue
		}
		dir.r.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 1)
		if _, err := dir.r.Read(buf); err != nil {
			t.Errorf("%s %s: the established connection's segment did not arrive: %v", when, dir.name, err)
		}
	}
}
