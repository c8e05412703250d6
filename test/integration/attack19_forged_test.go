// attack19: a pod forging its source address to get into an isolated pod:
// another pod's address, the node's (whose traffic always passes), an
// address an ipBlock admits, an unassigned pod address, link-local IPv6.

package integration

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestAttack19ForgedSourceFromPod: h admits UDP from pod b, from the
// remote host (an ipBlock /32) and, as every pod does, from the node. Pod a
// (open both ways) sends h datagrams forged from each of those addresses,
// from an unassigned address of the pod subnet and (IPv6) from link-local
// addresses, by IP_TRANSPARENT. h must get none; a's spoof drops must count
// them, but the link-local ones: from_container passes a pod's link-local
// sources to the node (its link's scope) unchecked, counted as forwarded,
// and the node's stack does not forward a link-local source off the link
// (logged here, not asserted). Control: b's own datagram arrives.
func TestAttack19ForgedSourceFromPod(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	for _, pod := range []string{"a", "b"} {
		p.apply(t, pod, policy.Endpoint{})
	}
	p.apply(t, "h", policy.Endpoint{Ingress: isolated(allowAll(host(ip("b", 4))), allowAll(host(ip("b", 6))),
		allowAll(host(remoteIP[4])), allowAll(host(remoteIP[6])))})
	const port = 6000
	for _, fam := range []int{4, 6} {
		var ln *net.UDPConn
		must(t, p.h.Do(func(ns.NetNS) error {
			var err error
			ln, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip("h", fam), Port: port})
			return err
		}))
		dst := &net.UDPAddr{IP: ip("h", fam), Port: port}
		sendForged(t, p.b, &net.UDPAddr{IP: ip("b", fam), Port: 5555}, dst, "control")
		if got, ok := udpReceived(ln, "control"); !ok {
			t.Fatalf("v%d: b's own datagram did not reach h: %q", fam, got)
		}
		srcs := map[string]net.IP{"b": ip("b", fam), "node": nodeIP[fam], "uplink": uplinkIP[fam], "remote": remoteIP[fam]}
		if fam == 4 {
			srcs["unassigned"] = net.ParseIP("10.250.0.200")
		} else {
			srcs["unassigned"] = net.ParseIP("fd00:250::200")
			srcs["link-local"] = net.ParseIP("fe80::1")
			srcs["b-link-local"] = linkLocalOf(t, p.b)
		}
		_, aIdx := p.HostVeth("a")
		spoofBefore := counter(t, p.m, aIdx, maps.DirEgress, maps.ReasonDropSpoofIP).Packets +
			counter(t, p.m, aIdx, maps.DirIngress, maps.ReasonDropSpoofIP).Packets
		sent := 0
		for name, src := range srcs {
			b0 := counter(t, p.m, aIdx, maps.DirEgress, maps.ReasonDropSpoofIP).Packets
			for i := 0; i < 3; i++ {
				sendForgedLL(t, p.a, &net.UDPAddr{IP: src, Port: 5555}, dst, "forged-"+name)
				if !src.IsLinkLocalUnicast() {
					sent++
				}
			}
			time.Sleep(50 * time.Millisecond)
			t.Logf("v%d forged from %s (%s): drop_spoof_ip +%d", fam, name, src, counter(t, p.m, aIdx, maps.DirEgress, maps.ReasonDropSpoofIP).Packets-b0)
		}
		sendForged(t, p.b, &net.UDPAddr{IP: ip("b", fam), Port: 5555}, dst, "end")
		got, _ := udpReceived(ln, "end")
		for _, g := range got {
			if strings.HasPrefix(g, "forged-") {
				t.Errorf("v%d: h got a datagram pod a forged: %s", fam, g)
			}
		}
		ln.Close()
		time.Sleep(100 * time.Millisecond)
		spoof := counter(t, p.m, aIdx, maps.DirEgress, maps.ReasonDropSpoofIP).Packets +
			counter(t, p.m, aIdx, maps.DirIngress, maps.ReasonDropSpoofIP).Packets - spoofBefore
		if spoof < uint64(sent) {
			t.Errorf("v%d: a sent %d forged datagrams, its drop_spoof_ip counters rose by %d\n%s", fam, sent, spoof, dumpCounters(p.m, aIdx))
		}
	}
}

// sendForgedLL is sendForged, also from a link-local source (bound on eth0).
func sendForgedLL(t *testing.T, netns ns.NetNS, src *net.UDPAddr, dst *net.UDPAddr, msg string) {
	t.Helper()
	if !src.IP.IsLinkLocalUnicast() {
		sendForged(t, netns, src, dst, msg)
		return
	}
	must(t, netns.Do(func(ns.NetNS) error {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1); err != nil {
			return err
		}
		from := &unix.SockaddrInet6{Port: src.Port, ZoneId: uint32(ifc.Index)}
		copy(from.Addr[:], src.IP.To16())
		if err := unix.Bind(fd, from); err != nil {
			return err
		}
		to := &unix.SockaddrInet6{Port: dst.Port}
		copy(to.Addr[:], dst.IP.To16())
		return unix.Sendto(fd, []byte(msg), 0, to)
	}))
}

// linkLocalOf is the fe80:: address of eth0 in pod.
func linkLocalOf(t *testing.T, pod ns.NetNS) net.IP {
	t.Helper()
	var ll net.IP
	must(t, pod.Do(func(ns.NetNS) error {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.IsLinkLocalUnicast() {
				ll = n.IP
			}
		}
		return nil
	}))
	if ll == nil {
		t.Fatal("pod has no link-local address")
	}
	return ll
}
