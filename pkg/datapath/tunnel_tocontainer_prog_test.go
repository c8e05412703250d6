package datapath

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

const (
	tcUplinkIfindex = 4301 // the packet's ingress: an uplink (only a number in test runs)
	tcTunIfindex    = 4302 // the tunnel device, listed in cni_after_links
)

var (
	tcPeerPod   = net.ParseIP("10.99.3.2") // a pod of a node reached through the tunnel
	tcPeerPod6  = net.ParseIP("fd00:99:3::2")
	tcDirectPod = net.ParseIP("10.99.2.2") // a pod of a direct node (hybrid)
	tcHost      = net.ParseIP("192.0.2.50")
)

// tunnelOn puts dp in tunnel mode with one tunnelled node (10.99.3.0/24,
// fd00:99:3::/64) and one direct node (10.99.2.0/24), and the tunnel
// device at tcTunIfindex.
func tunnelOn(t testing.TB, dp *Datapath) {
	t.Helper()
	must(t, dp.Maps.Tunnel().Sync([]maps.TunnelNode{
		{Addrs: []netip.Addr{netip.MustParseAddr("10.77.2.1")}, Endpoint: netip.MustParseAddr("10.77.2.1"),
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.99.3.0/24"), netip.MustParsePrefix("fd00:99:3::/64")}},
		{Addrs: []netip.Addr{netip.MustParseAddr("10.77.1.2")}, Endpoint: netip.MustParseAddr("10.77.1.2"),
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.99.2.0/24")}, Direct: []netip.Prefix{netip.MustParsePrefix("10.99.2.0/24")}},
	}))
	must(t, dp.Maps.Policy().SyncAfterLinks(maps.AfterLinkTunnel, []int{tcTunIfindex}))
	must(t, dp.Maps.Tunnel().SetMode(true, true))
}

// TestToContainerTunnelledSourceOnlyFromTunnel: in tunnel mode, a packet
// the stack delivers to a pod claiming a tunnelled node's pod is dropped
// (drop_tunnel_source on its ingress link) unless it came in by the tunnel
// device; a direct node's pod, a host, a node-sent packet and tunnel mode
// off pass.
func TestToContainerTunnelledSourceOnlyFromTunnel(t *testing.T) {
	dp := testDatapath(t)
	seg := func(src, dst net.IP) []byte {
		f := packet(hostMAC, protoTCP, src, dst, 40000, 80, synFlag)
		copy(f[0:6], podMAC)
		return f
	}
	// Tunnel mode off: the same forgery passes (host-gw has no such rule).
	if ret, _, _ := testRun(t, dp.ToContainer, seg(tcPeerPod, podIP), tcUplinkIfindex); ret != actOK {
		t.Errorf("tunnel off, tunnelled source from the uplink: verdict %d, want OK", ret)
	}
	tunnelOn(t, dp)
	for _, c := range []struct {
		name    string
		frame   []byte
		ingress uint32
		want    uint32
	}{
		{"tunnelled source from the uplink", seg(tcPeerPod, podIP), tcUplinkIfindex, actShot},
		{"tunnelled source from the uplink, IPv6", seg(tcPeerPod6, podIP6), tcUplinkIfindex, actShot},
		{"tunnelled source from a pod's veth", seg(tcPeerPod, podIP), dstIfindex, actShot},
		{"tunnelled source from the tunnel device", seg(tcPeerPod, podIP), tcTunIfindex, actOK},
		{"tunnelled source from the tunnel device, IPv6", seg(tcPeerPod6, podIP6), tcTunIfindex, actOK},
		{"direct node's pod from the uplink", seg(tcDirectPod, podIP), tcUplinkIfindex, actOK},
		{"host from the uplink", seg(tcHost, podIP), tcUplinkIfindex, actOK},
		{"sent by the node", seg(tcPeerPod, podIP), 0, actOK},
	} {
		before := dropCount(t, dp, c.ingress)
		if ret, _, _ := testRun(t, dp.ToContainer, c.frame, c.ingress); ret != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, ret, c.want)
		}
		if c.ingress == 0 {
			continue
		}
		if n := dropCount(t, dp, c.ingress) - before; (n == 1) != (c.want == actShot) {
			t.Errorf("%s: %d drop_tunnel_source on ifindex %d", c.name, n, c.ingress)
		}
	}
}

func dropCount(t testing.TB, dp *Datapath, ifindex uint32) uint64 {
	t.Helper()
	cs, err := dp.Maps.Stats().Counters(int(ifindex))
	must(t, err)
	return cs[maps.CounterKey{Dir: maps.DirIngress, Reason: maps.ReasonDropTunSrc}].Packets
}

// BenchmarkToContainerTunnel times cni_to_container on a remote host's
// TCP segment to a pod, tunnel mode off and on, and a tunnelled node's
// pod's segment out of the tunnel device (the check's two lookups).
// go test -run - -bench ToContainer -benchtime 20000x ./pkg/datapath/
func BenchmarkToContainerTunnel(b *testing.B) {
	for _, c := range []struct {
		name    string
		on      bool
		src     net.IP
		ingress uint32
	}{
		{"off", false, tcHost, tcUplinkIfindex},
		{"on/host", true, tcHost, tcUplinkIfindex},
		{"on/tunnelled-from-tunnel", true, tcPeerPod, tcTunIfindex},
	} {
		b.Run(c.name, func(b *testing.B) {
			dp := testDatapath(b)
			if c.on {
				tunnelOn(b, dp)
			}
			frame := packet(hostMAC, protoTCP, c.src, podIP, 40000, 80, ackFlag)
			copy(frame[0:6], podMAC)
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ret, ns, _ := testRun(b, dp.ToContainer, frame, c.ingress)
				if ret != actOK {
					b.Fatalf("verdict %d, want OK", ret)
				}
				total += time.Duration(ns)
			}
			b.StopTimer()
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/run")
		})
	}
}
