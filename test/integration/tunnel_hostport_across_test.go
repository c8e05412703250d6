// A hostPort dialled by a pod of another node, across the tunnel.

package integration

import (
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelHostPortFromPodAcross: a pod of node 1 dials node 3's address
// and a hostPort, as upstream's "KubeProxy should set TCP CLOSE_WAIT
// timeout" does (its server has hostPort 11302; that spec failed in `go run
// ./test/k8s -subnets` and passes on one subnet). Node addresses are
// cluster CIDRs (the agent following Nodes makes them so), so the pod keeps
// its address; node 3's from_uplink DNATs it into the hostPort pod, whose
// reply from_container translates back and hands to fib_redirect, toward
// pod 1's CIDR: a route into ebpf-tun with a tunnel key (lwtunnel), which
// bpf_fib_lookup does not resolve (BPF_FIB_LKUP_RET_UNSUPP_LWT). Before
// tun_redirect (lib/tunnel.h) set the key itself, the reply was dropped as
// drop_no_route on the hostPort pod's host veth (TCP and UDP: 8 in a run).
func TestTunnelHostPortFromPodAcross(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	lab.nodesInCluster(false)
	startTunAgents(t, lab)
	p1, r1 := n1.RunPod("c1")
	a1, _ := testenv.PodIPs(t, r1)
	hp3 := hostPortPod(n3, "hp3", 11302)
	serve(t, hp3, 8080, "hp3")
	_, hostIf := n3.HostVeth("hp3")
	for _, proto := range []string{"tcp", "udp"} {
		a, err := askFrom(p1, proto, hp(tunNode[2], 11302), 0)
		if err != nil || a.server != "hp3" {
			t.Errorf("%s from pod 1 to node 3's hostPort: %+v %v; node 3's hostPort pod: %s", proto, a, err,
				dumpCounters(n3.Maps(), hostIf))
			continue
		}
		if h, _, _ := net.SplitHostPort(a.peer); !net.ParseIP(h).Equal(a1) {
			t.Errorf("%s: the hostPort pod saw the client as %s, want pod 1's %s", proto, a.peer, a1)
		}
	}
	if c := counter(t, n3.Maps(), hostIf, maps.DirEgress, maps.ReasonDropNoRoute); c.Packets != 0 {
		t.Errorf("node 3 dropped %d of the hostPort pod's replies as drop_no_route", c.Packets)
	}
}
