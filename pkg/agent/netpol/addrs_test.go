package netpol

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy/compile"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// attachAt is attach with the record's addresses and ADD time.
func (l *lab) attachAt(idx int, ns, name string, created time.Time, ips ...string) {
	l.t.Helper()
	host := fmt.Sprintf("ebpf%011x", idx)
	l.mu.Lock()
	l.links[idx] = host
	l.mu.Unlock()
	st := state.Store{Root: filepath.Join(l.dir, "state"), Network: "net"}
	if err := st.Write(&state.Record{ContainerID: fmt.Sprintf("c%d", idx), IfName: "eth0", HostIf: host, HostIfindex: idx,
		PodNamespace: ns, PodName: name, Policy: true, IPs: ips, Created: created}); err != nil {
		l.t.Fatal(err)
	}
}

func onNode(p *corev1.Pod, node string) *corev1.Pod { p.Spec.NodeName = node; return p }

// allowed are the prefixes an endpoint's ingress allows.
func allowed(ep policy.Endpoint) []string {
	var out []string
	for _, a := range ep.Ingress.Allows {
		out = append(out, a.Prefix.String())
	}
	slices.Sort(out)
	return out
}

// TestControllerRecordsDecideAddresses: whose an address is, as server's
// ingress (from app=client) shows it. The API says client (this node)
// has 10.0.0.3, far (another node) 10.0.0.5, old and newer (this node's
// pods without nodeName in their objects, as the integration lab's)
// nothing. Then the node's records speak.
func TestControllerRecordsDecideAddresses(t *testing.T) {
	client := map[string]string{"app": "client"}
	l := newLabWith(t, func(c *Config) { c.NodeName = "node-a" }, namespace("ns"), serverPolicy("p", true),
		onNode(pod("ns", "server", "10.0.0.2", map[string]string{"app": "server"}), "node-a"),
		onNode(pod("ns", "client", "10.0.0.3", client), "node-a"),
		onNode(pod("ns", "far", "10.0.0.5", client), "node-b"),
		pod("ns", "old", "", client), pod("ns", "newer", "", map[string]string{"app": "other"}))
	t0 := time.Now().UTC()
	l.attachAt(7, "ns", "server", t0, "10.0.0.2")
	close(l.hold)
	want := func(what string, prefixes ...string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			ep, ok, _ := l.w.get(7)
			if ok && slices.Equal(allowed(ep), prefixes) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: server's ingress allows %v, want %v", what, allowed(ep), prefixes)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// client is of this node without a record (torn down, or another
	// CNI's): its API address counts until a record gives it away.
	want("client's and far's addresses", "10.0.0.3/32", "10.0.0.5/32")
	// A record of this node gives far's address to newer: never far's.
	l.attachAt(9, "ns", "newer", t0.Add(time.Second), "10.0.0.5")
	want("far's address is newer's", "10.0.0.3/32")
	// client ADDed again on another address: the record's counts too.
	l.attachAt(8, "ns", "client", t0.Add(2*time.Second), "10.0.0.6")
	want("client's new address beside its API one", "10.0.0.3/32", "10.0.0.6/32")
	// client's old address reused by an ADD of newer: never client's.
	l.attachAt(13, "ns", "newer", t0.Add(2500*time.Millisecond), "10.0.0.3")
	want("client's old address gone to newer", "10.0.0.6/32")
	// Two records give 10.0.0.7 (old's stale one, then newer's): newer's.
	l.attachAt(10, "ns", "old", t0.Add(3*time.Second), "10.0.0.7")
	want("old's address (with client's, one /31)", "10.0.0.6/31")
	l.attachAt(11, "ns", "newer", t0.Add(4*time.Second), "10.0.0.7")
	want("old's address gone to the newer ADD", "10.0.0.6/32")
	// moved runs on node-b (10.0.0.8) while a record of its name lingers
	// here (force-deleted, not yet torn down): its object's address counts.
	l.attachAt(12, "ns", "moved", t0.Add(5*time.Second), "10.0.0.9")
	ctx := context.Background()
	if _, err := l.cs.CoreV1().Pods("ns").Create(ctx, onNode(pod("ns", "moved", "10.0.0.8", client), "node-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("moved's address on node-b", "10.0.0.6/32", "10.0.0.8/32")
}

// TestRecordAddrs: the newest ADD's pod owns an address; a record of no
// pod takes its address from every pod (written as a prefix here, as
// test/k8s writes them); a provisional record gives none.
func TestRecordAddrs(t *testing.T) {
	t0 := time.Now()
	a := netip.MustParseAddr
	local, owner := recordAddrs([]*state.Record{
		{PodNamespace: "ns", PodName: "a", IPs: []string{"fd00::1", "10.0.0.1"}, Created: t0},
		{PodNamespace: "ns", PodName: "b", IPs: []string{"10.0.0.1"}, Created: t0.Add(time.Second)},
		{IPs: []string{"10.0.0.9/32"}, Created: t0},
		{PodNamespace: "ns", PodName: "c", Provisional: true, Created: t0.Add(2 * time.Second)},
	})
	if got := local[compileKey("ns", "a")]; !slices.Equal(got, []netip.Addr{a("fd00::1")}) {
		t.Errorf("a: %v, want fd00::1 only (10.0.0.1 went to the newer ADD)", got)
	}
	if got := local[compileKey("ns", "b")]; !slices.Equal(got, []netip.Addr{a("10.0.0.1")}) {
		t.Errorf("b: %v", got)
	}
	if _, ok := local[compileKey("ns", "c")]; ok {
		t.Error("a provisional record gave c addresses")
	}
	if o, ok := owner[a("10.0.0.9")]; !ok || o.Name != "" {
		t.Errorf("10.0.0.9: owner %v %v, want the record of no pod", o, ok)
	}
}

func compileKey(ns, name string) compile.PodKey { return compile.PodKey{Namespace: ns, Name: name} }
