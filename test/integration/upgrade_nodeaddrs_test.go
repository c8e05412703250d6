package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// fakeNodesAPI serves the Nodes to an agent of e's node: GET /api/v1/nodes
// answers after delay (an API server slow to answer, as on a loaded
// control plane), a watch stays open with nothing. The listener is in the
// node's network namespace, where the agent runs. It returns a kubeconfig.
func fakeNodesAPI(t *testing.T, e *testenv.Env, nodes []corev1.Node, delay time.Duration) string {
	t.Helper()
	var ln net.Listener
	must(t, e.InNode(func() error {
		var err error
		ln, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	}))
	list, err := json.Marshal(corev1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: nodes})
	must(t, err)
	done := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/nodes" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-done:
			}
			return
		}
		select {
		case <-time.After(delay):
		case <-done:
			return
		}
		w.Write(list)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { close(done); srv.Close() })
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	must(t, os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "http://%s"}}]
users: [{name: agent, user: {}}]
contexts: [{name: fake, context: {cluster: fake, user: agent}}]
current-context: fake
`, ln.Addr())), 0o600))
	return kc
}

func labNode(name string, ips []net.IP, cidrs ...string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"}, Spec: corev1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs}}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	return n
}

// TestUpgradeNodeAddressesBeforeSwap: another node (its own address, as
// kube-proxy SNATs a NodePort client whose endpoint is here) talks UDP to
// a pod of a node running 41b58f6 (map layout 2, no node addresses among
// its cluster CIDRs), and this build takes the node over. Its programs
// masquerade a pod's UDP to anything outside the cluster CIDRs, replies
// included: the node addresses must be in before the first link runs them.
// Before, the swap came first and every reply until the agent's first
// Node list was masqueraded and lost (the k8s rollout's NodePort UDP loss,
// issue 27). Three ways in, IPv4 and IPv6, not one datagram lost:
//
//   - agent: this build's agent follows Nodes from an API server that takes
//     1.5 s to answer (no route to the other node's pods here: the Node list
//     alone must do it);
//   - agent, API server silent: it never answers; the agent gives its list
//     10 s and migrates, the node addresses taken from the gateways of the
//     old agent's routes to the other node's pods (proto 199);
//   - plugin first: this build's first ADD migrates the node before any
//     agent of it runs, the addresses from those routes too.
func TestUpgradeNodeAddressesBeforeSwap(t *testing.T) {
	for _, mode := range []string{"agent", "agent, API server silent", "plugin first"} {
		t.Run(mode, func(t *testing.T) { upgradeNodeAddresses(t, mode) })
	}
}

func upgradeNodeAddresses(t *testing.T, mode string) {
	oldBin := testenv.BuildAt(t, testenv.PreIssue28Commit)
	lab := newMasqLab(t)
	e := lab.a
	newCNI := e.CNI
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, e.CacheDir, nil)
	p := e.NewPod()
	e.CleanupDel(p, "p")
	rp := e.Add(p, "p")
	p4, p6 := testenv.PodIPs(t, rp)
	echoUDP(t, p, 80)
	route := func(n *testenv.Env, proto netlink.RouteProtocol, dst string, via net.IP) {
		t.Helper()
		must(t, n.InNode(func() error {
			l, err := netlink.LinkByName("uplink0")
			if err != nil {
				return err
			}
			_, d, _ := net.ParseCIDR(dst)
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: d, Gw: via, Protocol: proto}); err != nil {
				return fmt.Errorf("route %s via %s: %w", dst, via, err)
			}
			return nil
		}))
	}
	// Node b routes node a's pod CIDRs via node a, as host-gw does; node a
	// has the old agent's routes to node b's (but for the Node list's case).
	route(lab.b, 0, labPodsA, labNodeA)
	route(lab.b, 0, labPodsA6, labNodeA6)
	if mode != "agent" {
		route(e, datapath.PeerRouteProtocol, labPodsB, labNodeB)
		route(e, datapath.PeerRouteProtocol, labPodsB6, labNodeB6)
	}
	const every = 5 * time.Millisecond
	probes := []*seqProbe{
		startProbe(t, "node b to a pod of node a, IPv4", lab.b.Node, hp(p4, 80), every),
		startProbe(t, "node b to a pod of node a, IPv6", lab.b.Node, hp(p6, 80), every),
	}
	for _, pr := range probes {
		pr.waitAnswered(t)
	}

	e.CNI = newCNI
	var ag *testenv.AgentProc
	q := e.NewPod()
	e.CleanupDel(q, "q")
	switch mode {
	case "plugin first":
		e.Add(q, "q")
		time.Sleep(time.Second)
	default:
		delay := 1500 * time.Millisecond
		if mode != "agent" {
			delay = time.Minute
		}
		kc := fakeNodesAPI(t, e, []corev1.Node{
			labNode("a", []net.IP{labNodeA, labNodeA6}, labPodsA, labPodsA6),
			labNode("b", []net.IP{labNodeB, labNodeB6}, labPodsB, labPodsB6),
		}, delay)
		ag = e.StartAgent(e.WriteConfDir(), "--metrics-addr", "", "--node-name", "a", "--kubeconfig", kc)
		if mode == "agent" {
			// The follower's own first list (another 1.5 s).
			for deadline := time.Now().Add(20 * time.Second); !strings.Contains(ag.Logs(), "nodes: 2 nodes"); time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the agent's follower did not list the nodes:\n%s", ag.Logs())
				}
			}
		}
		time.Sleep(time.Second)
	}
	for _, pr := range probes {
		sent, lost, _ := pr.finish()
		if len(lost) > 0 {
			t.Errorf("%s: %d of %d lost across the upgrade (numbers %s)", pr.name, len(lost), sent, span(lost))
		}
	}
	var logs string
	if ag != nil {
		logs = ag.Logs()
		listed, ready := strings.Index(logs, "nodes: listed 2 nodes before the upgrade"), strings.Index(logs, "datapath ready")
		if got := listed >= 0 && listed < ready; got != (mode == "agent") {
			t.Errorf("listed the nodes before the upgrade: %v, want %v:\n%s", got, mode == "agent", logs)
		}
	}
	want := []string{labNodeB.String() + "/32", labNodeB6.String() + "/128"}
	if mode == "agent" {
		want = append(want, labNodeA.String()+"/32", labNodeA6.String()+"/128")
	}
	for _, c := range want {
		if !clusterCIDRSet(t, e.Maps())[c] {
			t.Errorf("node address %s is not a cluster CIDR after the upgrade:\n%s", c, logs)
		}
	}
	if ag != nil {
		ag.Stop()
	}
	// The agent's cluster CIDRs outlive it (the node's, until uninstall).
	_, err := e.Maps().Masq().ReleaseClusterCIDRs(datapath.AgentCIDROwner)
	must(t, err)
	if mode == "plugin first" {
		e.MustDel(q, "q")
	}
	e.MustDel(p, "p")
	e.AssertClean()
}
