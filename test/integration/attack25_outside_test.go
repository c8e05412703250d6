package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

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
	l := newPodPolLab(t)
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
