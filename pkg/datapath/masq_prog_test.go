package datapath

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// The masquerade's egress in cni_to_uplink on hand-made frames
// (BPF_PROG_TEST_RUN): what it rewrites, what it leaves alone, and the
// reply cni_from_uplink translates back. test/integration's masquerade
// tests show the same with real traffic off a node.

// inNodeNetns moves the test, on its locked thread, into a netns of its
// own whose FIB makes the node's addresses the source towards anywhere
// (nodeIP/24 and nodeIP6/64 on a veth as its uplink, default routes through it), with
// forwarding on as on a node: masq_source's BPF_FIB_LOOKUP_SRC then
// answers the same on every machine. The thread goes back at cleanup.
func inNodeNetns(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	mine, err := netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: it dies with the goroutine.
			t.Errorf("back to the test's netns: %v", err)
			return
		}
		mine.Close()
		orig.Close()
		runtime.UnlockOSThread()
	})
	for _, f := range []string{"/proc/sys/net/ipv4/conf/all/forwarding", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		must(t, os.WriteFile(f, []byte("1"), 0o644))
	}
	lo, err := netlink.LinkByName("lo")
	must(t, err)
	must(t, netlink.LinkSetUp(lo))
	up := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "up0p"}
	must(t, netlink.LinkAdd(up))
	peer, err := netlink.LinkByName("up0p")
	must(t, err)
	must(t, netlink.LinkSetUp(peer))
	must(t, netlink.LinkSetUp(up))
	for _, a := range []string{nodeIP.String() + "/24", nodeIP6.String() + "/64"} {
		addr, err := netlink.ParseAddr(a)
		must(t, err)
		addr.Flags = unix.IFA_F_NODAD
		must(t, netlink.AddrAdd(up, addr))
	}
	for _, gw := range []net.IP{net.ParseIP("192.0.2.254"), net.ParseIP("fd00:1::fe")} {
		must(t, netlink.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: gw}))
	}
}

// TestToUplinkMasquerade: a masquerading pod's packets to a destination
// outside the cluster leave the uplink with the node's address and a port
// of the masquerade (checksums valid), IPv4 and IPv6, TCP and UDP; the
// peer's reply comes back to the pod through cni_from_uplink. Left as they
// are: packets of a pod without ipMasq, to a cluster CIDR, with a pod's
// source but from another interface than its host veth, sent by the node
// itself, and a TCP segment of no known flow that is no SYN.
func TestToUplinkMasquerade(t *testing.T) {
	inNodeNetns(t)
	dp := hpDatapath(t)
	progs, err := loadPrograms(dp.PinRoot, dp.Maps, nodeHookPrograms(), loadMissing)
	must(t, err)
	defer closePrograms(progs)
	out, in := progs["cni_to_uplink"], progs["cni_from_uplink"]
	mq := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, maps.EndpointFlagMasq)
	must(t, putEndpoint(dp.Maps, podIP, mq))
	must(t, putEndpoint(dp.Maps, podIP6, mq))
	must(t, mapstest.PutClusterCIDR(dp.Maps, netip.MustParsePrefix("10.9.0.0/16")))

	for _, c := range []struct {
		name         string
		proto        byte
		pod, far, at net.IP
	}{
		{"IPv4 TCP", protoTCP, podIP, farIP, nodeIP},
		{"IPv4 UDP", protoUDP, podIP, farIP, nodeIP},
		{"IPv6 TCP", protoTCP, podIP6, farIP6, nodeIP6},
		{"IPv6 UDP", protoUDP, podIP6, farIP6, nodeIP6},
	} {
		ret, o := testRunOut(t, out, packet(podMAC, c.proto, c.pod, c.far, 40020, 443, synFlag), loIfindex)
		p := parse(t, o)
		if ret != actNext || !p.src.Equal(c.at) || p.sport < 1024 || !p.dst.Equal(c.far) || p.dport != 443 || !p.l3ok || !p.l4ok {
			t.Fatalf("%s out: verdict %d, %s:%d -> %s:%d (checksums %v/%v); want on (%d) from %s, a masquerade port, to %s:443",
				c.name, ret, p.src, p.sport, p.dst, p.dport, p.l3ok, p.l4ok, actNext, c.at, c.far)
		}
		ret, o = testRunOut(t, in, packet(remoteMAC, c.proto, c.far, c.at, 443, p.sport, synFlag|ackFlag), 0)
		r := parse(t, o)
		if ret == actShot || !r.dst.Equal(c.pod) || r.dport != 40020 || !r.src.Equal(c.far) || !r.l3ok || !r.l4ok {
			t.Fatalf("%s reply: verdict %d, %s:%d -> %s:%d (checksums %v/%v); want it to the pod %s:40020",
				c.name, ret, r.src, r.sport, r.dst, r.dport, r.l3ok, r.l4ok, c.pod)
		}
	}

	plain := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)
	for _, c := range []struct {
		name    string
		frame   []byte
		ingress uint32
		setup   func()
	}{
		{"to a cluster CIDR", packet(podMAC, protoTCP, podIP, net.ParseIP("10.9.7.7"), 40021, 443, synFlag), loIfindex, nil},
		{"from another interface than the pod's", packet(podMAC, protoTCP, podIP, farIP, 40022, 443, synFlag), dstIfindex, nil},
		{"sent by the node", packet(podMAC, protoTCP, podIP, farIP, 40023, 443, synFlag), 0, nil},
		{"TCP of no known flow, no SYN", packet(podMAC, protoTCP, podIP, farIP, 40024, 443, ackFlag), loIfindex, nil},
		{"a pod without ipMasq", packet(podMAC, protoTCP, podIP, farIP, 40025, 443, synFlag), loIfindex,
			func() { must(t, putEndpoint(dp.Maps, podIP, plain)) }},
		{"a pod without ipMasq, IPv6", packet(podMAC, protoUDP, podIP6, farIP6, 40026, 443, 0), loIfindex,
			func() { must(t, putEndpoint(dp.Maps, podIP6, plain)) }},
	} {
		if c.setup != nil {
			c.setup()
		}
		ret, o := testRunOut(t, out, append([]byte(nil), c.frame...), c.ingress)
		if ret != actNext || !bytes.Equal(o, c.frame) {
			p := parse(t, o)
			t.Fatalf("%s: verdict %d, %s:%d -> %s:%d; want on (%d) untouched", c.name, ret, p.src, p.sport, p.dst, p.dport, actNext)
		}
	}
}
