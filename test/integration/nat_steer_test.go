// NAT state an outsider cannot steer (issue 28): forged packets from a host
// on the node's link, with any source address it likes.

package integration

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// setPodPortRange sets a pod's ip_local_port_range, so that a spray can
// cover every port its unbound sockets get.
func setPodPortRange(t *testing.T, pod ns.NetNS, r string) {
	t.Helper()
	err := pod.Do(func(ns.NetNS) error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte(r), 0o644)
	})
	if err != nil {
		t.Fatalf("pod ip_local_port_range %s: %v", r, err)
	}
}

// TestMasqOutsideCannotSteer: datagrams a host on node A's link forges from
// the server's address to a masquerading pod's address (NTP-like: to the
// port the pod will use towards the server; DNS-like: a spray over the
// pod's whole ephemeral range) do not change how the pod's own later
// queries to that server leave: masqueraded, with A's address. Before the
// fix they left with the pod's private address (the outside has no route
// back to it: no answer). IPv4 and IPv6.
func TestMasqOutsideCannotSteer(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	pod := a.NewPod()
	a.CleanupDel(pod, "p")
	p4, p6 := resultIPs(a.Add(pod, "p"))
	serve(t, lab.out, 7000, "outside")
	setPodPortRange(t, pod, "40000 40031")
	brMAC, upMAC := linkMAC(t, lab.out, "br0"), linkMAC(t, a.Node, "uplink0")

	for _, c := range []struct {
		name           string
		pod, srv, node net.IP
	}{{"v4", p4, outsideIP, labNodeA}, {"v6", p6, outsideIP6, labNodeA6}} {
		t.Run(c.name, func(t *testing.T) {
			// NTP-like: the pod talks to server:7000 from port 7000.
			sendFrames(t, lab.out, "br0", [][]byte{udpFrame(brMAC, upMAC, c.srv, 7000, c.pod, 7000, []byte("forged"))})
			// DNS-like: every port of the pod's ephemeral range.
			var spray [][]byte
			for p := 40000; p <= 40031; p++ {
				spray = append(spray, udpFrame(brMAC, upMAC, c.srv, 7000, c.pod, p, []byte("forged")))
			}
			sendFrames(t, lab.out, "br0", spray)
			time.Sleep(100 * time.Millisecond)

			mustAsk(t, pod, "udp", hp(c.srv, 7000), 7000, "outside", c.node)
			for i := 0; i < 3; i++ {
				mustAsk(t, pod, "udp", hp(c.srv, 7000), 0, "outside", c.node)
			}
		})
	}
}
