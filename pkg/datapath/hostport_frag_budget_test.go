//go:build pktbudget

package datapath

import (
	"encoding/binary"
	"fmt"
	"sort"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestFragmentBudget: what a hostPort UDP datagram costs whole and in
// fragments (BPF_PROG_TEST_RUN ns per run, as TestPacketBudget measures:
// R rounds of N single runs, the median of the rounds' means with their
// min and max), into the pod off the wire and the pod's reply, IPv4:
//
//	go test -tags pktbudget -count=1 -run TestFragmentBudget -v ./pkg/datapath/
func TestFragmentBudget(t *testing.T) {
	rounds, runs := envInt(t, "EBPF_CNI_BUDGET_ROUNDS", 15), envInt(t, "EBPF_CNI_BUDGET_RUNS", 400)
	dp := hpDatapath(t)
	up := uplinkProgram(t, dp)
	info := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)
	info.Flags |= maps.EndpointFlagHostPort
	must(t, putEndpoint(dp.Maps, podIP, info))
	k, v := ctFlow(podIP, 70, dstIP, 5555, nodeIP, 7000, loIfindex)
	k.Proto = protoUDP
	must(t, putCT(dp.Maps, k, v))
	payload := make([]byte, 32)

	must(t, dp.Maps.HostPorts().Insert(maps.HostPort{IPv6: true, Proto: protoUDP, HostPort: 8080, PodIP: dstIP6, PodPort: 80, Ifindex: dstIfindex}))
	in := udpSeg(clientIP, nodeIP, 40000, 8080, payload)
	in6 := udpSeg(clientIP6, nodeIP6, 40000, 8080, payload)
	out := udpSeg(podIP, dstIP, 70, 5555, payload)
	type row struct {
		name  string
		p     *ebpf.Program
		frame []byte
		want  uint32
	}
	rows := []row{
		{"hostPort in, UDP datagram (flow open)", up, packet(remoteMAC, protoUDP, clientIP, nodeIP, 40000, 8080, 0), actRedirect},
		{"hostPort in, UDP first fragment", up, fragment(remoteMAC, clientIP, nodeIP, 7, 0, true, in[:16]), actRedirect},
		{"hostPort in, UDP later fragment", up, fragment(remoteMAC, clientIP, nodeIP, 7, 2, false, in[16:]), actRedirect},
		{"hostPort reply, UDP datagram", dp.FromContainer, packet(podMAC, protoUDP, podIP, dstIP, 70, 5555, 0), actRedirect},
		{"hostPort reply, UDP first fragment", dp.FromContainer, fragment(podMAC, podIP, dstIP, 9, 0, true, out[:16]), actRedirect},
		{"hostPort reply, UDP later fragment", dp.FromContainer, fragment(podMAC, podIP, dstIP, 9, 2, false, out[16:]), actRedirect},
		// IPv6, whose fragment header hp_ip6_chain finds (issue 24's
		// hardening: behind other extension headers too).
		{"hostPort in, IPv6 UDP first fragment", up, fragment(remoteMAC, clientIP6, nodeIP6, 7, 0, true, in6[:16]), actRedirect},
		{"hostPort in, IPv6 UDP later fragment", up, fragment(remoteMAC, clientIP6, nodeIP6, 7, 2, false, in6[16:]), actRedirect},
		{"hostPort in, IPv6 UDP first fragment behind a hop-by-hop header", up, withHopByHop(fragment(remoteMAC, clientIP6, nodeIP6, 8, 0, true, in6[:16])), actRedirect},
		{"hostPort in, IPv6 UDP later fragment behind a hop-by-hop header", up, withHopByHop(fragment(remoteMAC, clientIP6, nodeIP6, 8, 2, false, in6[16:])), actRedirect},
		// A later fragment of no translated datagram: the pod's own, to
		// the stack as before, after its lookup.
		{"pod's own later fragment (no hostPort flow)", dp.FromContainer, fragment(podMAC, podIP, dstIP, 11, 2, false, out[16:]), actOK},
	}
	fmt.Printf("\n| path | median ns/run | min | max | rounds x runs |\n|---|---:|---:|---:|---|\n")
	for _, r := range rows {
		want, _, _ := testRun(t, r.p, r.frame, 0)
		if want != r.want {
			// A reference tree older than hp_frag_flow leaves fragments
			// alone: the row is not its path (the others still compare).
			fmt.Printf("| %s | verdict %d, not %d: not this build's path | | | |\n", r.name, want, r.want)
			continue
		}
		var means []float64
		for i := 0; i < rounds; i++ {
			var sum uint64
			for j := 0; j < runs; j++ {
				ret, ns, _ := testRun(t, r.p, r.frame, 0)
				if ret != want {
					t.Fatalf("%s: verdict %d", r.name, ret)
				}
				sum += uint64(ns)
			}
			means = append(means, float64(sum)/float64(runs))
		}
		sort.Float64s(means)
		fmt.Printf("| %s | %.0f | %.0f | %.0f | %d x %d |\n", r.name, means[len(means)/2], means[0], means[len(means)-1], rounds, runs)
	}
}

// withHopByHop puts a hop-by-hop options header (one PadN option) between
// an IPv6 frame's fixed header and what followed it.
func withHopByHop(f []byte) []byte {
	const l3 = 14
	out := append([]byte(nil), f[:l3+40]...)
	hbh := []byte{out[l3+6], 0, 1, 4, 0, 0, 0, 0}
	out[l3+6] = 0
	binary.BigEndian.PutUint16(out[l3+4:], binary.BigEndian.Uint16(out[l3+4:])+8)
	return append(append(out, hbh...), f[l3+40:]...)
}
