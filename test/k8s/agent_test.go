package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	cnistate "github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// needRoot: these tests run the real API server and agent in namespaces of
// their own; without root they skip, or fail under CI=1 (as test/testenv).
func needRoot(t *testing.T) {
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("needs root (network and mount namespaces, BPF); CI must run it as root")
	}
	t.Skip("needs root (network and mount namespaces, BPF)")
}

// agentLab is a cluster of etcd and kube-apiserver only, and the real
// ebpf-agent following the Node objects in node1's namespaces (its own
// network, mount and bpffs) with the RBAC of deploy/ebpf-cni.yaml.
type agentLab struct {
	t        *testing.T
	c        *cluster
	node     *node // where the agent runs
	agent    *proc
	args     []string
	stateDir string
}

func newAgentLab(t *testing.T, ctx context.Context) *agentLab {
	needRoot(t)
	wd, _ := os.Getwd()
	o := options{cni: "ebpf-cni", cache: envOr("EBPF_CNI_K8S_CACHE", "/var/cache/ebpf-cni-k8s"), out: t.TempDir(),
		dualStack: true, repo: findRepo(wd)}
	a, err := apiServerBins(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := goCmd(ctx, o.repo, []string{"CGO_ENABLED=0"}, "build", "-o", bin+"/", "./cmd/ebpf-agent"); err != nil {
		t.Fatal(err)
	}
	a.bin["ebpf-agent"] = filepath.Join(bin, "ebpf-agent")

	c := newCluster(o, a)
	before, err := snapshot(c)
	if err != nil {
		t.Fatal(err)
	}
	l := &agentLab{t: t, c: c, node: c.nodes[0], stateDir: filepath.Join(c.work, "state")}
	t.Cleanup(func() {
		if t.Failed() && l.agent != nil {
			b, _ := os.ReadFile(filepath.Join(c.logs, l.agent.name+".log"))
			t.Logf("agent log:\n%s", tail(string(b), 60))
		}
		c.down()
		if leaks := compare(before, c); len(leaks) > 0 {
			t.Errorf("left behind: %v", leaks)
		}
	})
	if err := os.MkdirAll(c.work, 0o700); err != nil {
		t.Fatal(err)
	}
	c.recordSysctls()
	if err := c.network(); err != nil {
		t.Fatal(err)
	}
	if err := c.apiServer(ctx); err != nil {
		t.Fatal(err)
	}

	// The manifest's ServiceAccount, ClusterRole and binding; the agent
	// authenticates as that service account (a client certificate with
	// its user name), so it has exactly the manifest's permissions.
	man, err := os.ReadFile(filepath.Join(o.repo, "deploy/ebpf-cni.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rbac, template []string
	for _, doc := range strings.Split(string(man), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding":
			rbac = append(rbac, doc)
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
				t.Fatal(err)
			}
			template = append(template, cm.Data["10-ebpf-cni.conflist"])
		}
	}
	if len(rbac) != 3 || len(template) != 1 || template[0] == "" {
		t.Fatalf("deploy/ebpf-cni.yaml: want a ServiceAccount, ClusterRole, ClusterRoleBinding and the conflist ConfigMap; found %d RBAC documents, %d conflists", len(rbac), len(template))
	}
	if err := c.apply(strings.Join(rbac, "\n---\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.pki.issue("agent", "system:serviceaccount:kube-system:ebpf-cni", nil, nil); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(c.work, "agent.kubeconfig")
	if err := c.pki.kubeconfig(kc, "agent", "https://"+c.cpIP+":6443"); err != nil {
		t.Fatal(err)
	}
	tmpl := filepath.Join(c.work, "10-ebpf-cni.conflist")
	if err := os.WriteFile(tmpl, []byte(template[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	l.args = []string{a.path("ebpf-agent"), "run", "--pin-dir", "/sys/fs/bpf/ebpf-cni", "--state-dir", l.stateDir,
		"--cni-conf-dir", "/etc/cni/net.d", "--cni-bin-dir", "/opt/cni/bin", "--cni-conf-template", tmpl,
		"--node-name", l.node.name, "--kubeconfig", kc, "--hostports=false", "--metrics-addr", "",
		"--reconcile-interval", "2s"}
	return l
}

func (l *agentLab) startAgent(name string) {
	l.t.Helper()
	p, err := l.c.start(name, l.node.holder, true, l.node.name, l.args...)
	if err != nil {
		l.t.Fatal(err)
	}
	l.agent = p
	l.eventually("agent "+name+" ready", 30*time.Second, func() error {
		if !strings.Contains(l.agentLog(), "datapath ready") {
			return fmt.Errorf("no \"datapath ready\" in its log")
		}
		return nil
	})
}

func (l *agentLab) agentLog() string {
	b, _ := os.ReadFile(filepath.Join(l.c.logs, l.agent.name+".log"))
	return string(b)
}

// node writes a Node object (status included: a kubelet registers its
// node with its addresses).
func (l *agentLab) createNode(name string, ips, cidrs []string) {
	l.t.Helper()
	n := corev1.Node{}
	n.APIVersion, n.Kind, n.Name = "v1", "Node", name
	n.Spec.PodCIDRs = cidrs
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
	}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	b, err := json.Marshal(n)
	if err != nil {
		l.t.Fatal(err)
	}
	f := filepath.Join(l.c.work, "node-"+name+".json")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		l.t.Fatal(err)
	}
	if _, err := l.c.kubectl("create", "-f", f); err != nil {
		l.t.Fatal(err)
	}
}

func (l *agentLab) kubectl(args ...string) {
	l.t.Helper()
	if _, err := l.c.kubectl(args...); err != nil {
		l.t.Fatal(err)
	}
}

// routes: the agent's routes in the node ("dst via gw"), sorted.
func (l *agentLab) routes() []string {
	l.t.Helper()
	var out []string
	for _, fam := range []string{"-4", "-6"} {
		s, err := in(l.node.holder, false, "ip", fam, "route", "show", "proto", "199")
		if err != nil {
			l.t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
			if f := strings.Fields(line); len(f) >= 3 {
				out = append(out, strings.Join(f[:3], " "))
			}
		}
	}
	sort.Strings(out)
	return out
}

// ranges: the IPAM subnets of the conflist the agent wrote, "" when it
// wrote none.
func (l *agentLab) ranges() string {
	l.t.Helper()
	s, err := in(l.node.holder, true, "cat", "/etc/cni/net.d/10-ebpf-cni.conflist")
	if err != nil {
		return ""
	}
	var conf struct {
		Plugins []struct {
			IPAM struct {
				Ranges [][]struct{ Subnet string } `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(s), &conf); err != nil || len(conf.Plugins) == 0 {
		l.t.Fatalf("conflist: %v\n%s", err, s)
	}
	var out []string
	for _, set := range conf.Plugins[0].IPAM.Ranges {
		for _, r := range set {
			out = append(out, r.Subnet)
		}
	}
	return strings.Join(out, ",")
}

// clusterCIDRs: cni_cluster_cidrs as `ebpf-agent dump nat` shows it.
func (l *agentLab) clusterCIDRs() string {
	l.t.Helper()
	s, err := in(l.node.holder, true, l.c.a.path("ebpf-agent"), "dump", "nat", "--pin-dir", "/sys/fs/bpf/ebpf-cni", "-o", "json")
	if err != nil {
		l.t.Fatal(err)
	}
	var d struct{ ClusterCIDRs []string }
	if err := json.Unmarshal([]byte(s), &d); err != nil {
		l.t.Fatalf("dump nat: %v\n%s", err, s)
	}
	sort.Strings(d.ClusterCIDRs)
	return strings.Join(d.ClusterCIDRs, ",")
}

func (l *agentLab) eventually(what string, timeout time.Duration, f func() error) {
	l.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("%s: not after %s: %v", what, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// wantRoutes waits until the agent's routes are exactly want.
func (l *agentLab) wantRoutes(what string, want ...string) {
	l.t.Helper()
	sort.Strings(want)
	l.eventually(what, time.Minute, func() error {
		if got := l.routes(); strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Errorf("routes of proto 199 %v, want %v", got, want)
		}
		return nil
	})
}

// steady checks for d that the routes and the conflist stay as they are.
func (l *agentLab) steady(what string, d time.Duration) {
	l.t.Helper()
	routes, ranges := l.routes(), l.ranges()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if got := l.routes(); strings.Join(got, ",") != strings.Join(routes, ",") {
			l.t.Fatalf("%s: routes changed from %v to %v", what, routes, got)
		}
		if got := l.ranges(); got != ranges {
			l.t.Fatalf("%s: conflist ranges changed from %q to %q", what, ranges, got)
		}
	}
}

// TestAgentFollowsNodes drives the real agent binary against the real API
// server: Nodes added, given a pod CIDR, re-registered with another one,
// deleted; this node's own range changing; routes someone deleted; a route
// of another owner; the API server gone (with an agent restart meanwhile)
// and back.
func TestAgentFollowsNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	l := newAgentLab(t, ctx)
	c, n := l.c, l.node
	pfx := fabricPrefix + "."
	self := []string{pfx + "11", fabricPrefix6 + "11"}
	node2 := []string{pfx + "12", fabricPrefix6 + "12"}

	l.createNode("node1", self, []string{"10.244.0.0/24", "fd00:10:244::/64"})
	l.createNode("node2", node2, []string{"10.244.1.0/24", "fd00:10:244:1::/64"})

	// Other owners' routes: one to a pod CIDR a Node will claim (a static
	// route: left alone), and a stale one of the agent's protocol (from an
	// earlier agent: removed, but only once the agent has listed the nodes).
	for _, r := range [][]string{
		{"ip", "route", "add", "10.244.7.0/24", "via", pfx + "12"},
		{"ip", "route", "add", "10.244.66.0/24", "via", pfx + "12", "proto", "199"},
	} {
		if _, err := in(n.holder, false, r...); err != nil {
			t.Fatal(err)
		}
	}

	// The agent starts while the API server is down: it must not act on
	// an empty view.
	c.stopAPIServer()
	l.startAgent("agent")
	l.steady("API server down at the agent's start", 5*time.Second)
	if got := l.routes(); strings.Join(got, ",") != "10.244.66.0/24 via "+pfx+"12" {
		t.Fatalf("routes with the API server down from the start: %v, want the stale one kept", got)
	}
	if got := l.ranges(); got != "" {
		t.Fatalf("conflist written before the first list: ranges %q", got)
	}
	if err := c.startAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	l.wantRoutes("first list: node2's CIDRs routed, the stale route gone",
		"10.244.1.0/24 via "+pfx+"12", "fd00:10:244:1::/64 via "+fabricPrefix6+"12")
	l.eventually("conflist with this node's pod CIDRs", time.Minute, func() error {
		if got := l.ranges(); got != "10.244.0.0/24,fd00:10:244::/64" {
			return fmt.Errorf("ranges %q", got)
		}
		return nil
	})
	// Every node's pod CIDRs and its addresses: a node's own address is
	// the source of what it sends to other nodes' pods (kube-proxy's
	// NodePort SNAT), whose replies must not be masqueraded.
	l.eventually("cluster CIDRs from every node", time.Minute, func() error {
		if got, want := l.clusterCIDRs(), "10.244.0.0/24,10.244.1.0/24,10.255.0.11/32,10.255.0.12/32,fd00:10:244:1::/64,fd00:10:244::/64,fd00:255::11/128,fd00:255::12/128"; got != want {
			return fmt.Errorf("cni_cluster_cidrs %q, want %q", got, want)
		}
		return nil
	})

	// Node added.
	l.createNode("node3", []string{pfx + "13"}, []string{"10.244.2.0/24"})
	l.wantRoutes("node3 added",
		"10.244.1.0/24 via "+pfx+"12", "fd00:10:244:1::/64 via "+fabricPrefix6+"12", "10.244.2.0/24 via "+pfx+"13")

	// A node registered without a pod CIDR gets a route once it has one.
	l.createNode("node4", []string{pfx + "14"}, nil)
	l.steady("node4 without pod CIDR", 2*time.Second)
	l.kubectl("patch", "node", "node4", "-p", `{"spec":{"podCIDR":"10.244.4.0/24","podCIDRs":["10.244.4.0/24"]}}`)
	l.wantRoutes("node4 given a pod CIDR",
		"10.244.1.0/24 via "+pfx+"12", "fd00:10:244:1::/64 via "+fabricPrefix6+"12", "10.244.2.0/24 via "+pfx+"13",
		"10.244.4.0/24 via "+pfx+"14")

	// A pod CIDR changes the only way the API allows: the Node is deleted
	// and registers again with another range.
	l.kubectl("delete", "node", "node2")
	l.createNode("node2", node2, []string{"10.244.5.0/24", "fd00:10:244:5::/64"})
	l.wantRoutes("node2 re-registered with other pod CIDRs",
		"10.244.5.0/24 via "+pfx+"12", "fd00:10:244:5::/64 via "+fabricPrefix6+"12", "10.244.2.0/24 via "+pfx+"13",
		"10.244.4.0/24 via "+pfx+"14")

	// This node's own range changes: the conflist follows, and the agent
	// names the pod left with an address of the old range.
	rec := &cnistate.Record{ContainerID: "c0ffee", IfName: "eth0", IPs: []string{"10.244.0.5/24"},
		PodNamespace: "default", PodName: "old-pod", HostIf: cnistate.HostIfName("c0ffee", "eth0")}
	if err := (cnistate.Store{Root: l.stateDir, Network: "ebpf-cni"}).Write(rec); err != nil {
		t.Fatal(err)
	}
	l.kubectl("delete", "node", "node1")
	l.createNode("node1", self, []string{"10.244.9.0/24", "fd00:10:244:9::/64"})
	l.eventually("conflist with the new pod CIDRs", time.Minute, func() error {
		if got := l.ranges(); got != "10.244.9.0/24,fd00:10:244:9::/64" {
			return fmt.Errorf("ranges %q", got)
		}
		if !strings.Contains(l.agentLog(), "default/old-pod keeps 10.244.0.5") {
			return fmt.Errorf("no warning naming default/old-pod in the agent's log")
		}
		return nil
	})

	// Node deleted: its route and cluster CIDR go.
	l.kubectl("delete", "node", "node3")
	l.wantRoutes("node3 deleted",
		"10.244.5.0/24 via "+pfx+"12", "fd00:10:244:5::/64 via "+fabricPrefix6+"12", "10.244.4.0/24 via "+pfx+"14")
	l.eventually("cluster CIDRs without node3's", time.Minute, func() error {
		if got, want := l.clusterCIDRs(), "10.244.4.0/24,10.244.5.0/24,10.244.9.0/24,10.255.0.11/32,10.255.0.12/32,10.255.0.14/32,fd00:10:244:5::/64,fd00:10:244:9::/64,fd00:255::11/128,fd00:255::12/128"; got != want {
			return fmt.Errorf("cni_cluster_cidrs %q, want %q", got, want)
		}
		return nil
	})

	// A route someone deleted comes back at the next reconcile.
	if _, err := in(n.holder, false, "ip", "route", "del", "10.244.4.0/24"); err != nil {
		t.Fatal(err)
	}
	l.wantRoutes("deleted route restored",
		"10.244.5.0/24 via "+pfx+"12", "fd00:10:244:5::/64 via "+fabricPrefix6+"12", "10.244.4.0/24 via "+pfx+"14")

	// A Node claiming a CIDR another owner routes: that route stays theirs.
	l.createNode("node7", []string{pfx + "17"}, []string{"10.244.7.0/24"})
	l.eventually("the foreign route left alone, and said so", time.Minute, func() error {
		if !strings.Contains(l.agentLog(), "a route to 10.244.7.0/24 of protocol") {
			return fmt.Errorf("no word of the foreign route in the agent's log")
		}
		return nil
	})
	if out, err := in(n.holder, false, "ip", "route", "show", "10.244.7.0/24"); err != nil || !strings.Contains(out, "via "+pfx+"12") || strings.Contains(out, "proto 199") {
		t.Fatalf("the static route to 10.244.7.0/24 was taken over: %q %v", out, err)
	}

	// The API server goes away: routes and conflist stay, also across an
	// agent restart; once it is back, the (new) agent follows again.
	c.stopAPIServer()
	l.steady("API server down", 8*time.Second)
	c.stop(l.agent)
	l.startAgent("agent-restarted")
	l.steady("API server down, agent restarted", 5*time.Second)
	if err := c.startAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	l.kubectl("delete", "node", "node4")
	l.wantRoutes("resynced after the API server came back: node4 deleted meanwhile",
		"10.244.5.0/24 via "+pfx+"12", "fd00:10:244:5::/64 via "+fabricPrefix6+"12")

	// Routes of other owners in the node are untouched: the fabric's and
	// the Service CIDR's link routes.
	for _, dst := range []string{fabricPrefix + ".0/24", serviceCIDR} {
		if out, err := in(n.holder, false, "ip", "route", "show", dst); err != nil || strings.TrimSpace(out) == "" {
			t.Fatalf("route %s gone: %q %v", dst, out, err)
		}
	}
}
