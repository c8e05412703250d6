package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a25UplinkSpoofDrops is the node's drop_spoof_ip count on its uplink.
func a25UplinkSpoofDrops(t *testing.T, l *podPolLab) uint64 {
	t.Helper()
	return counter(t, l.m, l.HostIfindex("uplink0"), maps.DirIngress, maps.ReasonDropSpoofIP).Packets
}

// a25OutsideAsPodSubnet: the remote host, beyond the node's uplink, sends
// pod a UDP datagrams forged from src(fam), an address of this node's pod
// subnet, which a admits (an ipBlock of the subnet: "the pods of this
// node"). a's listener must get none of them, and each must be counted as
// drop_spoof_ip ingress on the uplink (observe.md: "What comes off the
// wire claiming a pod of this node or a node address as its source ... is
// drop_spoof_ip, ingress, on the uplink"). Control: pod b's own datagram
// arrives.
func a25OutsideAsPodSubnet(t *testing.T, name string, src func(fam int, b map[int]net.IP) net.IP) {
	a25OutsideAsPodSubnetIn(t, newPodPolLab(t), name, src)
}

// a25OutsideAsPodSubnetIn is a25OutsideAsPodSubnet in the lab l.
func a25OutsideAsPodSubnetIn(t *testing.T, l *podPolLab, name string, src func(fam int, b map[int]net.IP) net.IP) {
	b, rb := l.RunPod("b")
	b4, b6 := resultIPs(rb)
	bIP := map[int]net.IP{4: b4, 6: b6}
	_, bidx := l.HostVeth("b")
	must(t, l.w.Apply(uint32(bidx), policy.Endpoint{}))
	l.apply(t, policy.Endpoint{Ingress: isolated(allowAll(prefix(testenv.PodSubnet4)), allowAll(prefix(testenv.PodSubnet6)))})
	const port = 9825
	for _, fam := range []int{4, 6} {
		ln := udpSocketPort(t, l.a, l.aIP[fam], port)
		ctl := fmt.Sprintf("b-itself-v%d", fam)
		sendForged(t, b, &net.UDPAddr{IP: bIP[fam], Port: 5000}, &net.UDPAddr{IP: l.aIP[fam], Port: port}, ctl)
		if !bigReceived(ln, ctl, 2*time.Second) {
			t.Fatalf("IPv%d: b's own datagram did not reach a, which admits the pod subnet", fam)
		}
		ip := src(fam, bIP)
		marker := fmt.Sprintf("outside-as-%s-v%d", name, fam)
		before := a25UplinkSpoofDrops(t, l)
		for i := 0; i < 3; i++ {
			sendForged(t, l.remote, &net.UDPAddr{IP: ip, Port: 5001}, &net.UDPAddr{IP: l.aIP[fam], Port: port}, marker)
		}
		if bigReceived(ln, marker, time.Second) {
			t.Errorf("IPv%d: the remote host, forging %s's source %s of this node's pod subnet, reached a (which admits the pod subnet)", fam, name, ip)
		}
		if d := a25UplinkSpoofDrops(t, l) - before; d != 3 {
			t.Errorf("IPv%d: forged from %s (%s): drop_spoof_ip on the uplink moved by %d, want 3", fam, name, ip, d)
		}
	}
}

// TestAttack25OutsideSourceOfThisNodesPod: the forged source is pod b's
// (TestPolicyForgedPodSourceFromOutside's attack, here with the drop count
// on the uplink that observe.md names).
func TestAttack25OutsideSourceOfThisNodesPod(t *testing.T) {
	t.Parallel()
	a25OutsideAsPodSubnet(t, "b", func(fam int, b map[int]net.IP) net.IP { return b[fam] })
}

// udpSocketPort opens a UDP socket in netns bound to ip:port.
func udpSocketPort(t *testing.T, netns ns.NetNS, ip net.IP, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	must(t, netns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
		return err
	}))
	t.Cleanup(func() { c.Close() })
	return c
}

// a25PodGateways is the gateway of pod's default route in each family.
func a25PodGateways(t *testing.T, pod ns.NetNS) map[int]net.IP {
	t.Helper()
	gw := map[int]net.IP{}
	must(t, pod.Do(func(ns.NetNS) error {
		for fam, f := range map[int]int{4: netlink.FAMILY_V4, 6: netlink.FAMILY_V6} {
			rs, err := netlink.RouteListFiltered(f, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return err
			}
			for _, r := range rs {
				if r.Gw == nil {
					continue
				}
				if ones, _ := maskOnesOf(r.Dst); ones == 0 && !r.Gw.IsLinkLocalUnicast() {
					gw[fam] = r.Gw
				}
			}
		}
		return nil
	}))
	if gw[4] == nil || gw[6] == nil {
		t.Fatalf("pod's default gateways: %v", gw)
	}
	return gw
}

// maskOnesOf is the prefix length of dst (nil: a default route, 0).
func maskOnesOf(dst *net.IPNet) (int, int) {
	if dst == nil {
		return 0, 0
	}
	return dst.Mask.Size()
}

// TestAttack25OutsideGatewaySourceToIsolatedPod: the pods' gateway address
// (the IPAM gateway, onlink: no interface of the node holds it) is what a
// pod's traffic from the node might be taken for. The remote host forges
// it, and an unassigned address of the pod subnet, towards pod a, whose
// ingress admits nobody: neither is the node's traffic (the node sends from
// its own addresses), so a's rules judge them and a gets nothing, each
// counted as drop_policy ingress on a's host veth. Control: the node itself
// reaches a.
func TestAttack25OutsideGatewaySourceToIsolatedPod(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	gw := a25PodGateways(t, l.a)
	t.Logf("a's gateways: %s, %s", gw[4], gw[6])
	l.apply(t, policy.Endpoint{Ingress: isolated()})
	unassigned := map[int]net.IP{4: net.ParseIP("10.250.0.201").To4(), 6: net.ParseIP("fd00:250::201")}
	const port = 9826
	for _, fam := range []int{4, 6} {
		ln := udpSocketPort(t, l.a, l.aIP[fam], port)
		ctl := fmt.Sprintf("node-v%d", fam)
		sendUDPFrom(t, l.Node, l.aIP[fam], port, []byte(ctl))
		if !bigReceived(ln, ctl, 2*time.Second) {
			t.Fatalf("IPv%d: the node's own datagram did not reach a", fam)
		}
		for _, src := range []struct {
			name string
			ip   net.IP
		}{{"gateway", gw[fam]}, {"unassigned", unassigned[fam]}} {
			marker := fmt.Sprintf("outside-as-%s-v%d", src.name, fam)
			before := counter(t, l.m, l.idx, maps.DirIngress, maps.ReasonDropPolicy).Packets
			for i := 0; i < 3; i++ {
				sendForged(t, l.remote, &net.UDPAddr{IP: src.ip, Port: 5002}, &net.UDPAddr{IP: l.aIP[fam], Port: port}, marker)
			}
			if bigReceived(ln, marker, time.Second) {
				t.Errorf("IPv%d: the remote host forging the %s address %s reached a, whose ingress admits nobody", fam, src.name, src.ip)
			}
			if d := counter(t, l.m, l.idx, maps.DirIngress, maps.ReasonDropPolicy).Packets - before; d != 3 {
				t.Errorf("IPv%d: forged from the %s address: a's drop_policy ingress moved by %d, want 3", fam, src.name, d)
			}
		}
	}
}
