package datapath

import (
	"net"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// TestMasqNodeIPsGone: a masquerade mapping keeps its node address while
// the node has it, without a cni_node_ips lookup per packet (issue 30).
// Mappings made after cni_node_ips_gone are not looked up (an address
// vanishing from the map behind the node hooks' back changes nothing);
// when the node hooks remove an address they mark the map first, and the
// flow's next segment is no longer rewritten to it (a TCP segment of no
// known flow stays as the pod sent it, as before).
func TestMasqNodeIPsGone(t *testing.T) {
	dp := hpDatapath(t)
	progs, err := loadPrograms(dp.PinRoot, dp.Maps, nodeHookPrograms(), loadMissing)
	must(t, err)
	defer closePrograms(progs)
	out := progs["cni_to_uplink"]
	gone := mapstest.Map(dp.Maps, "cni_node_ips_gone")
	zero := uint32(0)
	var mark uint64
	must(t, gone.Lookup(&zero, &mark))
	if mark != 1 {
		t.Fatalf("cni_node_ips_gone of a fresh pin set: %d, want 1 (no mapping to check)", mark)
	}

	mq := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)
	mq.Flags |= maps.EndpointFlagMasq
	must(t, putEndpoint(dp.Maps, podIP, mq))
	// (This drops hpDatapath's other node addresses: marked.)
	must(t, dp.Maps.Node().SyncIPs(map[string]int{nodeIP.String(): 1}))
	must(t, gone.Lookup(&zero, &mark))
	for monoNow() <= mark {
		time.Sleep(50 * time.Millisecond)
	}
	putSNATFwd(t, dp, protoTCP, podIP, 40030, farIP, 443, nodeIP, 61030)

	seg := packet(podMAC, protoTCP, podIP, farIP, 40030, 443, ackFlag)
	check := func(what string, wantSrc net.IP, wantPort uint16) {
		t.Helper()
		ret, p := runFromFrame(t, out, seg, loIfindex)
		if ret != actNext || !p.src.Equal(wantSrc) || p.sport != wantPort {
			t.Fatalf("%s: verdict %d, source %s:%d, want %d and %s:%d", what, ret, p.src, p.sport, actNext, wantSrc, wantPort)
		}
	}
	check("known flow", nodeIP, 61030)

	// The address leaves cni_node_ips without the node hooks: a mapping
	// made after the mark is not checked against it.
	k, err := maps.KeyFor(nodeIP)
	must(t, err)
	must(t, mapstest.Map(dp.Maps, "cni_node_ips").Delete(&k))
	check("address gone behind the node hooks' back", nodeIP, 61030)

	// The node hooks remove it: marked first, a second ahead.
	must(t, dp.Maps.Node().SyncIPs(map[string]int{nodeIP.String(): 1}))
	before := monoNow()
	must(t, dp.Maps.Node().SyncIPs(map[string]int{}))
	must(t, gone.Lookup(&zero, &mark))
	if mark < before+uint64(time.Second) || mark > monoNow()+uint64(time.Second) {
		t.Fatalf("cni_node_ips_gone %d after a removal at %d: want a second past it", mark, before)
	}
	check("the node lost the mapping's address", podIP, 40030)
	st, err := dp.Maps.Masq().Stats()
	if err != nil || st["not_new"] == 0 {
		t.Fatalf("not_new %d (%v): the segment was not taken for one of no known flow", st["not_new"], err)
	}
	// Back: kept again (the address is the node's).
	must(t, dp.Maps.Node().SyncIPs(map[string]int{nodeIP.String(): 1}))
	check("the address back", nodeIP, 61030)
}

// putSNATFwd writes the forward entry of a masqueraded flow, made now:
// pod:podPort leaves as node:port to peer:peerPort.
func putSNATFwd(t *testing.T, dp *Datapath, proto byte, pod net.IP, podPort uint16, peer net.IP, peerPort uint16, node net.IP, port uint16) {
	t.Helper()
	var k maps.SNATKey
	var v maps.SNATVal
	copy(k.Addr[:], pod.To4())
	copy(k.PeerAddr[:], peer.To4())
	copy(v.Addr[:], node.To4())
	k.Port, k.PeerPort, k.Proto, k.Family, k.Dir = htons(podPort), htons(peerPort), proto, 2, 0
	v.Port, v.Ifindex, v.CreatedNs, v.SeenNs = htons(port), loIfindex, monoNow(), monoNow()
	must(t, mapstest.Map(dp.Maps, "cni_snat").Put(&k, &v))
}

// runFromFrame is runFrame with the skb's ingress_ifindex set (the link
// the stack forwarded the packet from).
func runFromFrame(t *testing.T, p *ebpf.Program, frame []byte, ingress uint32) (uint32, parsed) {
	t.Helper()
	ret, out := testRunOut(t, p, frame, ingress)
	return ret, parse(t, out)
}
