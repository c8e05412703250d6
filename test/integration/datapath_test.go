// The datapath with packets: pod to pod, node to pod, anti-spoofing, MAC
// learning, the gateway resolvable.

package integration

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestDatapathPodToPod proves same-node pod-to-pod traffic over both families
// and that it takes the bpf_redirect_peer short cut, counted on both veths.
func TestDatapathPodToPod(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "pod-a")
	e.CleanupDel(b, "pod-b")
	ra := e.Add(a, "pod-a")
	rb := e.Add(b, "pod-b")
	a4, a6 := testenv.PodIPs(t, ra)
	b4, b6 := testenv.PodIPs(t, rb)
	_, aIdx := e.HostVeth("pod-a")
	_, bIdx := e.HostVeth("pod-b")
	m := e.Maps()

	const size = 4 << 20
	for _, dst := range []net.IP{b4, b6} {
		if err := testenv.Ping(a, dst, 3); err != nil {
			t.Fatal(err)
		}
		if err := testenv.TCPTransfer(a, b, dst, size); err != nil {
			t.Fatalf("TCP a->b %s: %v", dst, err)
		}
	}
	for _, dst := range []net.IP{a4, a6} {
		if err := testenv.Ping(b, dst, 2); err != nil {
			t.Fatal(err)
		}
	}

	aOut := counter(t, m, aIdx, maps.DirEgress, maps.ReasonRedirect)
	bIn := counter(t, m, bIdx, maps.DirIngress, maps.ReasonRedirect)
	bOut := counter(t, m, bIdx, maps.DirEgress, maps.ReasonRedirect)
	aIn := counter(t, m, aIdx, maps.DirIngress, maps.ReasonRedirect)
	// Two transfers of size bytes went a->b: every byte must have been redirected.
	if aOut.Packets == 0 || aOut.Bytes < 2*size {
		t.Errorf("pod-a egress redirect = %+v, want >= %d bytes\n  a: %s", aOut, 2*size, dumpCounters(m, aIdx))
	}
	if bIn.Packets == 0 || bIn.Bytes < 2*size {
		t.Errorf("pod-b ingress redirect = %+v, want >= %d bytes\n  b: %s", bIn, 2*size, dumpCounters(m, bIdx))
	}
	// What one side redirected out is exactly what the other saw redirected in.
	if aOut != bIn {
		t.Errorf("pod-a egress redirect %+v != pod-b ingress redirect %+v", aOut, bIn)
	}
	// Replies and b's pings went the other way.
	if bOut.Packets == 0 || aIn.Packets == 0 {
		t.Errorf("reverse direction not redirected: pod-b egress %+v, pod-a ingress %+v", bOut, aIn)
	}
	if bOut != aIn {
		t.Errorf("pod-b egress redirect %+v != pod-a ingress redirect %+v", bOut, aIn)
	}
	for _, idx := range []int{aIdx, bIdx} {
		cs, _ := m.Stats().Counters(idx)
		for k, c := range cs {
			if k.Reason.IsDrop() {
				t.Errorf("ifindex %d dropped legit traffic: %s/%s = %+v", idx, k.Dir, k.Reason, c)
			}
		}
	}

	e.MustDel(a, "pod-a")
	e.MustDel(b, "pod-b")
	e.AssertClean()
}

// TestDatapathNodeToPod proves node <-> pod traffic both ways over both
// families: it leaves through the kernel stack (forward) in both directions.
func TestDatapathNodeToPod(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := e.NewPod()
	e.CleanupDel(p, "pod")
	r := e.Add(p, "pod")
	p4, p6 := testenv.PodIPs(t, r)
	_, idx := e.HostVeth("pod")
	m := e.Maps()

	const size = 2 << 20
	for _, c := range []struct{ pod, node net.IP }{{p4, testenv.NodeIP4}, {p6, testenv.NodeIP6}} {
		if err := testenv.Ping(e.Node, c.pod, 2); err != nil {
			t.Errorf("node -> pod: %v", err)
		}
		if err := testenv.Ping(p, c.node, 2); err != nil {
			t.Errorf("pod -> node: %v", err)
		}
		if err := testenv.TCPTransfer(e.Node, p, c.pod, size); err != nil {
			t.Errorf("TCP node -> pod %s: %v", c.pod, err)
		}
		if err := testenv.TCPTransfer(p, e.Node, c.node, size); err != nil {
			t.Errorf("TCP pod -> node %s: %v", c.node, err)
		}
	}
	out := counter(t, m, idx, maps.DirEgress, maps.ReasonForward)
	in := counter(t, m, idx, maps.DirIngress, maps.ReasonForward)
	if out.Bytes < 2*size {
		t.Errorf("egress forward = %+v, want >= %d bytes (pod->node transfers)\n  %s", out, 2*size, dumpCounters(m, idx))
	}
	if in.Bytes < 2*size {
		t.Errorf("ingress forward = %+v, want >= %d bytes (node->pod transfers)\n  %s", in, 2*size, dumpCounters(m, idx))
	}
	if c := counter(t, m, idx, maps.DirEgress, maps.ReasonRedirect); c.Packets != 0 {
		t.Errorf("node-bound traffic was redirected: %+v", c)
	}

	e.MustDel(p, "pod")
	e.AssertClean()
}

// TestDatapathAntiSpoofIP sends UDP from inside a pod with source addresses
// that are not the pod's: a foreign address and another pod's address, over
// both families. None may reach the node; all are counted as drop_spoof_ip;
// the pod's own traffic still flows.
func TestDatapathAntiSpoofIP(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "pod-a")
	e.CleanupDel(b, "pod-b")
	ra := e.Add(a, "pod-a")
	rb := e.Add(b, "pod-b")
	a4, a6 := testenv.PodIPs(t, ra)
	b4, b6 := testenv.PodIPs(t, rb)
	_, aIdx := e.HostVeth("pod-a")
	m := e.Maps()

	cases := []struct {
		name        string
		spoof, real net.IP
		node        net.IP
		addr        string // to add to the pod's eth0 first; "" when already there
	}{
		{"v4 foreign", net.ParseIP("10.250.0.200"), a4, testenv.NodeIP4, "10.250.0.200/32"},
		{"v4 other pod", b4, a4, testenv.NodeIP4, b4.String() + "/32"},
		{"v6 foreign", net.ParseIP("fd00:250::200"), a6, testenv.NodeIP6, "fd00:250::200/128"},
		{"v6 other pod", b6, a6, testenv.NodeIP6, b6.String() + "/128"},
	}
	const n = 20
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			podAddrAdd(t, a, c.addr)
			ln := udpSocket(t, e.Node, c.node)
			dst := ln.LocalAddr().(*net.UDPAddr)
			spoofed := udpSocket(t, a, c.spoof)
			legit := udpSocket(t, a, c.real)

			before := counter(t, m, aIdx, maps.DirEgress, maps.ReasonDropSpoofIP)
			for i := 0; i < n; i++ {
				if _, err := spoofed.WriteToUDP([]byte("spoof"), dst); err != nil {
					t.Fatalf("send spoofed datagram: %v", err)
				}
			}
			if _, err := legit.WriteToUDP([]byte("legit"), dst); err != nil {
				t.Fatalf("send legit datagram: %v", err)
			}
			got, sawMarker := udpReceived(ln, "legit")
			if !sawMarker {
				t.Errorf("legit datagram from %s after the spoofed ones never reached the node (got %q)\n  %s",
					c.real, got, dumpCounters(m, aIdx))
			}
			for _, g := range got {
				if g != "legit" {
					t.Errorf("node received a datagram with spoofed source %s: %q", c.spoof, g)
					break
				}
			}
			after := counter(t, m, aIdx, maps.DirEgress, maps.ReasonDropSpoofIP)
			if after.Packets-before.Packets < n {
				t.Errorf("drop_spoof_ip grew by %d, want >= %d\n  %s", after.Packets-before.Packets, n, dumpCounters(m, aIdx))
			}
			// Explicit source: with a second address on eth0 the kernel may
			// pick the spoofed one for an unbound socket.
			if err := testenv.PingFrom(a, c.real, c.node, 2); err != nil {
				t.Errorf("legit traffic after spoofing: %v", err)
			}
		})
	}
	// The spoofed pod-b addresses must not have diverted pod-b's traffic.
	if err := testenv.Ping(e.Node, b4, 1); err != nil {
		t.Error(err)
	}
	if err := testenv.Ping(e.Node, b6, 1); err != nil {
		t.Error(err)
	}

	e.MustDel(a, "pod-a")
	e.MustDel(b, "pod-b")
	e.AssertClean()
}

// TestDatapathMACLearned changes the pod's MAC, first leaving the kernel to
// re-resolve the gateway (a MAC change flushes every neighbour of the device,
// PERMANENT ones included), then with the gateway neighbours put back. On a
// veth the MAC authenticates nothing (the source IP is checked against the
// interface), so the datapath follows it: nothing is dropped as
// drop_spoof_mac and the links entry holds the pod's current MAC. (Issue 12
// replaced the drop: a chained tuning plugin cut pods off; see
// TestIntegrityMACChange.)
func TestDatapathMACLearned(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := e.NewPod()
	e.CleanupDel(p, "pod")
	e.Add(p, "pod")
	_, idx := e.HostVeth("pod")
	m := e.Maps()

	var orig net.HardwareAddr
	podLink(t, p, func(l netlink.Link) error { orig = l.Attrs().HardwareAddr; return nil })
	var gwNeighs []netlink.Neigh
	for _, n := range podNeighs(t, p) {
		if n.State == netlink.NUD_PERMANENT {
			gwNeighs = append(gwNeighs, n)
		}
	}
	if len(gwNeighs) != 2 {
		t.Fatalf("pod has permanent neighbours %v, want one gateway per family", gwNeighs)
	}
	setMAC := func(mac net.HardwareAddr, restoreNeighs bool) {
		t.Helper()
		podLink(t, p, func(l netlink.Link) error {
			if err := netlink.LinkSetHardwareAddr(l, mac); err != nil {
				return err
			}
			if restoreNeighs {
				for _, n := range gwNeighs {
					if err := netlink.NeighSet(&n); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	learned := func() string {
		li, err := m.Links().Lookup(idx)
		if err != nil {
			return err.Error()
		}
		return net.HardwareAddr(li.Mac[:]).String()
	}
	first := net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x20, 0x30}
	second := net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x20, 0x31}
	for _, c := range []struct {
		mac     net.HardwareAddr
		restore bool
	}{{first, false}, {second, true}, {orig, true}} {
		setMAC(c.mac, c.restore)
		for _, ip := range []net.IP{testenv.NodeIP4, testenv.NodeIP6} {
			if err := testenv.Ping(p, ip, 2); err != nil {
				t.Errorf("MAC %s (gateway neighbours restored: %v): %v\n  %s", c.mac, c.restore, err, dumpCounters(m, idx))
			}
		}
		if got := learned(); got != c.mac.String() {
			t.Errorf("cni_links holds %s, the pod has %s", got, c.mac)
		}
	}
	if got := counter(t, m, idx, maps.DirEgress, maps.ReasonDropSpoofMAC).Packets; got != 0 {
		t.Errorf("drop_spoof_mac counted %d packets of a pod that only changed its MAC", got)
	}

	e.MustDel(p, "pod")
	e.AssertClean()
}

// TestDatapathGatewayResolvable: a pod whose neighbour table lost the static
// gateway entries must still reach the node by resolving the gateway the
// result names with ARP (IPv4) and neighbour discovery (IPv6), as any IP host
// (or a VM runtime that configures a guest from the CNI result) does. The
// kernel flushes every neighbour of a device, PERMANENT ones included, when
// its MAC changes; changing it and changing it back is the trigger here.
func TestDatapathGatewayResolvable(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := e.NewPod()
	e.CleanupDel(p, "pod")
	e.Add(p, "pod")

	podLink(t, p, func(l netlink.Link) error {
		orig := l.Attrs().HardwareAddr
		tmp := append(net.HardwareAddr(nil), orig...)
		tmp[5] ^= 0x01
		if err := netlink.LinkSetHardwareAddr(l, tmp); err != nil {
			return err
		}
		return netlink.LinkSetHardwareAddr(l, orig)
	})
	for _, n := range podNeighs(t, p) {
		if n.State == netlink.NUD_PERMANENT {
			t.Logf("note: permanent neighbour %s survived the MAC change", n.IP)
		}
	}
	_, idx := e.HostVeth("pod")
	m := e.Maps()
	for _, ip := range []net.IP{testenv.NodeIP4, testenv.NodeIP6} {
		if err := testenv.Ping(p, ip, 2); err != nil {
			var ns []string
			for _, n := range podNeighs(t, p) {
				ns = append(ns, fmt.Sprintf("%s %s %s", n.IP, neighState(n.State), n.HardwareAddr))
			}
			t.Errorf("pod with its own MAC cannot reach the node once its gateway neighbour is gone: %v"+
				"\n  pod neighbours: %s\n  host veth counters: %s", err, strings.Join(ns, "; "), dumpCounters(m, idx))
		}
	}

	e.MustDel(p, "pod")
	e.AssertClean()
}
