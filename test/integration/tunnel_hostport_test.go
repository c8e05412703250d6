// A hostPort on the tunnel's own port: the uplink's hostPort DNAT runs
// before the stack, so a pod mapping UDP 4789 would take every tunnel
// datagram sent to its node (reading other nodes' pod traffic, and cutting
// it off) unless genuine tunnel traffic skips it (docs/tunnel.md).

package integration

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelHostPortOnTunnelPort: a pod of node 1 with hostPort 4789/UDP;
// pod 3's datagrams to pod 1 still arrive through the tunnel, and the
// hostPort pod receives none of the encapsulated traffic.
func TestTunnelHostPortOnTunnelPort(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, thief, p3 := n1.NewPod(), n1.NewPod(), n3.NewPod()
	n1.CleanupDel(p1, "hp1")
	r1 := n1.Add(p1, "hp1")
	n1.CleanupDel(thief, "hpthief")
	if _, err := n1.AddHP(thief, "hpthief", testenv.PM{HostPort: 4789, ContainerPort: 4789, Protocol: "udp"}); err != nil {
		t.Fatalf("ADD with hostPort 4789/udp: %v", err)
	}
	n3.CleanupDel(p3, "hp3")
	n3.Add(p3, "hp3")
	a1, _ := testenv.PodIPs(t, r1)

	stolen := listenUDP4(t, thief, 4789)
	got := listenUDP4(t, p1, 9989)
	for i := 0; i < 3; i++ {
		sendUDPFrom(t, p3, a1, 9989, []byte("across-the-tunnel"))
	}
	arrived := got(2 * time.Second)
	if len(arrived) != 3 {
		t.Errorf("pod 1 received %d of 3 datagrams from pod 3 (%q): the hostPort took the tunnel's traffic", len(arrived), arrived)
	}
	if s := stolen(500 * time.Millisecond); len(s) != 0 {
		t.Errorf("the pod with hostPort 4789 received %d tunnel datagrams: %q", len(s), s)
	}
	// The hostPort still works for a host that is no node.
	must(t, lab.strang.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: tunNode[0], Port: 4789})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("stranger-to-hostport"))
		return err
	}))
	if s := stolen(2 * time.Second); len(s) != 1 || !strings.HasPrefix(s[0], "stranger-to-hostport") {
		t.Errorf("the hostPort pod received %q from the stranger, want its datagram", s)
	}
}
