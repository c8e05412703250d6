// Round 7 (pending6): the pending deferral (lib/policy.h, POL_CT_F_PENDING)
// must not cut flows the pod's egress policy allows.

package integration

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestPolicyServiceToLocalNodeBackendAllowed: a pod whose egress allows
// only the node's address and one port dials a ClusterIP whose endpoint is
// that address and port (a hostNetwork backend: the `kubernetes` Service on
// a control-plane node running pods, a single-node cluster). from_container
// defers the denial of the ClusterIP (pending entry); kube-proxy DNATs it to
// the node's address and the stack delivers it locally, where no judgement
// after the stack runs to confirm the entry: every answer was dropped at the
// pod's door, although the policy allows the node's address and port. Now
// to_container judges the first answer a node socket sends back (the pod's
// egress toward the address and port the stack delivered the request to,
// read from its conntrack entry): allowed, the entry is confirmed. Another
// port of the node behind another ClusterIP stays denied (no answer,
// counted at the pod's door), as TestAttack5EgressDeniedThroughServiceToNode*.
func TestPolicyServiceToLocalNodeBackendAllowed(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	for _, fam := range []int{4, 6} {
		routeVia(t, h.Node, "", remoteIP[fam])
	}
	a := h.NewPod()
	h.CleanupDel(a, "a")
	h.Add(a, "a")
	_, idx := h.HostVeth("a")
	serve(t, h.Node, 9097, "node")
	serve(t, h.Node, 9098, "other")
	allowed := map[int]net.IP{4: net.ParseIP("10.96.0.79").To4(), 6: net.ParseIP("fd00:96::79")}
	denied := map[int]net.IP{4: net.ParseIP("10.96.0.80").To4(), 6: net.ParseIP("fd00:96::80")}
	var allows []policy.Allow
	for _, fam := range []int{4, 6} {
		var svcs []svcPort
		for _, p := range []string{"tcp", "udp"} {
			svcs = append(svcs,
				svcPort{name: "lnode-" + p, proto: p, clusterIP: allowed[fam], port: 80, backend: nodeIP[fam], target: 9097},
				svcPort{name: "lother-" + p, proto: p, clusterIP: denied[fam], port: 80, backend: nodeIP[fam], target: 9098})
		}
		proxyModes[0].install(t, h.Node, fam, cluster[fam], []net.IP{uplinkIP[fam], nodeIP[fam]}, svcs)
		allows = append(allows, policy.Allow{Prefix: host(nodeIP[fam]), Ports: []policy.PortRange{
			{Proto: unix.IPPROTO_TCP, First: 9097, Last: 9097}, {Proto: unix.IPPROTO_UDP, First: 9097, Last: 9097}}})
	}
	must(t, h.Maps().Policy().Writer().Apply(uint32(idx), policy.Endpoint{Egress: isolated(allows...)}))
	for _, fam := range []int{4, 6} {
		for _, p := range []string{"tcp", "udp"} {
			reach(t, a, p, nodeIP[fam], 9097, "node") // the node's address: judged at once, allowed
			reach(t, a, p, allowed[fam], 80, "node")  // through the ClusterIP: judged at the answer
			reach(t, a, p, allowed[fam], 80, "node")  // again, a new flow
			repliesDropped(t, h.Maps(), a, idx, p, denied[fam], 80)
		}
	}
}

// TestPolicyPendingEntryRecreatedIsConfirmed: a pod whose egress allows a
// host off the node exchanges datagrams with it through a ClusterIP. Its
// entry as it dialled the ClusterIP (pending until to_uplink's judgement
// confirms it) goes (evicted by its table's LRU, or expired: 30 s of a
// silent server), while the entry of the translated flow lives on. The
// pod's next datagram makes a new pending entry, and to_uplink, finding the
// translated flow known, allowed it without confirming anything: every
// answer was dropped at the pod's door from then on. Now a pending entry is
// confirmed whenever its translated flow is allowed after the stack.
func TestPolicyPendingEntryRecreatedIsConfirmed(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	for _, fam := range []int{4, 6} {
		routeVia(t, h.Node, "", remoteIP[fam])
		routeVia(t, h.remote, cluster[fam], uplinkIP[fam])
	}
	a := h.NewPod()
	h.CleanupDel(a, "a")
	a4, a6 := resultIPs(h.Add(a, "a"))
	aIP := map[int]net.IP{4: a4, 6: a6}
	_, idx := h.HostVeth("a")
	serve(t, h.remote, 7004, "remote")
	svc := map[int]net.IP{4: net.ParseIP("10.96.0.82").To4(), 6: net.ParseIP("fd00:96::82")}
	var allows []policy.Allow
	for _, fam := range []int{4, 6} {
		svcs := []svcPort{{name: "rremote-udp", proto: "udp", clusterIP: svc[fam], port: 80, backend: remoteIP[fam], target: 7004}}
		proxyModes[0].install(t, h.Node, fam, cluster[fam], []net.IP{uplinkIP[fam], nodeIP[fam]}, svcs)
		allows = append(allows, allowPorts(host(remoteIP[fam]), unix.IPPROTO_UDP, 7004, 7004))
	}
	must(t, h.Maps().Policy().Writer().Apply(uint32(idx), policy.Endpoint{Egress: isolated(allows...)}))
	for _, fam := range []int{4, 6} {
		ln := udpSocket(t, a, aIP[fam])
		ask := func(msg string) bool {
			for try := 0; try < 3; try++ {
				if _, err := ln.WriteToUDP([]byte(msg), &net.UDPAddr{IP: svc[fam], Port: 80}); err != nil {
					t.Fatal(err)
				}
				if bigReceived(ln, "remote", 500*time.Millisecond) {
					return true
				}
			}
			return false
		}
		if !ask(fmt.Sprintf("first-v%d", fam)) {
			t.Fatalf("IPv%d: no answer from the allowed host through the ClusterIP", fam)
		}
		sv, _ := netip.AddrFromSlice(svc[fam])
		n, err := h.Maps().Policy().DeleteFlowsOf(0, sv.Unmap())
		must(t, err)
		if n == 0 {
			t.Fatalf("IPv%d: no flow entry of a with the ClusterIP to delete", fam)
		}
		if !ask(fmt.Sprintf("again-v%d", fam)) {
			t.Errorf("IPv%d: the pending entry made again (the translated flow's entry alive) was never confirmed: no answer", fam)
		}
	}
}
