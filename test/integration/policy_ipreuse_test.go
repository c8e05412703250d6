// The orderings of an address's reuse on the node (after attack19's
// TestAttack19IPReuse): the node's attachment records, not the API's
// status, tell whose an address of this node is (docs/networkpolicy.md,
// "Whose address").

package integration

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ipReuseLab is a19's lab whose host-local hands out n addresses per
// family (10.250.0.10 and fd00:250::10 on), so a freed one goes to the
// next ADD once the others are taken; server (app=server: TCP 8080 from
// app=client only) and client (app=client: TCP 8080 to app=server only)
// are ADDed on the first two, and client reaches server.
func ipReuseLab(t *testing.T, n int) (l *a19Lab, server, client ns.NetNS, sIP, cIP map[int]net.IP) {
	t.Helper()
	l = newA19Lab(t, map[string]any{"type": "host-local", "ranges": [][]map[string]string{
		{{"subnet": "10.250.0.0/24", "rangeStart": "10.250.0.10", "rangeEnd": fmt.Sprintf("10.250.0.%d", 9+n)}},
		{{"subnet": "fd00:250::/64", "rangeStart": "fd00:250::10", "rangeEnd": fmt.Sprintf("fd00:250::%d", 9+n)}},
	}})
	ctx := context.Background()
	for _, np := range []*networkingv1.NetworkPolicy{serverIngressFrom("client"), clientEgressTo("server")} {
		_, err := l.cs.NetworkingV1().NetworkPolicies("ns").Create(ctx, np, metav1.CreateOptions{})
		must(t, err)
	}
	server, sIP = l.pod(t, "server", map[string]string{"app": "server"})
	client, cIP = l.pod(t, "client", map[string]string{"app": "client"})
	serve(t, server, 8080, "server")
	wantTCP(t, "client to server", client, sIP, 8080, true)
	return l, server, client, sIP, cIP
}

// addOnly ADDs container id of pod name and publishes the pod with labels
// and the addresses given (none: the kubelet has not reported them yet);
// it does not wait for the controller.
func (l *a19Lab) addOnly(t *testing.T, id, name string, labels map[string]string, withIPs bool) (ns.NetNS, map[int]net.IP) {
	t.Helper()
	netns := l.NewPod()
	v4, v6 := resultIPs(addPod(t, l.hpEnv, netns, id, name))
	p := k8sPod(name, labels)
	if withIPs {
		p = k8sPod(name, labels, v4, v6)
	}
	_, err := l.cs.CoreV1().Pods("ns").Create(context.Background(), p, metav1.CreateOptions{})
	must(t, err)
	return netns, map[int]net.IP{4: v4, 6: v6}
}

// markDeleting is the API half of the kubelet's teardown (tornDown's):
// the object marked for deletion, still Running with its addresses.
func (l *a19Lab) markDeleting(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	p, err := l.cs.CoreV1().Pods("ns").Get(ctx, name, metav1.GetOptions{})
	must(t, err)
	now := metav1.Now()
	p.DeletionTimestamp = &now
	_, err = l.cs.CoreV1().Pods("ns").Update(ctx, p, metav1.UpdateOptions{})
	must(t, err)
}

// noLeak wants none of from's TCP connections to ips:8080 to open in 2 s.
func noLeak(t *testing.T, what string, from ns.NetNS, ips map[int]net.IP) {
	t.Helper()
	if ok, n := leakFor(from, []net.IP{ips[4], ips[6]}, 8080, 2*time.Second); ok > 0 {
		t.Errorf("%s: connected %d times of %d in 2 s", what, ok, n)
	}
}

func sameIPs(t *testing.T, who string, got, want map[int]net.IP) {
	t.Helper()
	if !got[4].Equal(want[4]) || !got[6].Equal(want[6]) {
		t.Fatalf("%s got %v, want %v (IPAM did not reuse)", who, got, want)
	}
}

// TestPolicyIPReuseOrderings: each ordering of a reuse of client's
// addresses (client: TCP 8080 to server only, the only pod server admits)
// that the lab can drive.
//   - add-before-old-update: client's DEL, intruder (app=intruder) ADDed on
//     its addresses, and only then client's object marked for deletion
//     (the update re-delivers its stale addresses after the ADD): intruder
//     must not reach server, before nor after the update.
//   - agent-restart: the agent stopped, client torn down and intruder ADDed
//     on its addresses while none ran; the new agent lists client's stale
//     object and intruder's record: intruder, opened by that agent, must not
//     reach server.
//   - sandbox-restart: client's sandbox deleted and ADDed again (new
//     container, new addresses; the object still names the old ones):
//     client keeps its access to server.
//   - record-before-api-ips: client2 (app=client) ADDed, its object not yet
//     showing addresses: it reaches server from the start.
//   - remote-stale-object: an object of another node (app=client) names the
//     addresses host-local gives intruder next: intruder must not reach
//     server (a local record wins over any API status).
func TestPolicyIPReuseOrderings(t *testing.T) {
	ctx := context.Background()
	intruder := map[string]string{"app": "intruder"}
	t.Run("add-before-old-update", func(t *testing.T) {
		l, _, client, sIP, cIP := ipReuseLab(t, 2)
		must(t, l.Del(client, "client", "eth0"))
		in, iIP := l.addOnly(t, "intruder", "intruder", intruder, true)
		sameIPs(t, "intruder", iIP, cIP)
		l.waitProgrammed(t, "intruder")
		noLeak(t, "intruder before client's object was marked", in, sIP)
		l.markDeleting(t, "client")
		settle()
		noLeak(t, "intruder after client's object was marked", in, sIP)
	})
	t.Run("agent-restart", func(t *testing.T) {
		l, _, client, sIP, cIP := ipReuseLab(t, 2)
		l.stop()
		must(t, l.Del(client, "client", "eth0"))
		l.markDeleting(t, "client")
		in, iIP := l.addOnly(t, "intruder", "intruder", intruder, true)
		sameIPs(t, "intruder", iIP, cIP)
		l.start(t)
		l.waitProgrammed(t, "intruder")
		noLeak(t, "intruder, opened by a restarted agent", in, sIP)
	})
	t.Run("sandbox-restart", func(t *testing.T) {
		l, _, client, sIP, cIP := ipReuseLab(t, 3)
		must(t, l.Del(client, "client", "eth0"))
		again := l.NewPod()
		v4, v6 := resultIPs(addPod(t, l.hpEnv, again, "client-again", "client"))
		if v4.Equal(cIP[4]) || v6.Equal(cIP[6]) {
			t.Fatalf("the new sandbox got the old addresses %v %v: the case needs new ones", v4, v6)
		}
		l.waitProgrammed(t, "client-again")
		wantTCP(t, "client's new sandbox (its object naming the old addresses) to server", again, sIP, 8080, true)
	})
	t.Run("record-before-api-ips", func(t *testing.T) {
		l, _, _, sIP, _ := ipReuseLab(t, 3)
		c2, _ := l.addOnly(t, "client2", "client2", map[string]string{"app": "client"}, false)
		l.waitProgrammed(t, "client2")
		wantTCP(t, "client2 (no addresses in its object yet) to server", c2, sIP, 8080, true)
	})
	t.Run("remote-stale-object", func(t *testing.T) {
		l, _, _, sIP, _ := ipReuseLab(t, 3)
		next := map[int]net.IP{4: net.ParseIP("10.250.0.12").To4(), 6: net.ParseIP("fd00:250::12")}
		ghost := k8sPod("ghost", map[string]string{"app": "client"}, next[4], next[6])
		ghost.Spec.NodeName = "other-node"
		_, err := l.cs.CoreV1().Pods("ns").Create(ctx, ghost, metav1.CreateOptions{})
		must(t, err)
		settle()
		in, iIP := l.addOnly(t, "intruder", "intruder", intruder, true)
		sameIPs(t, "intruder", iIP, next)
		l.waitProgrammed(t, "intruder")
		noLeak(t, "intruder on addresses another node's object names", in, sIP)
	})
}
