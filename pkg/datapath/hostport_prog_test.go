package datapath

import (
	"encoding/binary"
	"errors"
	"net"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// Unit tests of the hostPort NAT in cni_from_uplink and cni_from_container
// on hand-made frames (BPF_PROG_TEST_RUN). The socket hooks cannot be test
// run; test/hostport_test.go covers them with real sockets.

var (
	nodeIP    = net.ParseIP("192.0.2.1").To4()
	nodeIP6   = net.ParseIP("fd00:1::1")
	otherIP   = net.ParseIP("192.0.2.77").To4() // not a node address
	clientIP  = net.ParseIP("198.51.100.2").To4()
	clientIP6 = net.ParseIP("fd00:51::2")
	remoteMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xcc}
	dstIP6    = net.ParseIP("fd00:9::3")
)

const (
	protoTCP = 6
	protoUDP = 17
	synFlag  = 0x02
	ackFlag  = 0x10
)

// hpDatapath is testDatapath with hostPorts on: node addresses, mappings
// *:8080/tcp and *:8080/udp -> dst pod :80 (IPv4 and IPv6), 192.0.2.1:9090/tcp
// -> pod :90, and *:7000/tcp -> pod (the one behind lo) :70 for hairpin.
func hpDatapath(t *testing.T) *Datapath {
	t.Helper()
	dp := testDatapath(t)
	must(t, putEndpoint(dp.Maps, dstIP6, maps.NewEndpointInfo(dstIfindex, dstMAC, dstHost)))
	must(t, dp.Maps.Node().SyncIPs(map[string]int{nodeIP.String(): 1, nodeIP6.String(): 1}))
	for _, h := range []maps.HostPort{
		{Proto: protoTCP, HostPort: 8080, PodIP: dstIP, PodPort: 80, Ifindex: dstIfindex},
		{Proto: protoUDP, HostPort: 8080, PodIP: dstIP, PodPort: 80, Ifindex: dstIfindex},
		{IPv6: true, Proto: protoTCP, HostPort: 8080, PodIP: dstIP6, PodPort: 80, Ifindex: dstIfindex},
		{HostIP: nodeIP, Proto: protoTCP, HostPort: 9090, PodIP: dstIP, PodPort: 90, Ifindex: dstIfindex},
		{Proto: protoTCP, HostPort: 9090, PodIP: podIP, PodPort: 99, Ifindex: loIfindex},
		{Proto: protoTCP, HostPort: 7000, PodIP: podIP, PodPort: 70, Ifindex: loIfindex},
	} {
		must(t, dp.Maps.HostPorts().Insert(h))
	}
	must(t, dp.Maps.Node().Enable(1, 0, false))
	return dp
}

func uplinkProgram(t *testing.T, dp *Datapath) *ebpf.Program {
	t.Helper()
	progs, err := loadPrograms(dp.PinRoot, dp.Maps, nodeHookPrograms(), loadMissing)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closePrograms(progs) })
	return progs["cni_from_uplink"]
}

// l4 builds a TCP (flags) or UDP header with payload and a valid checksum
// over the pseudo-header of src and dst.
func l4(proto byte, src, dst net.IP, sport, dport uint16, flags byte, zeroUDPCsum bool) []byte {
	payload := []byte("data")
	var h []byte
	if proto == protoTCP {
		h = make([]byte, 20)
		h[12] = 5 << 4
		h[13] = flags
		binary.BigEndian.PutUint16(h[14:], 1000)
	} else {
		h = make([]byte, 8)
		binary.BigEndian.PutUint16(h[4:], uint16(8+len(payload)))
	}
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	seg := append(h, payload...)
	if proto == protoUDP && zeroUDPCsum {
		return seg
	}
	off := 16
	if proto == protoUDP {
		off = 6
	}
	binary.BigEndian.PutUint16(seg[off:], csum(pseudo(proto, src, dst, seg)))
	if proto == protoUDP && binary.BigEndian.Uint16(seg[off:]) == 0 {
		binary.BigEndian.PutUint16(seg[off:], 0xffff)
	}
	return seg
}

func pseudo(proto byte, src, dst net.IP, seg []byte) []byte {
	var b []byte
	if src.To4() != nil {
		b = append(b, src.To4()...)
		b = append(b, dst.To4()...)
		b = append(b, 0, proto)
		b = binary.BigEndian.AppendUint16(b, uint16(len(seg)))
	} else {
		b = append(b, src.To16()...)
		b = append(b, dst.To16()...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(seg)))
		b = append(b, 0, 0, 0, proto)
	}
	return append(b, seg...)
}

// packet builds an Ethernet frame carrying IPv4 or IPv6 and an L4 segment.
func packet(srcMAC net.HardwareAddr, proto byte, src, dst net.IP, sport, dport uint16, flags byte) []byte {
	seg := l4(proto, src, dst, sport, dport, flags, false)
	if src.To4() != nil {
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(seg)))
		ip[8] = 64
		ip[9] = proto
		copy(ip[12:16], src.To4())
		copy(ip[16:20], dst.To4())
		binary.BigEndian.PutUint16(ip[10:], csum(ip))
		return append(append(eth(srcMAC, 0x0800), ip...), seg...)
	}
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(seg)))
	ip[6] = proto
	ip[7] = 64
	copy(ip[8:24], src.To16())
	copy(ip[24:40], dst.To16())
	return append(append(eth(srcMAC, 0x86dd), ip...), seg...)
}

// parsed is what a test reads back from an output frame.
type parsed struct {
	dstMAC, srcMAC net.HardwareAddr
	src, dst       net.IP
	sport, dport   uint16
	ttl            byte
	l3ok, l4ok     bool
	l4csum         uint16
}

func parse(t *testing.T, f []byte) parsed {
	t.Helper()
	p := parsed{dstMAC: net.HardwareAddr(f[0:6]), srcMAC: net.HardwareAddr(f[6:12])}
	var proto byte
	var seg []byte
	if binary.BigEndian.Uint16(f[12:]) == 0x0800 {
		ip := f[14:34]
		p.src, p.dst = net.IP(ip[12:16]), net.IP(ip[16:20])
		p.ttl, proto = ip[8], ip[9]
		p.l3ok = csum(ip) == 0
		seg = f[34 : 14+int(binary.BigEndian.Uint16(ip[2:]))]
	} else {
		ip := f[14:54]
		p.src, p.dst = net.IP(ip[8:24]), net.IP(ip[24:40])
		p.ttl, proto = ip[7], ip[6]
		p.l3ok = true
		seg = f[54 : 54+int(binary.BigEndian.Uint16(ip[4:]))]
	}
	p.sport, p.dport = binary.BigEndian.Uint16(seg[0:]), binary.BigEndian.Uint16(seg[2:])
	off := 16
	if proto == protoUDP {
		off = 6
	}
	p.l4csum = binary.BigEndian.Uint16(seg[off:])
	p.l4ok = csum(pseudo(proto, p.src, p.dst, seg)) == 0
	return p
}

func runFrame(t *testing.T, p *ebpf.Program, frame []byte) (uint32, parsed) {
	t.Helper()
	ret, out := run(t, p, frame)
	return ret, parse(t, out)
}

func ctEntries(t *testing.T, dp *Datapath) []maps.Flow {
	t.Helper()
	f, err := dp.Maps.HostPorts().ListCT()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestUplinkDNAT(t *testing.T) {
	dp := hpDatapath(t)
	up := uplinkProgram(t, dp)
	for _, c := range []struct {
		name          string
		proto         byte
		client, node  net.IP
		pod           net.IP
		dport, podPrt uint16
	}{
		{"IPv4 TCP", protoTCP, clientIP, nodeIP, dstIP, 8080, 80},
		{"IPv4 UDP", protoUDP, clientIP, nodeIP, dstIP, 8080, 80},
		{"IPv6 TCP", protoTCP, clientIP6, nodeIP6, dstIP6, 8080, 80},
		{"hostIP beats wildcard", protoTCP, clientIP, nodeIP, dstIP, 9090, 90},
	} {
		t.Run(c.name, func(t *testing.T) {
			ret, p := runFrame(t, up, packet(remoteMAC, c.proto, c.client, c.node, 40000, c.dport, synFlag))
			if ret != actRedirect {
				t.Fatalf("verdict %d, want redirect into the pod", ret)
			}
			if !p.dst.Equal(c.pod) || p.dport != c.podPrt || !p.src.Equal(c.client) || p.sport != 40000 {
				t.Fatalf("%s:%d -> %s:%d, want %s:40000 -> %s:%d", p.src, p.sport, p.dst, p.dport, c.client, c.pod, c.podPrt)
			}
			if !p.l3ok || !p.l4ok {
				t.Fatalf("checksums after DNAT: IP ok %v, L4 ok %v", p.l3ok, p.l4ok)
			}
			if p.dstMAC.String() != dstMAC.String() || p.srcMAC.String() != dstHost.String() || p.ttl != 63 {
				t.Fatalf("MACs %s <- %s TTL %d, want %s <- %s 63", p.dstMAC, p.srcMAC, p.ttl, dstMAC, dstHost)
			}
			found := false
			for _, f := range ctEntries(t, dp) {
				if f.Pod.Addr().String() == c.pod.String() && f.Pod.Port() == c.podPrt && f.Client.Port() == 40000 &&
					f.Dialled.Addr().String() == c.node.String() && f.Dialled.Port() == c.dport && f.Ifindex == dstIfindex {
					found = true
				}
			}
			if !found {
				t.Fatalf("no cni_ct entry for the flow: %+v", ctEntries(t, dp))
			}
		})
	}
}

func TestUplinkLeavesOthersAlone(t *testing.T) {
	dp := hpDatapath(t)
	up := uplinkProgram(t, dp)
	for _, c := range []struct {
		name  string
		frame []byte
	}{
		{"unmapped port", packet(remoteMAC, protoTCP, clientIP, nodeIP, 40000, 8081, synFlag)},
		{"wildcard on a non-node address", packet(remoteMAC, protoTCP, clientIP, otherIP, 40000, 8080, synFlag)},
		{"hostIP mapping on another address", packet(remoteMAC, protoUDP, clientIP, otherIP, 40000, 9090, 0)},
		// A TCP segment other than a SYN of a flow never seen is somebody
		// else's: e.g. the reply to a node connection from a port that
		// happens to be a hostPort.
		{"TCP ACK of an unknown flow", packet(remoteMAC, protoTCP, clientIP, nodeIP, 40001, 8080, ackFlag)},
	} {
		t.Run(c.name, func(t *testing.T) {
			ret, out := run(t, up, c.frame)
			if ret != actNext {
				t.Fatalf("verdict %d, want TCX_NEXT (the next program, or the stack)", ret)
			}
			if string(out) != string(c.frame) {
				t.Fatalf("the frame was modified")
			}
		})
	}
	// Once the SYN is seen, the rest of the flow follows.
	if ret, _ := run(t, up, packet(remoteMAC, protoTCP, clientIP, nodeIP, 40001, 8080, synFlag)); ret != actRedirect {
		t.Fatalf("SYN: verdict %d", ret)
	}
	if ret, p := runFrame(t, up, packet(remoteMAC, protoTCP, clientIP, nodeIP, 40001, 8080, ackFlag)); ret != actRedirect || !p.dst.Equal(dstIP) {
		t.Fatalf("ACK after the SYN: verdict %d dst %s", ret, p.dst)
	}
	// Switched off (no hostPorts on the node): nothing is translated.
	zero := uint32(0)
	must(t, mapstest.Map(dp.Maps, "cni_hp_config").Put(&zero, &maps.NodeConfig{}))
	if ret, _ := run(t, up, packet(remoteMAC, protoTCP, clientIP, nodeIP, 40002, 8080, synFlag)); ret != actNext {
		t.Fatalf("hostPorts disabled: verdict %d, want TCX_NEXT", ret)
	}
}

func TestUplinkUDPZeroChecksum(t *testing.T) {
	dp := hpDatapath(t)
	up := uplinkProgram(t, dp)
	frame := packet(remoteMAC, protoUDP, clientIP, nodeIP, 40000, 8080, 0)
	binary.BigEndian.PutUint16(frame[34+6:], 0) // "no checksum"
	ret, p := runFrame(t, up, frame)
	if ret != actRedirect || !p.dst.Equal(dstIP) || p.dport != 80 {
		t.Fatalf("verdict %d, %s:%d", ret, p.dst, p.dport)
	}
	if p.l4csum != 0 {
		t.Fatalf("UDP checksum %#x, want it left 0", p.l4csum)
	}
}

// TestFromContainerReply: the reply of a translated flow gets its source set
// back to what the client dialled. Here the client is another pod of the
// node (so the verdict is a redirect to it, independent of routing).
func TestFromContainerReply(t *testing.T) {
	dp := hpDatapath(t)
	// The pod behind lo has mappings.
	info := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)
	info.Flags |= maps.EndpointFlagHostPort
	must(t, putEndpoint(dp.Maps, podIP, info))
	// A flow dstIP:5555 -> node:7000 -> podIP:70, as a hairpin from the
	// other pod creates it (test runs all happen "on" lo, so write it).
	k, v := ctFlow(podIP, 70, dstIP, 5555, nodeIP, 7000, loIfindex)
	must(t, putCT(dp.Maps, k, v))

	reply := packet(podMAC, protoTCP, podIP, dstIP, 70, 5555, synFlag|ackFlag)
	ret, p := runFrame(t, dp.FromContainer, reply)
	if ret != actRedirect {
		t.Fatalf("reply: verdict %d, want redirect to the client pod", ret)
	}
	if !p.src.Equal(nodeIP) || p.sport != 7000 || !p.dst.Equal(dstIP) || p.dport != 5555 || !p.l3ok || !p.l4ok {
		t.Fatalf("reply %s:%d -> %s:%d (csum %v/%v), want %s:7000 -> %s:5555", p.src, p.sport, p.dst, p.dport, p.l3ok, p.l4ok, nodeIP, dstIP)
	}
	if p.dstMAC.String() != dstMAC.String() {
		t.Fatalf("reply to MAC %s, want the client pod's %s", p.dstMAC, dstMAC)
	}

	// A pod without the hostPort flag is never looked up in cni_ct.
	must(t, putEndpoint(dp.Maps, podIP, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)))
	ret, p = runFrame(t, dp.FromContainer, reply)
	if ret != actRedirect || !p.src.Equal(podIP) || p.sport != 70 {
		t.Fatalf("flagless pod: verdict %d src %s:%d, want untranslated", ret, p.src, p.sport)
	}
}

// TestFromContainerSelfHairpin: a pod reaching its own hostPort is DNATed to
// itself and SNATed to the dialled address; its reply is translated back.
func TestFromContainerSelfHairpin(t *testing.T) {
	dp := hpDatapath(t)
	info := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)
	info.Flags |= maps.EndpointFlagHostPort
	must(t, putEndpoint(dp.Maps, podIP, info))

	ret, p := runFrame(t, dp.FromContainer, packet(podMAC, protoTCP, podIP, nodeIP, 6000, 7000, synFlag))
	if ret != actRedirect {
		t.Fatalf("verdict %d", ret)
	}
	if !p.src.Equal(nodeIP) || p.sport != 6000 || !p.dst.Equal(podIP) || p.dport != 70 || !p.l3ok || !p.l4ok {
		t.Fatalf("%s:%d -> %s:%d (csum %v/%v), want %s:6000 -> %s:70", p.src, p.sport, p.dst, p.dport, p.l3ok, p.l4ok, nodeIP, podIP)
	}
	ret, p = runFrame(t, dp.FromContainer, packet(podMAC, protoTCP, podIP, nodeIP, 70, 6000, synFlag|ackFlag))
	if ret != actRedirect {
		t.Fatalf("reply verdict %d", ret)
	}
	if !p.src.Equal(nodeIP) || p.sport != 7000 || !p.dst.Equal(podIP) || p.dport != 6000 || !p.l3ok || !p.l4ok {
		t.Fatalf("reply %s:%d -> %s:%d, want %s:7000 -> %s:6000", p.src, p.sport, p.dst, p.dport, nodeIP, podIP)
	}
	flows := ctEntries(t, dp)
	if len(flows) != 1 || !flows[0].SNAT || flows[0].Peer.Addr().String() != nodeIP.String() {
		t.Fatalf("cni_ct: %+v, want one SNAT flow seen by the pod as coming from %s", flows, nodeIP)
	}
}

// TestFromContainerStaleFlow: a cni_ct entry made for another host veth (an
// earlier pod with this IP) never applies, and goes.
func TestFromContainerStaleFlow(t *testing.T) {
	dp := hpDatapath(t)
	info := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)
	info.Flags |= maps.EndpointFlagHostPort
	must(t, putEndpoint(dp.Maps, podIP, info))
	k, v := ctFlow(podIP, 70, dstIP, 5555, nodeIP, 7000, 999) // not lo
	must(t, putCT(dp.Maps, k, v))
	ret, p := runFrame(t, dp.FromContainer, packet(podMAC, protoTCP, podIP, dstIP, 70, 5555, ackFlag))
	if ret != actRedirect || !p.src.Equal(podIP) || p.sport != 70 {
		t.Fatalf("verdict %d src %s:%d, want untranslated", ret, p.src, p.sport)
	}
	var got maps.CTVal
	if err := mapstest.Map(dp.Maps, "cni_ct").Lookup(&k, &got); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("stale entry still there (%v)", err)
	}
	// DeleteCTOf removes exactly one pod's entries.
	v.Ifindex = 4242
	must(t, putCT(dp.Maps, k, v))
	k.PeerPort = htons(5556)
	v.Ifindex = 4343
	must(t, putCT(dp.Maps, k, v))
	if n, err := dp.Maps.HostPorts().DeleteCTOf(4242); err != nil || n != 1 {
		t.Fatalf("DeleteCTOf: %d, %v", n, err)
	}
	if f := ctEntries(t, dp); len(f) != 1 || f[0].Ifindex != 4343 {
		t.Fatalf("left: %+v", f)
	}
}

func htons(p uint16) uint16 { return p<<8 | p>>8 }

// ctFlow builds an IPv4 TCP cni_ct entry: pod:podPort talks to
// client:clientPort, which dialled orig:origPort.
func ctFlow(pod net.IP, podPort uint16, client net.IP, clientPort uint16, orig net.IP, origPort uint16, ifindex int) (maps.CTKey, maps.CTVal) {
	var k maps.CTKey
	copy(k.PodAddr[:], pod.To4())
	copy(k.PeerAddr[:], client.To4())
	k.PodPort, k.PeerPort = htons(podPort), htons(clientPort)
	k.Family, k.Proto = 2, protoTCP
	var v maps.CTVal
	copy(v.OrigAddr[:], orig.To4())
	copy(v.ClientAddr[:], client.To4())
	v.OrigPort, v.ClientPort = htons(origPort), htons(clientPort)
	v.Ifindex = uint32(ifindex)
	return k, v
}

func TestInsertHostPortNoExist(t *testing.T) {
	dp := testDatapath(t)
	h := maps.HostPort{Proto: protoTCP, HostPort: 8080, PodIP: dstIP, PodPort: 80, Ifindex: dstIfindex}
	must(t, dp.Maps.HostPorts().Insert(h))
	other := h
	other.PodIP, other.Ifindex = podIP, loIfindex
	err := dp.Maps.HostPorts().Insert(other)
	var taken *maps.HostPortTakenError
	if !errors.As(err, &taken) || !taken.Owner.PodIP.Equal(dstIP) {
		t.Fatalf("second insert: %v, want taken by %s", err, dstIP)
	}
	// Deleting another pod's view of the key leaves the owner's entry.
	must(t, dp.Maps.HostPorts().Delete(other))
	if got, err := dp.Maps.HostPorts().Lookup(h); err != nil || !got.PodIP.Equal(dstIP) {
		t.Fatalf("owner's entry: %+v %v", got, err)
	}
	must(t, dp.Maps.HostPorts().Delete(h))
	if _, err := dp.Maps.HostPorts().Lookup(h); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("after delete: %v", err)
	}
}
