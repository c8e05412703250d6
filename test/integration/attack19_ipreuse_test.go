// attack19: IP reuse. The kubelet tears a pod's sandbox down (CNI DEL,
// the address back to IPAM) before the API server deletes the pod object:
// between the two the object still says Running with that address. A new
// pod of other labels ADDed on the node meanwhile gets the address
// (host-local hands it out again). Does it inherit the old pod's access?

package integration

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	corev1 "k8s.io/api/core/v1"
)

// clientEgressTo: pods app=client may send TCP 8080 to pods app=<to> only.
func clientEgressTo(to string) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(8080)
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "client-egress"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": to}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		}}
}

// tornDown is the kubelet's teardown of pod name: CNI DEL, then the object
// marked for deletion (still Running, its addresses still in its status).
func (l *a19Lab) tornDown(t *testing.T, netns ns.NetNS, name string) {
	t.Helper()
	must(t, l.Del(netns, name, "eth0"))
	ctx := context.Background()
	p, err := l.cs.CoreV1().Pods("ns").Get(ctx, name, metav1.GetOptions{})
	must(t, err)
	now := metav1.Now()
	p.DeletionTimestamp = &now
	_, err = l.cs.CoreV1().Pods("ns").Update(ctx, p, metav1.UpdateOptions{})
	must(t, err)
}

// leakFor probes from netns to each address on port for d and returns how
// many of the probes connected.
func leakFor(from ns.NetNS, ips []net.IP, port int, d time.Duration) (ok, tries int) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		for _, ip := range ips {
			tries++
			if dialOK(from, ip, port) {
				ok++
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return ok, tries
}

// TestAttack19IPReuse: three addresses per family, so host-local hands a
// torn-down pod's address to the next ADD. server (app=server) admits TCP
// 8080 from app=client only; client and client2 (app=client) may send only
// to app=server.
//   - inherit-ingress: client torn down, intruder (app=intruder, selected by
//     no policy) gets its addresses: it must not reach server while the old
//     object lingers, nor after it is gone.
//   - inherit-across-namespaces: client2 torn down, spy (namespace ns2,
//     app=client: a podSelector peer means the policy's namespace only) gets
//     its addresses: it must not reach server;
//   - inherit-peer: the intruder gone, client3 (app=client) takes its
//     addresses; server torn down, web (app=web, open) gets server's
//     addresses and serves 8080: client3's egress names app=server only, so
//     client3 must not reach web.
func TestAttack19IPReuse(t *testing.T) {
	l := newA19Lab(t, map[string]any{"type": "host-local", "ranges": [][]map[string]string{
		{{"subnet": "10.250.0.0/24", "rangeStart": "10.250.0.10", "rangeEnd": "10.250.0.12"}},
		{{"subnet": "fd00:250::/64", "rangeStart": "fd00:250::10", "rangeEnd": "fd00:250::12"}},
	}})
	ctx := context.Background()
	for _, np := range []*networkingv1.NetworkPolicy{serverIngressFrom("client"), clientEgressTo("server")} {
		_, err := l.cs.NetworkingV1().NetworkPolicies("ns").Create(ctx, np, metav1.CreateOptions{})
		must(t, err)
	}
	server, sIP := l.pod(t, "server", map[string]string{"app": "server"})
	client, cIP := l.pod(t, "client", map[string]string{"app": "client"})
	client2, c2IP := l.pod(t, "client2", map[string]string{"app": "client"})
	serve(t, server, 8080, "server")
	srv := []net.IP{sIP[4], sIP[6]}
	for _, fam := range []int{4, 6} {
		reach(t, client, "tcp", sIP[fam], 8080, "server")
		reach(t, client2, "tcp", sIP[fam], 8080, "server")
	}

	var intruderNS ns.NetNS
	t.Run("inherit-ingress", func(t *testing.T) {
		l.tornDown(t, client, "client")
		intruder, iIP := l.pod(t, "intruder", map[string]string{"app": "intruder"})
		intruderNS = intruder
		if !iIP[4].Equal(cIP[4]) || !iIP[6].Equal(cIP[6]) {
			t.Fatalf("intruder got %v, want the torn-down client's %v (IPAM did not reuse)", iIP, cIP)
		}
		if ok, n := leakFor(intruder, srv, 8080, 2*time.Second); ok > 0 {
			t.Errorf("intruder (app=intruder) on the torn-down client's addresses %s, %s connected to server %d times of %d in 2 s while the old object lingered", iIP[4], iIP[6], ok, n)
		}
		// The kubelet's status sync: the old pod's phase turns terminal
		// (its addresses no longer count, docs/networkpolicy.md).
		old, err := l.cs.CoreV1().Pods("ns").Get(ctx, "client", metav1.GetOptions{})
		must(t, err)
		old.Status.Phase = corev1.PodFailed
		_, err = l.cs.CoreV1().Pods("ns").UpdateStatus(ctx, old, metav1.UpdateOptions{})
		must(t, err)
		settle()
		if ok, n := leakFor(intruder, srv, 8080, time.Second); ok > 0 {
			t.Errorf("intruder connected to server %d times of %d after the old pod's phase turned Failed", ok, n)
		}
		must(t, l.cs.CoreV1().Pods("ns").Delete(ctx, "client", metav1.DeleteOptions{}))
		settle()
		if ok, n := leakFor(intruder, srv, 8080, time.Second); ok > 0 {
			t.Errorf("intruder connected to server %d times of %d after the old object was deleted", ok, n)
		}
	})

	t.Run("inherit-across-namespaces", func(t *testing.T) {
		l.tornDown(t, client2, "client2")
		spy, pIP := l.podIn(t, "ns2", "spy", map[string]string{"app": "client"})
		if !pIP[4].Equal(c2IP[4]) || !pIP[6].Equal(c2IP[6]) {
			t.Fatalf("spy got %v, want the torn-down client2's %v (IPAM did not reuse)", pIP, c2IP)
		}
		if ok, n := leakFor(spy, srv, 8080, 2*time.Second); ok > 0 {
			t.Errorf("spy (ns2, app=client: no peer of ns's podSelector) on the torn-down client2's addresses %s, %s connected to server %d times of %d in 2 s while the old object lingered", pIP[4], pIP[6], ok, n)
		}
		must(t, l.cs.CoreV1().Pods("ns").Delete(ctx, "client2", metav1.DeleteOptions{}))
		settle()
		if ok, n := leakFor(spy, srv, 8080, time.Second); ok > 0 {
			t.Errorf("spy connected to server %d times of %d after the old object was deleted", ok, n)
		}
	})

	t.Run("inherit-peer", func(t *testing.T) {
		// client3 (app=client) takes the address the intruder frees.
		l.tornDown(t, intruderNS, "intruder")
		must(t, l.cs.CoreV1().Pods("ns").Delete(ctx, "intruder", metav1.DeleteOptions{}))
		client3, _ := l.pod(t, "client3", map[string]string{"app": "client"})
		wantTCP(t, "client3 to server", client3, sIP, 8080, true)
		l.tornDown(t, server, "server")
		web, wIP := l.pod(t, "web", map[string]string{"app": "web"})
		if !wIP[4].Equal(sIP[4]) || !wIP[6].Equal(sIP[6]) {
			t.Fatalf("web got %v, want the torn-down server's %v (IPAM did not reuse)", wIP, sIP)
		}
		serve(t, web, 8080, "web")
		for _, fam := range []int{4, 6} {
			reach(t, l.Node, "tcp", wIP[fam], 8080, "web")
		}
		if ok, n := leakFor(client3, []net.IP{wIP[4], wIP[6]}, 8080, 2*time.Second); ok > 0 {
			t.Errorf("client3 (egress to app=server only) connected to web (app=web) on the torn-down server's addresses %d times of %d in 2 s while the old object lingered", ok, n)
		}
		must(t, l.cs.CoreV1().Pods("ns").Delete(ctx, "server", metav1.DeleteOptions{}))
		settle()
		if ok, n := leakFor(client3, []net.IP{wIP[4], wIP[6]}, 8080, time.Second); ok > 0 {
			t.Errorf("client3 connected to web %d times of %d after the old object was deleted", ok, n)
		}
	})
}
