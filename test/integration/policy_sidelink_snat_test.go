package integration

import (
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// routeSvcFromFar routes the WEB Service's addresses from far (behind
// side0, plugSideLink) to the node: IPv4 on the link to side0's MAC (the
// node answers no ARP for a ClusterIP), IPv6 through fe80::1.
func routeSvcFromFar(t *testing.T, p *polLab, far ns.NetNS) {
	t.Helper()
	var mac net.HardwareAddr
	must(t, p.Node.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("side0")
		if err == nil {
			mac = l.Attrs().HardwareAddr
		}
		return err
	}))
	must(t, far.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		idx := l.Attrs().Index
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: idx, State: netlink.NUD_PERMANENT, IP: svcWeb[4], HardwareAddr: mac}); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: svcWeb[4], Mask: net.CIDRMask(32, 32)}}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: svcWeb[6], Mask: net.CIDRMask(128, 128)}, Gw: sideLL["node"]})
	}))
}

// TestPolicyForgedSourceFromSideLinkMasqueraded: as
// TestAttack19ForgedSourceFromSideLink, through b's Service, which
// kube-proxy masquerades (masqueradeAll): b then sees a node address, and
// its ingress judges the source before the SNAT, read from conntrack. far
// forging pod a's address (b admits a) must not get in that way either:
// that source came in by side0, not by a's host veth. IPv4 and IPv6.
func TestPolicyForgedSourceFromSideLinkMasqueraded(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	masqueradeAll(t, p, "WEB")
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	p.apply(t, "a", policy.Endpoint{})
	p.apply(t, "h", policy.Endpoint{})
	p.apply(t, "b", policy.Endpoint{})
	far := plugSideLink(t, p.hpEnv)
	routeSvcFromFar(t, p, far)
	for _, fam := range []int{4, 6} {
		reach(t, far, "udp", svcWeb[fam], 80, "b") // the path works, b open
	}
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(allowAll(host(ip("a", 4))), allowAll(host(ip("a", 6))))})
	const port = 5556
	for _, fam := range []int{4, 6} {
		blocked(t, far, "udp", svcWeb[fam], 80) // far's own address: denied
		var ln *net.UDPConn
		must(t, p.a.Do(func(ns.NetNS) error {
			var err error
			ln, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip("a", fam), Port: port})
			return err
		}))
		for i := 0; i < 3; i++ {
			sendForged(t, far, &net.UDPAddr{IP: ip("a", fam), Port: port}, &net.UDPAddr{IP: svcWeb[fam], Port: 80}, "forged")
		}
		ln.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 512)
		if n, _, err := ln.ReadFromUDP(buf); err == nil {
			t.Errorf("IPv%d: far (behind side0) forged pod a's address %s to b's masqueraded Service: b took the datagram and answered %q", fam, ip("a", fam), buf[:n])
		}
		ln.Close()
	}
}
