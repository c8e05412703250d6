// attack20: hostile review of "a torn-down pod's address stops being its
// own the moment an ADD on this node is given it" (docs/networkpolicy.md,
// "Whose address: the node's records, not the API's status"), by ADDs
// other than the kubelet's on the policy's own network.

package integration

import (
	"context"
	"maps"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a20ReuseLab: server (app=server, admits TCP 8080 from app=client only)
// on 10.250.0.10 / fd00:250::10, web (app=web, open, serving 9090) on .11,
// client (app=client) on .12 (the range ends there: the next ADD gets its
// addresses), torn down
// (DEL, its object lingering Running with its addresses).
func a20ReuseLab(t *testing.T) (*a19Lab, map[int]net.IP, map[int]net.IP, map[int]net.IP) {
	l := newA19Lab(t, map[string]any{"type": "host-local", "ranges": [][]map[string]string{
		{{"subnet": "10.250.0.0/24", "rangeStart": "10.250.0.10", "rangeEnd": "10.250.0.12"}},
		{{"subnet": "fd00:250::/64", "rangeStart": "fd00:250::10", "rangeEnd": "fd00:250::12"}},
	}})
	_, err := l.cs.NetworkingV1().NetworkPolicies("ns").Create(context.Background(), serverIngressFrom("client"), metav1.CreateOptions{})
	must(t, err)
	server, sIP := l.pod(t, "server", map[string]string{"app": "server"})
	web, wIP := l.pod(t, "web", map[string]string{"app": "web"})
	client, cIP := l.pod(t, "client", map[string]string{"app": "client"})
	serve(t, server, 8080, "server")
	serve(t, web, 9090, "web")
	wantTCP(t, "client to server", client, sIP, 8080, true)
	l.tornDown(t, client, "client")
	return l, sIP, cIP, wIP
}

// TestAttack20IPReuseSecondNetwork: a second ebpf-cni network (another
// conflist name, the same pinDir and stateDir, its host-local range the
// torn-down client's addresses) ADDs pod intruder (app=intruder, named in
// CNI_ARGS as the kubelet does for a Multus network). It must not reach
// server while the client's object lingers.
func TestAttack20IPReuseSecondNetwork(t *testing.T) {
	t.Parallel()
	a20SecondNetwork(t, false)
}

// TestAttack20IPReuseSecondNetworkOwnStateDir: the same, the second
// network with its own stateDir (as TestAttack19SecondNetwork configures it),
// with networkPolicy as the first.
func TestAttack20IPReuseSecondNetworkOwnStateDir(t *testing.T) {
	t.Parallel()
	a20SecondNetwork(t, true)
}

func a20SecondNetwork(t *testing.T, ownState bool) {
	l, sIP, cIP, wIP := a20ReuseLab(t)
	conf := maps.Clone(l.PluginConf())
	conf["ipam"] = map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{
		{{"subnet": "10.250.0.0/24", "rangeStart": cIP[4].String(), "rangeEnd": cIP[4].String()}},
		{{"subnet": "fd00:250::/64", "rangeStart": cIP[6].String(), "rangeEnd": cIP[6].String()}},
	}}
	if ownState {
		conf["stateDir"] = t.TempDir()
	}
	netB := l.NetList(testenv.RandName("netb"), conf)
	x := l.NewPod()
	rt := &libcni.RuntimeConf{ContainerID: "intruder", NetNS: x.Path(), IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "ns"}, {"K8S_POD_NAME", "intruder"}}}
	t.Cleanup(func() { l.DelList(netB, rt) })
	res, err := l.AddList(netB, rt)
	if err != nil {
		t.Fatalf("ADD intruder on the second network: %v", err)
	}
	v4, v6 := resultIPs(res)
	if !v4.Equal(cIP[4]) || !v6.Equal(cIP[6]) {
		t.Fatalf("intruder got %s %s, want the client's %v", v4, v6, cIP)
	}
	_, err = l.cs.CoreV1().Pods("ns").Create(context.Background(), k8sPod("intruder", map[string]string{"app": "intruder"}, v4, v6), metav1.CreateOptions{})
	must(t, err)
	settle()
	if ok, n := leakFor(x, []net.IP{sIP[4], sIP[6]}, 8080, 2*time.Second); ok > 0 {
		t.Errorf("intruder (app=intruder, second network) on the torn-down client's addresses connected to server %d times of %d in 2 s", ok, n)
	}
	if ownState {
		// The agent reads its own stateDir only: the intruder's
		// interface stays pending (everything dropped), failing closed.
		t.Logf("own stateDir: the intruder reaches web (open): %v", dialOK(x, wIP[4], 9090))
		return
	}
	wantTCP(t, "control: the intruder to web (open)", x, wIP, 9090, true)
}

// TestAttack20IPReuseNoPodArgs: a container ADDed on the policy's network
// without K8S_POD_* arguments (a runtime other than the kubelet's using the
// node's conflist: nerdctl, a debug container tool) gets the torn-down
// client's addresses. It is no pod of any policy's peers: it must not
// reach server while the client's object lingers.
func TestAttack20IPReuseNoPodArgs(t *testing.T) {
	t.Parallel()
	l, sIP, cIP, wIP := a20ReuseLab(t)
	x := l.NewPod()
	l.CleanupDel(x, "nerd")
	res, err := l.AddList(l.ConfList("1.1.0"), &libcni.RuntimeConf{ContainerID: "nerd", NetNS: x.Path(), IfName: "eth0"})
	if err != nil {
		t.Fatalf("ADD without pod arguments: %v", err)
	}
	v4, v6 := resultIPs(res)
	if !v4.Equal(cIP[4]) || !v6.Equal(cIP[6]) {
		t.Fatalf("the container got %s %s, want the client's %v", v4, v6, cIP)
	}
	settle()
	if ok, n := leakFor(x, []net.IP{sIP[4], sIP[6]}, 8080, 2*time.Second); ok > 0 {
		t.Errorf("a container ADDed without pod arguments on the torn-down client's addresses connected to server %d times of %d in 2 s", ok, n)
	}
	wantTCP(t, "control: the intruder to web (open)", x, wIP, 9090, true)
}

// TestAttack20IPReuseAddDelAdd: the torn-down client's addresses go to
// intruder (ADD), which is at once torn down (DEL: the address back to
// IPAM, its record gone, the client's object still lingering) and given
// to intruder2 (ADD) at once, all faster than the agent's passes, with no
// API object for either yet (the record comes first). intruder2 must not
// reach server, neither before its object appears nor after.
func TestAttack20IPReuseAddDelAdd(t *testing.T) {
	t.Parallel()
	l, sIP, cIP, wIP := a20ReuseLab(t)
	i1, i2 := l.NewPod(), l.NewPod()
	v4, _ := resultIPs(addPod(t, l.hpEnv, i1, "intruder", "intruder"))
	must(t, l.Del(i1, "intruder", "eth0"))
	w4, w6 := resultIPs(addPod(t, l.hpEnv, i2, "intruder2", "intruder2"))
	if !v4.Equal(cIP[4]) || !w4.Equal(cIP[4]) || !w6.Equal(cIP[6]) {
		t.Fatalf("intruder got %s, intruder2 %s %s, want the client's %v", v4, w4, w6, cIP)
	}
	if ok, n := leakFor(i2, []net.IP{sIP[4], sIP[6]}, 8080, 2*time.Second); ok > 0 {
		t.Errorf("intruder2 (no object yet) on the torn-down client's addresses connected to server %d times of %d in 2 s", ok, n)
	}
	_, err := l.cs.CoreV1().Pods("ns").Create(context.Background(), k8sPod("intruder2", map[string]string{"app": "intruder"}, w4, w6), metav1.CreateOptions{})
	must(t, err)
	l.waitProgrammed(t, "intruder2")
	if ok, n := leakFor(i2, []net.IP{sIP[4], sIP[6]}, 8080, 2*time.Second); ok > 0 {
		t.Errorf("intruder2 (app=intruder) on the torn-down client's addresses connected to server %d times of %d in 2 s", ok, n)
	}
	wantTCP(t, "control: intruder2 to web (open)", i2, wIP, 9090, true)
}
