// attack19: a pod with two interfaces, both on networkPolicy networks
// sharing the node's pinDir (a second Multus network): the agent must
// isolate the second interface as it does the first, though the API
// lists only the first network's addresses.

package integration

import (
	"context"
	"net"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack19SecondInterfaceAgent: server (app=server) has eth0 on the
// first network and net1 on a second networkPolicy network; it admits TCP
// 8080 from app=client only. attacker (app=attacker) has one interface, on
// the second network. It must reach server neither on eth0's addresses
// nor on net1's; client reaches eth0's. IPv4 and IPv6.
func TestAttack19SecondInterfaceAgent(t *testing.T) {
	l := newA19Lab(t, nil)
	ctx := context.Background()
	_, err := l.cs.NetworkingV1().NetworkPolicies("ns").Create(ctx, serverIngressFrom("client"), metav1.CreateOptions{})
	must(t, err)
	server, sIP := l.pod(t, "server", map[string]string{"app": "server"})
	client, cIP := l.pod(t, "client", map[string]string{"app": "client"})
	netB := l.NetList(testenv.RandName("netb"), map[string]any{
		"type": "ebpf-cni", "pinDir": l.PinDir, "stateDir": l.StateDir, "networkPolicy": true,
		"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{
			{{"subnet": "10.251.0.0/24"}}, {{"subnet": "fd00:251::/64"}}}},
	})
	addB := func(pod ns.NetNS, id, name, ifname string) map[int]net.IP {
		rt := &libcni.RuntimeConf{ContainerID: id, NetNS: pod.Path(), IfName: ifname,
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "ns"}, {"K8S_POD_NAME", name}}}
		t.Cleanup(func() { l.DelList(netB, rt) })
		r, err := l.AddList(netB, rt)
		if err != nil {
			t.Fatalf("ADD %s %s on the second network: %v", id, ifname, err)
		}
		v4, v6 := resultIPs(r)
		return map[int]net.IP{4: v4, 6: v6}
	}
	s1 := addB(server, "server", "server", "net1")
	attacker := l.NewPod()
	aIP := addB(attacker, "attacker", "attacker", "eth0")
	_, err = l.cs.CoreV1().Pods("ns").Create(ctx, k8sPod("attacker", map[string]string{"app": "attacker"}, aIP[4], aIP[6]), metav1.CreateOptions{})
	must(t, err)
	serve(t, server, 8080, "server")
	serve(t, client, 8080, "client")
	net1Idx := l.HostIfindex(state.HostIfName("server", "net1"))
	settle()
	st, ok, _ := l.m.Policy().StateOf(net1Idx)
	t.Logf("server's net1 policy state: %+v (found %v)", st, ok)
	wantTCP(t, "client to server's eth0", client, sIP, 8080, true)
	wantTCP(t, "attacker (second network) to client (open)", attacker, cIP, 8080, true)
	wantTCP(t, "attacker (second network) to server's eth0", attacker, sIP, 8080, false)
	wantTCP(t, "attacker (second network) to server's net1", attacker, s1, 8080, false)
	if ok && st.Mode[maps.DirIngress] == maps.PolicyOpen {
		t.Errorf("server's net1 ingress is open: %+v", st)
	}
}
