// NetworkPolicy with the agent's controller (pkg/agent/netpol) present:
// pods added through the plugin binary as a runtime does, the API objects
// in a fake clientset, the controller programming the real pinned maps.

package integration

import (
	"context"
	"encoding/json"
	"log"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent/netpol"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// gatedWriter holds back the first Apply of one interface until open is
// closed: the window in which a new pod exists but is not programmed yet,
// made as long as the test needs.
type gatedWriter struct {
	*maps.PolicyWriter
	mu      sync.Mutex
	hold    map[uint32]chan struct{}
	applied map[uint32]time.Time
}

func (g *gatedWriter) Apply(idx uint32, ep policy.Endpoint) error {
	g.mu.Lock()
	gate := g.hold[idx]
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	err := g.PolicyWriter.Apply(idx, ep)
	g.mu.Lock()
	g.applied[idx] = time.Now()
	g.mu.Unlock()
	return err
}

func (g *gatedWriter) appliedAt(idx uint32) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.applied[idx]
	return t, ok
}

func k8sPod(name string, labels map[string]string, ips ...net.IP) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels}}
	p.Status.Phase = corev1.PodRunning
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0].String()
	}
	return p
}

// serverIngressFrom: pods app=server accept TCP 8080 from pods app=<from> only.
func serverIngressFrom(from ...string) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(8080)
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "server-ingress"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: from}}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		}}
}

// addPod is a runtime's ADD with the pod's name in CNI_ARGS (as the kubelet
// passes it), so the record names the pod.
func addPod(t *testing.T, h *hpEnv, pod ns.NetNS, id, name string) *current.Result {
	t.Helper()
	h.CleanupDel(pod, id)
	rc := &libcni.RuntimeConf{ContainerID: id, NetNS: pod.Path(), IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "ns"}, {"K8S_POD_NAME", name}}}
	var res *current.Result
	err := h.InNode(func() error {
		r, err := h.CNI.AddNetworkList(context.Background(), h.ConfList("1.1.0"), rc)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(r)
		return err
	})
	if err != nil {
		t.Fatalf("ADD %s: %v", id, err)
	}
	return res
}

// TestAgentPolicyNewPodAndChange: a pod started after the policy selecting
// it exists is unreachable, even from the peers the policy allows, until
// the controller has programmed it (held back here for a second while a
// denied peer keeps trying); then the allowed peer reaches it and the
// denied one never does; a change of the policy is enforced (its latency
// from the API write to the first connection is logged). IPv4 and IPv6.
func TestAgentPolicyNewPodAndChange(t *testing.T) {
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	client, other, server := h.NewPod(), h.NewPod(), h.NewPod()
	c4, c6 := resultIPs(addPod(t, h, client, "client", "client"))
	o4, o6 := resultIPs(addPod(t, h, other, "other", "other"))

	cs := fake.NewSimpleClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"kubernetes.io/metadata.name": "ns"}}},
		k8sPod("client", map[string]string{"app": "client"}, c4, c6),
		k8sPod("other", map[string]string{"app": "other"}, o4, o6),
		k8sPod("server", map[string]string{"app": "server"}), // scheduled, no address yet
		k8sPod("server2", map[string]string{"app": "server"}),
		serverIngressFrom("client"))
	m := h.Maps()
	gw := &gatedWriter{PolicyWriter: m.Policy().Writer(), hold: map[uint32]chan struct{}{}, applied: map[uint32]time.Time{}}
	nodeNS, err := netns.GetFromPath(h.Node.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer nodeNS.Close()
	nh, err := netlink.NewHandleAt(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	ctx := context.Background()
	statusDir := t.TempDir()
	// start runs a controller (an agent) until the returned stop; its lists
	// complete once listed is closed.
	start := func(w policy.Writer, listed chan struct{}) (stop func()) {
		c := netpol.New(netpol.Config{StateDir: h.StateDir, StatusDir: statusDir, Writer: w,
			Logf: log.New(os.Stderr, "agent: ", log.Lmicroseconds).Printf, Resync: time.Hour,
			ListWatch: fakeListWatch(cs, listed),
			LinkName: func(idx int) (string, bool) {
				l, err := nh.LinkByIndex(idx)
				if err != nil {
					return "", false
				}
				return l.Attrs().Name, true
			}})
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := c.Run(cctx); err != nil {
				t.Error(err)
			}
		}()
		return func() { cancel(); <-done }
	}
	listed := make(chan struct{})
	close(listed)
	stop1 := start(gw, listed)
	stopped := false
	defer func() {
		if !stopped {
			stop1()
		}
	}()

	_, cIdx := h.HostVeth("client")
	waitUntil(t, "client and other programmed (open)", func() bool {
		_, a := gw.appliedAt(uint32(cIdx))
		st, ok, _ := m.Policy().StateOf(cIdx)
		return a && ok && st.Mode[0] == maps.PolicyOpen
	})

	// The server's ADD: its ifindex is known only once the veth exists,
	// so hold every new interface's first Apply by holding the writer on
	// the next ifindex the node hands out (host-local hands out the next
	// addresses; the veth pair takes the next ifindexes).
	gate := make(chan struct{})
	_, oIdx := h.HostVeth("other")
	for i := oIdx + 1; i < oIdx+16; i++ {
		gw.hold[uint32(i)] = gate
	}
	s4, s6 := resultIPs(addPod(t, h, server, "server", "server"))
	_, sIdx := h.HostVeth("server")
	if gw.hold[uint32(sIdx)] == nil {
		t.Fatalf("server's host veth has ifindex %d, outside the held range", sIdx)
	}
	serve(t, server, 8080, "server")
	serve(t, server, 9090, "server")
	if st, ok, _ := m.Policy().StateOf(sIdx); !ok || st.Mode[0] != maps.PolicyPending || st.Mode[1] != maps.PolicyPending {
		t.Fatalf("server's policy state after ADD: %+v (ok %v), want pending both ways", st, ok)
	}

	// A denied peer keeps trying from ADD's return until after the apply.
	stopProbe := make(chan struct{})
	var leaked atomic.Int32
	var probes atomic.Int32
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		for {
			select {
			case <-stopProbe:
				return
			default:
			}
			for _, ip := range []net.IP{s4, s6} {
				other.Do(func(ns.NetNS) error {
					if conn, err := net.DialTimeout("tcp", hp(ip, 8080), 100*time.Millisecond); err == nil {
						conn.Close()
						leaked.Add(1)
					}
					probes.Add(1)
					return nil
				})
			}
		}
	}()
	t.Run("pending-until-programmed", func(t *testing.T) {
		for _, ip := range []net.IP{s4, s6} {
			blocked(t, client, "tcp", ip, 8080) // allowed by the policy, but not programmed yet
			reach(t, h.Node, "tcp", ip, 8080, "server")
		}
	})
	close(gate)
	waitUntil(t, "server programmed", func() bool { _, ok := gw.appliedAt(uint32(sIdx)); return ok })
	t.Run("programmed", func(t *testing.T) {
		for _, ip := range []net.IP{s4, s6} {
			reach(t, client, "tcp", ip, 8080, "server")
			blocked(t, client, "tcp", ip, 9090)
			blocked(t, other, "tcp", ip, 8080)
		}
	})
	close(stopProbe)
	<-probeDone
	if n := leaked.Load(); n > 0 {
		t.Errorf("the denied peer connected %d times (of %d tries) between ADD and after the apply", n, probes.Load())
	}
	t.Logf("denied peer: %d connection attempts from ADD's return to after the apply, none connected", probes.Load())

	t.Run("dump-policy", func(t *testing.T) {
		out, err := h.AgentCmd("dump", "policy", "-o", "json", "--pin-dir", h.PinDir, "--state-dir", h.StateDir, "--policy-status-dir", statusDir)
		if err != nil {
			t.Fatalf("dump policy: %v\n%s", err, out)
		}
		var rows []inspect.PolicyRow
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("dump policy: %v\n%s", err, out)
		}
		var srv *inspect.PolicyRow
		for i := range rows {
			if rows[i].Ifindex == uint32(sIdx) {
				srv = &rows[i]
			}
		}
		if srv == nil || srv.Pod != "ns/server" || srv.IngressMode != "isolated" || srv.EgressMode != "open" ||
			!slices.Equal(srv.Policies, []string{"ns/server-ingress"}) || srv.Ingress == nil || len(srv.Ingress.Allows) != 2 ||
			srv.Dropped["ingress"] == 0 {
			t.Fatalf("dump policy: server's row %+v, want ns/server isolated ingress from the client's two addresses on tcp/8080, open egress, ns/server-ingress, ingress drops\n%s", srv, out)
		}
		for _, a := range srv.Ingress.Allows {
			if a.Prefix != host(c4) && a.Prefix != host(c6) || len(a.Ports) != 1 || a.Ports[0] != (policy.PortRange{Proto: policy.ProtoTCP, First: 8080, Last: 8080}) {
				t.Errorf("server's ingress entry %+v, want a client address on tcp/8080", a)
			}
		}
		table, err := h.AgentCmd("dump", "policy", "--pin-dir", h.PinDir, "--state-dir", h.StateDir, "--policy-status-dir", statusDir)
		if err != nil || !strings.Contains(table, "ns/server-ingress") || !strings.Contains(table, host(c4).String()+" tcp/8080") {
			t.Errorf("dump policy table: %v\n%s", err, table)
		}
		t.Logf("dump policy:\n%s", table)
	})

	t.Run("policy-change", func(t *testing.T) {
		began := time.Now()
		if _, err := cs.NetworkingV1().NetworkPolicies("ns").Update(ctx, serverIngressFrom("other"), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		var first time.Duration
		waitUntil(t, "other reaches the server after the change", func() bool {
			ok := other.Do(func(ns.NetNS) error {
				conn, err := net.DialTimeout("tcp", hp(s4, 8080), 50*time.Millisecond)
				if err != nil {
					return err
				}
				return conn.Close()
			}) == nil
			if ok {
				first = time.Since(began)
			}
			return ok
		})
		t.Logf("policy update to the first allowed connection: %s", first)
		for _, ip := range []net.IP{s4, s6} {
			reach(t, other, "tcp", ip, 8080, "server")
			blocked(t, client, "tcp", ip, 8080)
		}
	})

	// Not held back: how long a new pod waits, closed, for the controller
	// (its record's write wakes it, not the resync: an hour here).
	t.Run("new-pod-unheld", func(t *testing.T) {
		server2 := h.NewPod()
		v4, v6 := resultIPs(addPod(t, h, server2, "server2", "server2"))
		added := time.Now()
		_, idx := h.HostVeth("server2")
		waitUntil(t, "server2 programmed", func() bool { _, ok := gw.appliedAt(uint32(idx)); return ok })
		at, _ := gw.appliedAt(uint32(idx))
		t.Logf("new pod's policy written %s after ADD returned to the runtime (negative: before)", at.Sub(added))
		serve(t, server2, 8080, "server2")
		for _, ip := range []net.IP{v4, v6} {
			reach(t, other, "tcp", ip, 8080, "server2")
			blocked(t, client, "tcp", ip, 8080)
		}
	})

	t.Run("restart", func(t *testing.T) {
		stopped = true
		testRestart(t, stop1, start, m, cs, client, other, []net.IP{s4, s6}, sIdx)
	})
}

// restart is an agent killed and started again, with the policy changed
// while none ran (the client allowed too): the maps keep enforcing what was
// programmed while no agent runs and while the new one lists (the client
// still refused), then the new state (the client allowed), written beside
// the old one before the switch: the peer allowed throughout (other) never
// fails a connection, before, during or after the new agent's writes.
func testRestart(t *testing.T, stopOld func(), start func(policy.Writer, chan struct{}) func(), m *maps.Maps,
	cs *fake.Clientset, client, other ns.NetNS, servers []net.IP, sIdx int) {
	stopOld()
	if _, err := cs.NetworkingV1().NetworkPolicies("ns").Update(context.Background(), serverIngressFrom("other", "client"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	dial := func(from ns.NetNS, ip net.IP) bool {
		return from.Do(func(ns.NetNS) error {
			conn, err := net.DialTimeout("tcp", hp(ip, 8080), 300*time.Millisecond)
			if err != nil {
				return err
			}
			return conn.Close()
		}) == nil
	}
	var okOther, failOther, leakClient atomic.Int32
	stopProbe, probeDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(probeDone)
		for {
			select {
			case <-stopProbe:
				return
			default:
			}
			for _, ip := range servers {
				if dial(other, ip) {
					okOther.Add(1)
				} else {
					failOther.Add(1)
				}
			}
		}
	}()
	listed := make(chan struct{})
	w := &gatedWriter{PolicyWriter: m.Policy().Writer(), hold: map[uint32]chan struct{}{}, applied: map[uint32]time.Time{}}
	stopNew := start(w, listed)
	defer stopNew()
	time.Sleep(time.Second) // no agent, then an agent that has not listed
	for _, ip := range servers {
		if dial(client, ip) {
			leakClient.Add(1)
		}
	}
	if leakClient.Load() > 0 {
		t.Errorf("the client connected %d times before the new agent had listed: the old state must hold", leakClient.Load())
	}
	close(listed)
	waitUntil(t, "the new agent programmed the server", func() bool { _, ok := w.appliedAt(uint32(sIdx)); return ok })
	time.Sleep(500 * time.Millisecond) // and past the old sets' retirement
	close(stopProbe)
	<-probeDone
	if failOther.Load() > 0 || okOther.Load() == 0 {
		t.Errorf("across the restart the allowed peer connected %d times and failed %d times; want no failure", okOther.Load(), failOther.Load())
	}
	t.Logf("across the restart the allowed peer connected %d times, failed none", okOther.Load())
	for _, ip := range servers {
		reach(t, client, "tcp", ip, 8080, "server")
		reach(t, other, "tcp", ip, 8080, "server")
	}
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fakeListWatch serves the controller's informers from a fake clientset;
// the lists complete once listed is closed.
func fakeListWatch(cs *fake.Clientset, listed chan struct{}) func(string) (cache.ListerWatcher, error) {
	ctx := context.Background()
	return func(resource string) (cache.ListerWatcher, error) {
		return &cache.ListWatch{
			ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
				<-listed
				switch resource {
				case "pods":
					return cs.CoreV1().Pods("").List(ctx, o)
				case "namespaces":
					return cs.CoreV1().Namespaces().List(ctx, o)
				}
				return cs.NetworkingV1().NetworkPolicies("").List(ctx, o)
			},
			WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
				switch resource {
				case "pods":
					return cs.CoreV1().Pods("").Watch(ctx, o)
				case "namespaces":
					return cs.CoreV1().Namespaces().Watch(ctx, o)
				}
				return cs.NetworkingV1().NetworkPolicies("").Watch(ctx, o)
			},
		}, nil
	}
}
