package netpol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// fakeWriter records what the controller programs.
type fakeWriter struct {
	mu      sync.Mutex
	eps     map[uint32]policy.Endpoint
	applies int
	removed []uint32
	changed chan struct{}
	fail    int // the next fail Applies fail
}

func newFakeWriter() *fakeWriter {
	return &fakeWriter{eps: map[uint32]policy.Endpoint{}, changed: make(chan struct{}, 1000)}
}

func (w *fakeWriter) Apply(idx uint32, ep policy.Endpoint) error {
	w.mu.Lock()
	if w.fail > 0 {
		w.fail--
		w.mu.Unlock()
		return errors.New("map cni_pol_addrs is full")
	}
	w.eps[idx] = ep
	w.applies++
	w.mu.Unlock()
	w.changed <- struct{}{}
	return nil
}

func (w *fakeWriter) Remove(idx uint32) error {
	w.mu.Lock()
	delete(w.eps, idx)
	w.removed = append(w.removed, idx)
	w.mu.Unlock()
	w.changed <- struct{}{}
	return nil
}

func (w *fakeWriter) get(idx uint32) (policy.Endpoint, bool, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ep, ok := w.eps[idx]
	return ep, ok, w.applies
}

// lab is a controller on a fake clientset, a temp state dir and made-up links.
type lab struct {
	t     *testing.T
	cs    *fake.Clientset
	w     *fakeWriter
	dir   string
	mu    sync.Mutex
	links map[int]string
	c     *Controller
	hold  chan struct{} // closed: the lists may complete
	// stuck: how many of a resource's next watches hang, and how
	// (stuckSilent, stuckUnanswered).
	stuck map[string][]stuckHow
}

type stuckHow int

const (
	// stuckSilent: the watch is answered, then nothing ever arrives on it
	// (a stream that stopped, its connection busy with other streams).
	stuckSilent stuckHow = iota
	// stuckUnanswered: the request gets no answer (the server holds it).
	stuckUnanswered
)

// silentWatch is answered and then delivers nothing until stopped.
type silentWatch struct {
	ch   chan watch.Event
	once sync.Once
}

func (w *silentWatch) Stop()                          { w.once.Do(func() { close(w.ch) }) }
func (w *silentWatch) ResultChan() <-chan watch.Event { return w.ch }

func newLab(t *testing.T, objs ...runtime.Object) *lab { return newLabWith(t, nil, objs...) }

// newLabWith lets the test change the controller's Config before it runs.
func newLabWith(t *testing.T, tweak func(*Config), objs ...runtime.Object) *lab {
	l := &lab{t: t, cs: fake.NewSimpleClientset(objs...), w: newFakeWriter(), dir: t.TempDir(), links: map[int]string{}, hold: make(chan struct{}),
		stuck: map[string][]stuckHow{}}
	ctx := context.Background()
	lw := func(resource string) (cache.ListerWatcher, error) {
		list := func(o metav1.ListOptions) (runtime.Object, error) {
			<-l.hold
			switch resource {
			case "pods":
				return l.cs.CoreV1().Pods("").List(ctx, o)
			case "namespaces":
				return l.cs.CoreV1().Namespaces().List(ctx, o)
			}
			return l.cs.NetworkingV1().NetworkPolicies("").List(ctx, o)
		}
		w := func(wctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			l.mu.Lock()
			var how []stuckHow
			if hs := l.stuck[resource]; len(hs) > 0 {
				how, l.stuck[resource] = hs[:1], hs[1:]
			}
			l.mu.Unlock()
			if len(how) > 0 {
				if how[0] == stuckUnanswered {
					<-wctx.Done()
					return nil, wctx.Err()
				}
				return &silentWatch{ch: make(chan watch.Event)}, nil
			}
			switch resource {
			case "pods":
				return l.cs.CoreV1().Pods("").Watch(ctx, o)
			case "namespaces":
				return l.cs.CoreV1().Namespaces().Watch(ctx, o)
			}
			return l.cs.NetworkingV1().NetworkPolicies("").Watch(ctx, o)
		}
		return &cache.ListWatch{ListFunc: list, WatchFuncWithContext: w}, nil
	}
	lg := log.New(io.Discard, "", 0)
	if testing.Verbose() {
		lg = log.New(os.Stderr, "agent: ", log.Lmicroseconds)
	}
	cfg := Config{StateDir: filepath.Join(l.dir, "state"), StatusDir: filepath.Join(l.dir, "status"), Writer: l.w,
		Logf: lg.Printf, Resync: time.Hour, ListWatch: lw, LinkName: l.linkName}
	if tweak != nil {
		tweak(&cfg)
	}
	l.c = New(cfg)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := l.c.Run(runCtx); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return l
}

func (l *lab) linkName(idx int) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.links[idx]
	return n, ok
}

// attach is what ADD leaves: a host veth and the complete record.
func (l *lab) attach(idx int, ns, name string) {
	l.t.Helper()
	host := fmt.Sprintf("ebpf%011x", idx)
	l.mu.Lock()
	l.links[idx] = host
	l.mu.Unlock()
	st := state.Store{Root: filepath.Join(l.dir, "state"), Network: "net"}
	if err := st.Write(&state.Record{ContainerID: fmt.Sprintf("c%d", idx), IfName: "eth0", HostIf: host, HostIfindex: idx,
		PodNamespace: ns, PodName: name, Policy: true}); err != nil {
		l.t.Fatal(err)
	}
}

func (l *lab) detach(idx int) {
	l.mu.Lock()
	delete(l.links, idx)
	l.mu.Unlock()
	st := state.Store{Root: filepath.Join(l.dir, "state"), Network: "net"}
	if err := st.Remove(fmt.Sprintf("c%d", idx), "eth0"); err != nil {
		l.t.Fatal(err)
	}
	l.c.LinkEvent(linkGone(idx))
}

// waitFor polls the writer until ok holds.
func (l *lab) waitFor(what string, ok func() bool) {
	l.t.Helper()
	deadline := time.After(10 * time.Second)
	for !ok() {
		select {
		case <-l.w.changed:
		case <-time.After(5 * time.Millisecond):
		case <-deadline:
			l.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func pod(ns, name, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}}
}

func namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/metadata.name": name}}}
}

// denyAllIngress selects app=server; allowFrom adds ingress from app=client on TCP 80.
func serverPolicy(name string, allowClient bool) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		}}
	if allowClient {
		tcp := corev1.ProtocolTCP
		port := intstrPort(80)
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
		}}
	}
	return np
}

// TestControllerClosedUntilSynced: nothing is programmed before every
// informer has listed (a new interface stays closed), then every local
// attachment is, with its compiled policy.
func TestControllerClosedUntilSynced(t *testing.T) {
	l := newLab(t, namespace("ns"), pod("ns", "server", "10.0.0.2", map[string]string{"app": "server"}),
		pod("ns", "client", "10.0.0.3", map[string]string{"app": "client"}), serverPolicy("p", true))
	l.attach(7, "ns", "server")
	l.attach(8, "ns", "client")
	time.Sleep(200 * time.Millisecond)
	if _, _, n := l.w.get(7); n != 0 {
		t.Fatalf("%d interfaces programmed before the informers listed", n)
	}
	close(l.hold)
	l.waitFor("both interfaces programmed", func() bool {
		_, a, _ := l.w.get(7)
		_, b, _ := l.w.get(8)
		return a && b
	})
	srv, _, _ := l.w.get(7)
	want := policy.Endpoint{Policies: []string{"ns/p"}, Ingress: policy.Rules{Isolated: true, Allows: []policy.Allow{
		{Prefix: netip.MustParsePrefix("10.0.0.3/32"), Ports: []policy.PortRange{{Proto: policy.ProtoTCP, First: 80, Last: 80}}}}}}
	if !endpointEqual(srv, want) {
		t.Errorf("server: got %+v, want %+v", srv, want)
	}
	if cl, _, _ := l.w.get(8); cl.Ingress.Isolated || cl.Egress.Isolated {
		t.Errorf("client: isolated %+v; no policy selects it", cl)
	}
	l.waitFor("two status files", func() bool {
		sts, err := ReadStatus(filepath.Join(l.dir, "status"))
		return err == nil && len(sts) == 2
	})
}

// TestControllerNewPodAndChanges: a pod attached after the sync is
// programmed at its record's write (not at a resync: the resync is an
// hour here); a policy change rewrites only the interfaces it changes; an
// interface gone is removed.
func TestControllerNewPodAndChanges(t *testing.T) {
	l := newLab(t, namespace("ns"), pod("ns", "server", "10.0.0.2", map[string]string{"app": "server"}),
		pod("ns", "other", "10.0.0.4", map[string]string{"app": "other"}), serverPolicy("p", false))
	close(l.hold)
	l.attach(9, "ns", "other")
	l.waitFor("other programmed", func() bool { _, ok, _ := l.w.get(9); return ok })

	start := time.Now()
	l.attach(7, "ns", "server")
	l.waitFor("the new server programmed", func() bool { _, ok, _ := l.w.get(7); return ok })
	t.Logf("record written to programmed: %s", time.Since(start))
	if ep, _, _ := l.w.get(7); !ep.Ingress.Isolated || len(ep.Ingress.Allows) != 0 {
		t.Fatalf("server: %+v, want ingress isolated with nothing allowed", ep)
	}

	_, _, before := l.w.get(7)
	ctx := context.Background()
	l.cs.CoreV1().Pods("ns").Create(ctx, pod("ns", "client", "10.0.0.3", map[string]string{"app": "client"}), metav1.CreateOptions{})
	if _, err := l.cs.NetworkingV1().NetworkPolicies("ns").Update(ctx, serverPolicy("p", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	l.waitFor("the server's ingress allows the client", func() bool {
		ep, _, _ := l.w.get(7)
		return len(ep.Ingress.Allows) == 1
	})
	time.Sleep(100 * time.Millisecond)
	if _, _, after := l.w.get(7); after-before > 2 {
		// One write per change that reached the server's policy (the pod's
		// creation may or may not be seen apart from the policy's update).
		t.Errorf("%d writes for one policy change; the other interface must not be rewritten", after-before)
	}

	l.detach(7)
	l.waitFor("the server's interface removed", func() bool {
		l.w.mu.Lock()
		defer l.w.mu.Unlock()
		return slices.Contains(l.w.removed, 7)
	})
	if slices.Contains(l.w.removed, 9) {
		t.Error("removed an interface that is still there")
	}
}

// TestControllerLatency measures policy change (the fake API's write) to
// the writer's Apply, over 200 changes: the controller's own share of the
// change-to-enforcement latency (no API server, no map write).
func TestControllerLatency(t *testing.T) {
	objs := []runtime.Object{namespace("ns"), serverPolicy("p", false)}
	for i := range 100 {
		objs = append(objs, pod("ns", fmt.Sprintf("server%d", i), fmt.Sprintf("10.0.1.%d", i), map[string]string{"app": "server"}))
	}
	l := newLab(t, objs...)
	close(l.hold)
	for i := range 100 {
		l.attach(100+i, "ns", fmt.Sprintf("server%d", i))
	}
	l.waitFor("100 pods programmed", func() bool {
		l.w.mu.Lock()
		defer l.w.mu.Unlock()
		return len(l.w.eps) == 100
	})
	ctx := context.Background()
	var lat []time.Duration
	for i := range 200 {
		np := serverPolicy("p", false)
		tcp := corev1.ProtocolTCP
		port := intstrPort(int32(1000 + i))
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}}}
		start := time.Now()
		if _, err := l.cs.NetworkingV1().NetworkPolicies("ns").Update(ctx, np, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		l.waitFor("the change on the last pod", func() bool {
			ep, _, _ := l.w.get(199)
			return len(ep.Ingress.Allows) > 0 && len(ep.Ingress.Allows[0].Ports) == 1 && ep.Ingress.Allows[0].Ports[0].First == uint16(1000+i)
		})
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("policy update to the 100th pod's Apply, 200 changes: p50 %s, p99 %s", lat[len(lat)/2], lat[len(lat)*99/100])
}

func endpointEqual(a, b policy.Endpoint) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}

func intstrPort(p int32) intstr.IntOrString { return intstr.FromInt32(p) }

func linkGone(idx int) netlink.LinkUpdate {
	u := netlink.LinkUpdate{Link: &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: idx, Name: fmt.Sprintf("ebpf%011x", idx)}}}
	u.Header.Type = unix.RTM_DELLINK
	return u
}

// TestControllerRetries: a write that fails (a full map) leaves the
// interface as it was and is retried (every second, or at the next
// change) until it succeeds; the resync is an hour here.
func TestControllerRetries(t *testing.T) {
	l := newLab(t, namespace("ns"), pod("ns", "server", "10.0.0.2", map[string]string{"app": "server"}), serverPolicy("p", false))
	l.w.mu.Lock()
	l.w.fail = 2
	l.w.mu.Unlock()
	close(l.hold)
	l.attach(7, "ns", "server")
	l.waitFor("programmed after two failures", func() bool { _, ok, _ := l.w.get(7); return ok })
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	if l.w.fail != 0 {
		t.Errorf("%d failures left", l.w.fail)
	}
}

// TestControllerStuckWatch: a watch that stops delivering (answered, then
// silent), or whose request is never answered, is given up after
// WatchIdle and made again, so a policy created meanwhile is programmed.
// Before kubewatch bounded the watches, the informer waited on such a
// watch until the server's timeout (5 to 10 minutes; here, forever) and no
// policy was programmed: the k8s -netpol run's "expected blocked, was
// allowed" with both agents silent for minutes.
func TestControllerStuckWatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		how  []stuckHow
	}{
		{"silent", []stuckHow{stuckSilent, stuckSilent}},
		{"unanswered", []stuckHow{stuckUnanswered}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var said []string
			l := newLabWith(t, func(c *Config) {
				c.WatchIdle = 300 * time.Millisecond
				logf := c.Logf
				c.Logf = func(f string, a ...any) {
					mu.Lock()
					said = append(said, fmt.Sprintf(f, a...))
					mu.Unlock()
					logf(f, a...)
				}
			}, namespace("ns"), pod("ns", "server", "10.0.0.2", map[string]string{"app": "server"}))
			l.mu.Lock()
			l.stuck["networkpolicies"] = tc.how
			l.mu.Unlock()
			l.attach(7, "ns", "server")
			close(l.hold)
			l.waitFor("the server programmed open", func() bool { _, ok, _ := l.w.get(7); return ok })
			if _, err := l.cs.NetworkingV1().NetworkPolicies("ns").Create(context.Background(), serverPolicy("p", false), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			l.waitFor("the server isolated by the policy created during the stuck watch", func() bool {
				ep, _, _ := l.w.get(7)
				return ep.Ingress.Isolated
			})
			t.Logf("policy created to programmed: %s", time.Since(start).Round(time.Millisecond))
			mu.Lock()
			defer mu.Unlock()
			if !slices.ContainsFunc(said, func(s string) bool { return strings.Contains(s, "watch networkpolicies: no") }) {
				t.Errorf("the stuck watch was not logged; said %q", said)
			}
		})
	}
}
