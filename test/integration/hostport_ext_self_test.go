// Attack (round 12 review): a hostPort pod dialling its own hostPort with
// IPv6 extension headers (the DNAT and the SNAT to the dialled address
// both rewrite a datagram whose UDP header sits behind the chain).

package integration

import (
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestHostPortUDP6ExtHeadersSelf: a pod sends 100- and 4000-byte datagrams
// (the second fragmented by its kernel) with a hop-by-hop and a
// destination options header to the node's address : its own hostPort,
// and gets each echoed whole: hostport_dnat's snat_to_dialled path (two
// rewrites, both checksum updates at the walked UDP offset), which
// TestHostPortUDP6ExtensionHeaders does not take (its hairpin client is
// another pod). Green at int11 (12270a8): the attack found nothing; kept
// as the guard of that path.
func TestHostPortUDP6ExtHeadersSelf(t *testing.T) {
	e := newHPEnv(t)
	p := e.NewPod()
	e.MustAddHP(p, "extself", testenv.PM{HostPort: 8105, ContainerPort: 105, Protocol: "udp"})
	testenv.WaitIPv6Ready(t, p)
	serveUDPEcho(t, p, 105)
	for _, size := range []int{100, 4000} {
		for _, c := range []struct {
			what     string
			hbh, dst bool
		}{
			{"a hop-by-hop header", true, false},
			{"a destination options header", false, true},
			{"both headers", true, true},
		} {
			addr := hp(uplinkIP6, 8105)
			if err := echoUDP6Opts(p, addr, size, 5, ip6OptsSock(c.hbh, c.dst)); err != nil {
				t.Errorf("%d bytes with %s from the pod to its own hostPort %s: %v", size, c.what, addr, err)
			}
		}
	}
	e.MustDel(p, "extself")
	e.AssertNoHostPorts()
}
