package datapath

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// These tests run the compiled programs on hand-made frames with
// BPF_PROG_TEST_RUN: every verdict and rewrite of from_container, without
// namespaces. The integration tests in test/ prove the same with real traffic.

const (
	actOK       = 0
	actShot     = 2
	actRedirect = 7
	actNext     = 0xffffffff // TCX_NEXT (-1): on to the next tcx program, or the stack
	loIfindex   = 1          // test runs need a real device; the endpoint "lives" on lo
	dstIfindex  = 4242
)

var (
	podMAC  = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xaa}
	hostMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
	dstMAC  = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xbb}
	dstHost = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x22}
	// groupMAC has the group bit: no host sends from it.
	groupMAC = net.HardwareAddr{0x03, 0, 0, 0, 0, 0xcc}
	podIP    = net.ParseIP("10.9.0.2").To4()
	dstIP    = net.ParseIP("10.9.0.3").To4()
	podIP6   = net.ParseIP("fd00:9::2")
	gwIP     = net.ParseIP("10.9.0.1").To4()
	gwIP6    = net.ParseIP("fd00:9::1")
)

// requireRoot skips a test that loads BPF programs when not root, but
// fails it under CI, which runs as root: a skip there would hide a failure.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root; CI runs as root")
		}
		t.Skip("needs root (loads BPF programs)")
	}
}

func testDatapath(t testing.TB) *Datapath {
	t.Helper()
	requireRoot(t)
	if err := EnsureBPFFS(BPFFSRoot); err != nil {
		t.Fatal(err)
	}
	// One flat directory, also for subtests ("/" in the name).
	dir := filepath.Join(BPFFSRoot, fmt.Sprintf("ebpf-cni-unit-%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), os.Getpid()))
	os.RemoveAll(dir)
	t.Cleanup(func() { os.RemoveAll(dir) })
	dp, err := Ensure(dir, maps.DefaultSizing)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dp.Close)
	must(t, dp.Maps.Links().Put(loIfindex, maps.NewLinkInfo(podMAC, hostMAC)))
	must(t, putEndpoint(dp.Maps, podIP, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)))
	must(t, putEndpoint(dp.Maps, podIP6, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)))
	// A second pod behind another host veth. Test runs return the redirect
	// verdict without delivering, so the ifindex need not exist.
	must(t, putEndpoint(dp.Maps, dstIP, maps.NewEndpointInfo(dstIfindex, dstMAC, dstHost)))
	return dp
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func eth(src net.HardwareAddr, proto uint16) []byte {
	b := make([]byte, 14)
	copy(b[0:6], hostMAC)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], proto)
	return b
}

func csum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func ipv4(src, dst net.IP, ttl uint8) []byte {
	h := make([]byte, 20+8)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(len(h)))
	h[8] = ttl
	h[9] = 17 // UDP
	copy(h[12:16], src.To4())
	copy(h[16:20], dst.To4())
	binary.BigEndian.PutUint16(h[10:], csum(h[:20]))
	return h
}

func ipv6(src, dst net.IP) []byte {
	h := make([]byte, 40+8)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], 8)
	h[6] = 17
	h[7] = 64
	copy(h[8:24], src.To16())
	copy(h[24:40], dst.To16())
	return h
}

// icmp6 is an IPv6 header, the extension headers whose types ext lists
// (8 bytes each; 0 hop-by-hop, 60 destination options), and an ICMPv6
// message of the given type (checksum not filled: the program does not check it).
func icmp6(src net.IP, ext []byte, typ byte) []byte {
	h := make([]byte, 40)
	h[0], h[7] = 0x60, 255
	copy(h[8:24], src.To16())
	copy(h[24:40], net.ParseIP("ff02::1").To16())
	next := &h[6]
	for _, e := range ext {
		*next = e
		x := make([]byte, 8)
		h = append(h, x...)
		next = &h[len(h)-8]
	}
	*next = 58
	h = append(h, typ, 0, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint16(h[4:], uint16(len(h)-40))
	return h
}

// icmp4 is an IPv4 header and an ICMP message of the given type.
func icmp4(src, dst net.IP, typ byte) []byte {
	h := ipv4(src, dst, 64)
	h[9] = 1
	binary.BigEndian.PutUint16(h[10:], 0)
	binary.BigEndian.PutUint16(h[10:], csum(h[:20]))
	h[20] = typ
	return h
}

func arp(sha net.HardwareAddr, spa net.IP, tpa ...net.IP) []byte {
	b := make([]byte, 28)
	if len(tpa) > 0 {
		copy(b[24:28], tpa[0].To4())
	}
	binary.BigEndian.PutUint16(b[0:], 1)
	binary.BigEndian.PutUint16(b[2:], 0x0800)
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:], 1)
	copy(b[8:14], sha)
	copy(b[14:18], spa.To4())
	return b
}

func counter(t *testing.T, dp *Datapath, dir maps.Dir, r maps.Reason) uint64 {
	t.Helper()
	idx := loIfindex
	if dir == maps.DirIngress && r == maps.ReasonRedirect {
		idx = dstIfindex
	}
	c, err := dp.Maps.Stats().Counters(idx)
	if err != nil {
		t.Fatal(err)
	}
	return c[maps.CounterKey{Dir: dir, Reason: r}].Packets
}

func TestFromContainerVerdicts(t *testing.T) {
	dp := testDatapath(t)
	other := net.ParseIP("192.0.2.9")
	cases := []struct {
		name   string
		frame  []byte
		want   uint32
		reason maps.Reason
	}{
		{"own IPv4 to the stack", append(eth(podMAC, 0x0800), ipv4(podIP, other, 64)...), actOK, maps.ReasonForward},
		{"spoofed IPv4 source", append(eth(podMAC, 0x0800), ipv4(net.ParseIP("10.9.0.99"), other, 64)...), actShot, maps.ReasonDropSpoofIP},
		{"another pod's IPv4 source", append(eth(podMAC, 0x0800), ipv4(dstIP, other, 64)...), actShot, maps.ReasonDropSpoofIP},
		{"group source MAC", append(eth(groupMAC, 0x0800), ipv4(podIP, other, 64)...), actShot, maps.ReasonDropSpoofMAC},
		{"own IPv6", append(eth(podMAC, 0x86dd), ipv6(podIP6, net.ParseIP("fd00:1::1"))...), actOK, maps.ReasonForward},
		{"spoofed IPv6", append(eth(podMAC, 0x86dd), ipv6(net.ParseIP("fd00:9::99"), net.ParseIP("fd00:1::1"))...), actShot, maps.ReasonDropSpoofIP},
		{"IPv6 link-local, own MAC", append(eth(podMAC, 0x86dd), ipv6(net.ParseIP("fe80::1"), net.ParseIP("ff02::2"))...), actOK, maps.ReasonForward},
		{"IPv6 link-local, group source MAC", append(eth(groupMAC, 0x86dd), ipv6(net.ParseIP("fe80::1"), net.ParseIP("ff02::2"))...), actShot, maps.ReasonDropSpoofMAC},
		{"router advertisement", append(eth(podMAC, 0x86dd), icmp6(net.ParseIP("fe80::1"), nil, 134)...), actShot, maps.ReasonDropRouterMsg},
		{"router advertisement behind two option headers", append(eth(podMAC, 0x86dd), icmp6(net.ParseIP("fe80::1"), []byte{0, 60}, 134)...), actShot, maps.ReasonDropRouterMsg},
		{"redirect from the pod's address", append(eth(podMAC, 0x86dd), icmp6(podIP6, nil, 137)...), actShot, maps.ReasonDropRouterMsg},
		{"neighbour advertisement", append(eth(podMAC, 0x86dd), icmp6(net.ParseIP("fe80::1"), []byte{60}, 136)...), actOK, maps.ReasonForward},
		{"ICMP redirect", append(eth(podMAC, 0x0800), icmp4(podIP, other, 5)...), actShot, maps.ReasonDropRouterMsg},
		{"ICMP echo", append(eth(podMAC, 0x0800), icmp4(podIP, other, 8)...), actOK, maps.ReasonForward},
		{"gratuitous ARP", append(eth(podMAC, 0x0806), arp(podMAC, podIP, podIP)...), actOK, maps.ReasonForward},
		{"ARP for the gateway", append(eth(podMAC, 0x0806), arp(podMAC, podIP, gwIP)...), actRedirect, maps.ReasonNeighReply},
		{"ARP probe", append(eth(podMAC, 0x0806), arp(podMAC, net.IPv4zero)...), actOK, maps.ReasonForward},
		{"ARP claiming another IP", append(eth(podMAC, 0x0806), arp(podMAC, dstIP)...), actShot, maps.ReasonDropSpoofIP},
		{"ARP with foreign sender MAC", append(eth(podMAC, 0x0806), arp(dstMAC, podIP)...), actShot, maps.ReasonDropSpoofMAC},
		{"unknown ethertype", append(eth(podMAC, 0x88cc), make([]byte, 46)...), actShot, maps.ReasonDropProto},
		// Test runs refuse IPv4/IPv6 frames shorter than their header; ARP shows the check.
		{"truncated ARP", append(eth(podMAC, 0x0806), arp(podMAC, podIP)[:10]...), actShot, maps.ReasonDropMalform},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := counter(t, dp, maps.DirEgress, c.reason)
			got, _ := run(t, dp.FromContainer, c.frame)
			if got != c.want {
				t.Fatalf("verdict %d, want %d", got, c.want)
			}
			if after := counter(t, dp, maps.DirEgress, c.reason); after != before+1 {
				t.Fatalf("counter %s went %d -> %d, want +1", c.reason, before, after)
			}
		})
	}
}

func TestFromContainerRedirectRewrites(t *testing.T) {
	dp := testDatapath(t)
	frame := append(eth(podMAC, 0x0800), ipv4(podIP, dstIP, 64)...)
	beforeIn := counter(t, dp, maps.DirIngress, maps.ReasonRedirect)
	got, out := run(t, dp.FromContainer, frame)
	if got != actRedirect {
		t.Fatalf("verdict %d, want redirect (%d)", got, actRedirect)
	}
	if d, s := net.HardwareAddr(out[0:6]), net.HardwareAddr(out[6:12]); d.String() != dstMAC.String() || s.String() != dstHost.String() {
		t.Fatalf("MACs %s <- %s, want %s <- %s", d, s, dstMAC, dstHost)
	}
	ip := out[14:34]
	if ip[8] != 63 {
		t.Fatalf("TTL %d, want 63", ip[8])
	}
	if csum(ip) != 0 {
		t.Fatalf("IPv4 header checksum is wrong after the TTL decrement")
	}
	if after := counter(t, dp, maps.DirIngress, maps.ReasonRedirect); after != beforeIn+1 {
		t.Fatalf("destination's ingress redirect counter went %d -> %d", beforeIn, after)
	}

	// TTL 1 must not be forwarded by us: the stack answers with time exceeded.
	got, _ = run(t, dp.FromContainer, append(eth(podMAC, 0x0800), ipv4(podIP, dstIP, 1)...))
	if got != actOK {
		t.Fatalf("TTL 1: verdict %d, want pass to stack", got)
	}
}

func TestToContainerCounts(t *testing.T) {
	dp := testDatapath(t)
	before := counter(t, dp, maps.DirIngress, maps.ReasonForward)
	got, _ := run(t, dp.ToContainer, append(eth(hostMAC, 0x0800), ipv4(net.ParseIP("192.0.2.1"), podIP, 64)...))
	if got != actOK {
		t.Fatalf("verdict %d", got)
	}
	if after := counter(t, dp, maps.DirIngress, maps.ReasonForward); after != before+1 {
		t.Fatalf("counter went %d -> %d", before, after)
	}
}

// TestMACLearned: a pod sending from another MAC is followed, not dropped:
// the links entry and the address's entry take the new MAC; the other
// address's entry keeps the MAC it was last seen from; link-local traffic
// updates the links entry; to_container addresses the stack's packets to
// the links entry's MAC and leaves group destinations alone.
func TestMACLearned(t *testing.T) {
	dp := testDatapath(t)
	newMAC := net.HardwareAddr{0x02, 0, 0, 0, 0, 0xdd}
	macs := func() (link, ep4, ep6 string) {
		li, err := dp.Maps.Links().Lookup(loIfindex)
		must(t, err)
		e4, err := dp.Maps.Endpoints().Lookup(podIP)
		must(t, err)
		e6, err := dp.Maps.Endpoints().Lookup(podIP6)
		must(t, err)
		return net.HardwareAddr(li.Mac[:]).String(), net.HardwareAddr(e4.Mac[:]).String(), net.HardwareAddr(e6.Mac[:]).String()
	}
	if got, _ := run(t, dp.FromContainer, append(eth(newMAC, 0x0800), ipv4(podIP, net.ParseIP("192.0.2.9"), 64)...)); got != actOK {
		t.Fatalf("IPv4 from a new MAC: verdict %d, want pass", got)
	}
	if l, e4, e6 := macs(); l != newMAC.String() || e4 != newMAC.String() || e6 != podMAC.String() {
		t.Fatalf("after IPv4 from %s: links %s, IPv4 entry %s, IPv6 entry %s", newMAC, l, e4, e6)
	}
	// The stack's packets go to the learned MAC, whatever the node's neighbour said.
	_, out := run(t, dp.ToContainer, append(ethTo(podMAC, hostMAC, 0x0800), ipv4(net.ParseIP("192.0.2.1"), podIP, 64)...))
	if got := net.HardwareAddr(out[0:6]); got.String() != newMAC.String() {
		t.Errorf("to_container sent to %s, want the learned %s", got, newMAC)
	}
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	_, out = run(t, dp.ToContainer, append(ethTo(bcast, hostMAC, 0x0806), arp(hostMAC, net.ParseIP("192.0.2.1"), podIP)...))
	if got := net.HardwareAddr(out[0:6]); got.String() != bcast.String() {
		t.Errorf("to_container rewrote a broadcast destination to %s", got)
	}
	// Link-local traffic (neighbour discovery) moves the links entry only.
	if got, _ := run(t, dp.FromContainer, append(eth(podMAC, 0x86dd), ipv6(net.ParseIP("fe80::1"), net.ParseIP("ff02::2"))...)); got != actOK {
		t.Fatalf("link-local from the first MAC again: verdict %d", got)
	}
	if l, e4, _ := macs(); l != podMAC.String() || e4 != newMAC.String() {
		t.Fatalf("after link-local from %s: links %s, IPv4 entry %s", podMAC, l, e4)
	}
	if c := counter(t, dp, maps.DirEgress, maps.ReasonDropSpoofMAC); c != 0 {
		t.Errorf("drop_spoof_mac counted %d", c)
	}
}

func ethTo(dst, src net.HardwareAddr, proto uint16) []byte {
	b := eth(src, proto)
	copy(b[0:6], dst)
	return b
}

func TestEnsureIsIdempotentAndRejectsForeignLayout(t *testing.T) {
	dp := testDatapath(t)
	again, err := Ensure(dp.PinRoot, maps.DefaultSizing)
	if err != nil {
		t.Fatal(err)
	}
	again.Close()

	// A map of another layout pinned where ours belongs must be refused.
	dir := filepath.Join(BPFFSRoot, fmt.Sprintf("ebpf-cni-unit-foreign-%d", os.Getpid()))
	os.RemoveAll(dir)
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.MkdirAll(MapsDir(dir), 0o700))
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	must(t, err)
	defer m.Close()
	must(t, m.Pin(filepath.Join(MapsDir(dir), "cni_endpoints")))
	if _, err := Ensure(dir, maps.DefaultSizing); err == nil {
		t.Fatal("Ensure reused a pinned map of another layout")
	}
}

func TestARPReply(t *testing.T) {
	dp := testDatapath(t)
	got, out := run(t, dp.FromContainer, append(eth(podMAC, 0x0806), arp(podMAC, podIP, gwIP)...))
	if got != actRedirect {
		t.Fatalf("verdict %d, want redirect back to the pod", got)
	}
	a := out[14:]
	switch {
	case net.HardwareAddr(out[0:6]).String() != podMAC.String() || net.HardwareAddr(out[6:12]).String() != hostMAC.String():
		t.Fatalf("ethernet %s <- %s", net.HardwareAddr(out[0:6]), net.HardwareAddr(out[6:12]))
	case binary.BigEndian.Uint16(a[6:]) != 2:
		t.Fatalf("op %d, want reply", binary.BigEndian.Uint16(a[6:]))
	case net.HardwareAddr(a[8:14]).String() != hostMAC.String() || !net.IP(a[14:18]).Equal(gwIP):
		t.Fatalf("sender %s %s, want %s %s", net.HardwareAddr(a[8:14]), net.IP(a[14:18]), hostMAC, gwIP)
	case net.HardwareAddr(a[18:24]).String() != podMAC.String() || !net.IP(a[24:28]).Equal(podIP):
		t.Fatalf("target %s %s", net.HardwareAddr(a[18:24]), net.IP(a[24:28]))
	}
	// The pod asking for its own address (duplicate detection) gets no answer from us.
	if got, _ := run(t, dp.FromContainer, append(eth(podMAC, 0x0806), arp(podMAC, net.IPv4zero, podIP)...)); got != actOK {
		t.Fatalf("ARP probe for the pod's own IP: verdict %d, want pass", got)
	}
}

// neighSolicit builds an NS from src for target with a source link-layer option.
func neighSolicit(src, dst, target net.IP) []byte {
	ip := make([]byte, 40+32)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], 32)
	ip[6] = 58
	ip[7] = 255
	copy(ip[8:24], src.To16())
	copy(ip[24:40], dst.To16())
	icmp := ip[40:]
	icmp[0] = 135
	copy(icmp[8:24], target.To16())
	icmp[24], icmp[25] = 1, 1
	copy(icmp[26:32], podMAC)
	binary.BigEndian.PutUint16(icmp[2:], icmp6Checksum(src, dst, icmp))
	return ip
}

func icmp6Checksum(src, dst net.IP, msg []byte) uint16 {
	b := make([]byte, 0, 40+len(msg))
	b = append(b, src.To16()...)
	b = append(b, dst.To16()...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(msg)))
	b = append(b, 0, 0, 0, 58)
	b = append(b, msg...)
	return csum(b)
}

func TestNeighborAdvertisement(t *testing.T) {
	dp := testDatapath(t)
	ll := net.ParseIP("fe80::aa")
	solicited := net.ParseIP("ff02::1:ff00:1")
	for _, src := range []net.IP{ll, podIP6} {
		frame := append(eth(podMAC, 0x86dd), neighSolicit(src, solicited, gwIP6)...)
		got, out := run(t, dp.FromContainer, frame)
		if got != actRedirect {
			t.Fatalf("NS from %s: verdict %d, want redirect", src, got)
		}
		ip := out[14:]
		na := ip[40:72]
		switch {
		case net.HardwareAddr(out[0:6]).String() != podMAC.String() || net.HardwareAddr(out[6:12]).String() != hostMAC.String():
			t.Fatalf("ethernet %s <- %s", net.HardwareAddr(out[0:6]), net.HardwareAddr(out[6:12]))
		case !net.IP(ip[8:24]).Equal(gwIP6) || !net.IP(ip[24:40]).Equal(src) || ip[7] != 255:
			t.Fatalf("IPv6 %s -> %s hop limit %d", net.IP(ip[8:24]), net.IP(ip[24:40]), ip[7])
		case na[0] != 136 || !net.IP(na[8:24]).Equal(gwIP6) || na[24] != 2 || net.HardwareAddr(na[26:32]).String() != hostMAC.String():
			t.Fatalf("not an NA for %s with the host MAC: % x", gwIP6, na)
		case na[4]&0x60 != 0x60:
			t.Fatalf("NA flags %#x lack solicited+override", na[4])
		case icmp6Checksum(gwIP6, src, na) != 0:
			t.Fatalf("NA checksum does not verify")
		}
	}
	// Duplicate address detection (source ::) and link-local targets are left to the kernel.
	for _, c := range []struct{ src, target net.IP }{{net.IPv6unspecified, podIP6}, {ll, net.ParseIP("fe80::1")}, {podIP6, podIP6}} {
		frame := append(eth(podMAC, 0x86dd), neighSolicit(c.src, solicited, c.target)...)
		if got, _ := run(t, dp.FromContainer, frame); got != actOK {
			t.Fatalf("NS from %s for %s: verdict %d, want pass", c.src, c.target, got)
		}
	}
}

// TestLeanOpenRefusesForeignLayout: the verbs' open (OpenLean, EnsureLean)
// refuses a map of another shape pinned where one of ours belongs (a
// hostile or buggy process, a build of another layout left in this
// layout's directory), as Ensure does, rather than handing the verb a map
// its writes would fail on part way or silently misuse.
func TestLeanOpenRefusesForeignLayout(t *testing.T) {
	for _, c := range []struct {
		name    string
		foreign func(ours *ebpf.Map) *ebpf.MapSpec
	}{
		{"key_size", func(*ebpf.Map) *ebpf.MapSpec {
			return &ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1}
		}},
		// Same key and value sizes, another type (entries evicted behind
		// the datapath's back): nothing but a shape check sees it.
		{"type", func(ours *ebpf.Map) *ebpf.MapSpec {
			return &ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: ours.KeySize(), ValueSize: ours.ValueSize(), MaxEntries: ours.MaxEntries()}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dp := testDatapath(t)
			spec := c.foreign(mapstest.Map(dp.Maps, "cni_endpoints"))
			p := filepath.Join(MapsDir(dp.PinRoot), "cni_endpoints")
			must(t, os.Remove(p))
			m, err := ebpf.NewMap(spec)
			must(t, err)
			must(t, m.Pin(p))
			m.Close()
			for _, v := range []struct {
				verb string
				open func() (*Datapath, error)
			}{
				{"OpenLean", func() (*Datapath, error) { return OpenLean(dp.PinRoot) }},
				{"EnsureLean", func() (*Datapath, error) { return EnsureLean(dp.PinRoot, maps.DefaultSizing) }},
			} {
				got, err := v.open()
				if err == nil {
					got.Close()
					t.Errorf("%s opened a cni_endpoints of type %s, key %d, value %d pinned at %s", v.verb, spec.Type, spec.KeySize, spec.ValueSize, p)
					continue
				}
				if !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "another layout") {
					t.Errorf("%s: %v; want an error naming %s and its other layout", v.verb, err, p)
				}
			}
		})
	}
}

// TestMissingMapPinReadopted: a map pin removed by hand (or another tool)
// while this build's pinned programs still use the map is pinned again
// from them by the next Ensure, not created anew: a new map would take the
// verbs' writes (a pod's link, endpoint) where no program reads.
func TestMissingMapPinReadopted(t *testing.T) {
	dp := testDatapath(t)
	p := filepath.Join(MapsDir(dp.PinRoot), "cni_links")
	info, err := mapstest.Map(dp.Maps, "cni_links").Info()
	must(t, err)
	want, _ := info.ID()
	must(t, os.Remove(p))
	for _, v := range []struct {
		verb string
		open func() (*Datapath, error)
	}{
		{"EnsureLean", func() (*Datapath, error) { return EnsureLean(dp.PinRoot, maps.DefaultSizing) }},
		{"Ensure", func() (*Datapath, error) { return Ensure(dp.PinRoot, maps.DefaultSizing) }},
	} {
		again, err := v.open()
		if err != nil {
			t.Fatalf("%s: %v", v.verb, err)
		}
		info, err := mapstest.Map(again.Maps, "cni_links").Info()
		must(t, err)
		if got, _ := info.ID(); got != want {
			t.Errorf("%s: cni_links pinned anew (map %d); the programs use map %d", v.verb, got, want)
		}
		again.Close()
	}
}

// run is testRun of a frame with no ingress interface: the verdict and the
// frame after it.
func run(t *testing.T, p *ebpf.Program, frame []byte) (uint32, []byte) {
	t.Helper()
	ret, _, out := testRun(t, p, frame, 0)
	return ret, out
}
