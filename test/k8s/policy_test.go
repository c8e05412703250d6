package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/netpol"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	cnistate "github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// clientIn is an admin clientset whose connections are dialled from the
// control-plane namespace (the API server is reachable only there).
func (l *agentLab) clientIn() *kubernetes.Clientset {
	l.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", l.c.admin)
	if err != nil {
		l.t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	nsPath := fmt.Sprintf("/proc/%d/ns/net", l.c.cp.cmd.Process.Pid)
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		orig, err := netns.Get()
		if err != nil {
			return nil, err
		}
		defer orig.Close()
		target, err := netns.GetFromPath(nsPath)
		if err != nil {
			return nil, err
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			return nil, err
		}
		defer netns.Set(orig)
		var d net.Dialer
		return d.DialContext(ctx, network, addr) // the socket stays in the namespace it was made in
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		l.t.Fatal(err)
	}
	return cs
}

// TestAgentPolicyLatency: the real agent with --network-policy against the
// real API server, 1000 pods (100 of them attached on the agent's node:
// records and host links, as ADD leaves them) and 500 policies; a policy
// selecting the 100 local pods is changed 50 times, and each time the
// time from the API write to the agent's write of all 100 interfaces (its
// status file, written right after the maps) is measured.
func TestAgentPolicyLatency(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	l := newAgentLab(t, ctx)
	status := filepath.Join(l.c.work, "policy-status")
	l.args = append(l.args, "--network-policy", "--policy-status-dir", status)
	cs := l.clientIn()

	const pods, local, policies, changes = 1000, 100, 500, 50
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "np"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller manager here: the namespace's default ServiceAccount,
	// which pod admission wants, is made by hand.
	if _, err := cs.CoreV1().ServiceAccounts("np").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Local pods' host links: veths with the names ADD would give them,
	// their peers left in the node (the agent checks the record's name
	// against the ifindex; nothing sends).
	var batch strings.Builder
	names := make([]string, local)
	for i := range local {
		names[i] = cnistate.HostIfName(fmt.Sprintf("c%04d", i), "eth0")
		fmt.Fprintf(&batch, "link add %s type veth peer name pv%04d\n", names[i], i)
	}
	bf := filepath.Join(l.c.work, "links.batch")
	if err := os.WriteFile(bf, []byte(batch.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := in(l.node.holder, false, "ip", "-batch", bf); err != nil {
		t.Fatal(err)
	}
	out, err := in(l.node.holder, false, "ip", "-j", "link", "show", "type", "veth")
	if err != nil {
		t.Fatal(err)
	}
	var links []struct {
		Ifindex int    `json:"ifindex"`
		Ifname  string `json:"ifname"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatal(err)
	}
	idx := map[string]int{}
	for _, lk := range links {
		idx[lk.Ifname] = lk.Ifindex
	}
	st := cnistate.Store{Root: l.stateDir, Network: "ebpf-cni"}
	for i := range pods {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: fmt.Sprintf("p%04d", i),
			Labels: map[string]string{"app": fmt.Sprintf("a%d", i%policies), "role": "peer"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		if i < local {
			p.Labels["role"] = "local"
			p.Spec.NodeName = l.node.name
		}
		p, err := cs.CoreV1().Pods("np").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ip := fmt.Sprintf("10.%d.%d.%d", 100+i/65536, (i/256)%256, i%256)
		p.Status.Phase, p.Status.PodIP, p.Status.PodIPs = corev1.PodRunning, ip, []corev1.PodIP{{IP: ip}}
		if _, err := cs.CoreV1().Pods("np").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if i < local {
			if err := st.Write(&cnistate.Record{ContainerID: fmt.Sprintf("c%04d", i), IfName: "eth0", HostIf: names[i],
				HostIfindex: idx[names[i]], IPs: []string{ip + "/32"}, PodNamespace: "np", PodName: p.Name, Policy: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	tcp := corev1.ProtocolTCP
	policyOf := func(name string, sel map[string]string, port int32) *networkingv1.NetworkPolicy {
		pt := intstr.FromInt32(port)
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: name},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "peer"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &pt}}}}}}
	}
	for i := range policies - 1 {
		if _, err := cs.NetworkingV1().NetworkPolicies("np").Create(ctx, policyOf(fmt.Sprintf("p%03d", i), map[string]string{"app": fmt.Sprintf("a%d", i)}, 80), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sel := map[string]string{"role": "local"}
	if _, err := cs.NetworkingV1().NetworkPolicies("np").Create(ctx, policyOf("local", sel, 1000), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	l.startAgent("agent")
	// allHave: every local interface's status shows port on the "local" policy's rule.
	allHave := func(port uint16) bool {
		sts, err := netpol.ReadStatus(status)
		if err != nil || len(sts) < local {
			return false
		}
		for _, s := range sts {
			if !slices.Contains(s.Endpoint.Policies, "np/local") {
				return false
			}
			found := false
			for _, a := range s.Endpoint.Ingress.Allows {
				for _, p := range a.Ports {
					found = found || (p.First <= port && port <= p.Last)
				}
			}
			if !found {
				return false
			}
		}
		return true
	}
	l.eventually("all 100 local interfaces programmed", 2*time.Minute, func() error {
		if !allHave(1000) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	var lat []time.Duration
	for i := range changes {
		port := int32(1001 + i)
		start := time.Now()
		if _, err := cs.NetworkingV1().NetworkPolicies("np").Update(ctx, policyOf("local", sel, port), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		for !allHave(uint16(port)) {
			if time.Since(start) > 30*time.Second {
				t.Fatalf("change %d not programmed after 30s", i)
			}
			time.Sleep(time.Millisecond)
		}
		lat = append(lat, time.Since(start))
	}
	t.Logf("each change, in order: %v", lat)
	slices.Sort(lat)
	t.Logf("API write to all %d local interfaces written (1000 pods, 500 policies), %d changes: p50 %s, p99 %s, max %s",
		local, changes, lat[len(lat)/2].Round(100*time.Microsecond), lat[len(lat)*99/100].Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond))
	// What the agent holds at this size: its resident memory (informer
	// caches, the compiler's snapshot) and the policy maps' kernel memory.
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", l.agent.cmd.Process.Pid)); err == nil {
		for _, line := range strings.Split(string(st), "\n") {
			if strings.HasPrefix(line, "VmRSS:") || strings.HasPrefix(line, "VmHWM:") {
				t.Logf("agent %s (1000 pods, 500 policies, %d local interfaces programmed)", strings.Join(strings.Fields(line), " "), local)
			}
		}
	} else {
		t.Errorf("agent memory: %v", err)
	}
	// The maps are pinned in the node's own bpffs: read through the
	// agent's status there.
	if out, err := in(l.node.holder, true, l.c.a.path("ebpf-agent"), "status", "--pin-dir", "/sys/fs/bpf/ebpf-cni",
		"--state-dir", l.stateDir, "-o", "json"); err != nil {
		t.Errorf("ebpf-agent status: %v\n%s", err, out)
	} else {
		var st struct{ Maps []maps.Usage }
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Errorf("ebpf-agent status: %v\n%s", err, out)
		}
		var sum uint64
		for _, u := range st.Maps {
			if strings.HasPrefix(u.Name, "cni_pol_") {
				sum += u.Memlock + u.InnerMemlock
				t.Logf("  %s: %d entries, %d bytes", u.Name, u.Entries, u.Memlock+u.InnerMemlock)
			}
		}
		t.Logf("policy maps: %.2f MiB of kernel memory", float64(sum)/(1<<20))
	}
	// The agent's own view: informer event to written, per change.
	var own []string
	for _, line := range strings.Split(l.agentLog(), "\n") {
		if strings.Contains(line, "policy: ") {
			own = append(own, line)
		}
	}
	t.Logf("agent's policy log:\n%s", strings.Join(own, "\n"))
	if !strings.Contains(l.agentLog(), "policy: listed in") {
		t.Errorf("agent log lacks the policy controller's first list")
	}
}
