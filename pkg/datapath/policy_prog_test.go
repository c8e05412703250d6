package datapath

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// policyDatapath is testDatapath with both pods on a networkPolicy network
// (EP_F_POLICY): the source (lo) and the destination (dstIfindex).
func policyDatapath(t testing.TB) (*Datapath, *maps.PolicyWriter) {
	dp := testDatapath(t)
	must(t, putEndpoint(dp.Maps, podIP, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, maps.EndpointFlagPolicy)))
	must(t, putEndpoint(dp.Maps, dstIP, maps.NewEndpointInfo(dstIfindex, dstMAC, dstHost, maps.EndpointFlagPolicy)))
	must(t, dp.Maps.Policy().Enable())
	for _, idx := range []int{loIfindex, dstIfindex} {
		must(t, dp.Maps.Policy().AddFlowTables(idx))
		must(t, dp.Maps.Policy().MarkPending(idx))
	}
	return dp, dp.Maps.Policy().Writer()
}

func hostPrefix(ip net.IP) netip.Prefix {
	a, _ := netip.AddrFromSlice(ip)
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen())
}

// TestPolicyFastPathVerdicts: from_container on a same-node segment judges
// the sender's egress and the receiver's ingress; an allowed flow's reply
// passes both; a "reply" of no flow does not.
func TestPolicyFastPathVerdicts(t *testing.T) {
	dp, w := policyDatapath(t)
	req := func(flags byte) []byte { return packet(podMAC, protoTCP, podIP, dstIP, 40000, 80, flags) }
	drops := func(idx int, dir maps.Dir) uint64 {
		c, err := dp.Maps.Stats().Counters(idx)
		must(t, err)
		return c[maps.CounterKey{Dir: dir, Reason: maps.ReasonDropPolicy}].Packets
	}
	if got, _ := run(t, dp.FromContainer, req(synFlag)); got != actShot || drops(loIfindex, maps.DirEgress) != 1 {
		t.Fatalf("pending: verdict %d, egress drops %d; want a drop counted", got, drops(loIfindex, maps.DirEgress))
	}
	// The source may send to dst:80; dst takes only port 81 from it.
	must(t, w.Apply(loIfindex, policy.Endpoint{Egress: policy.Rules{Isolated: true, Allows: []policy.Allow{
		{Prefix: hostPrefix(dstIP), Ports: []policy.PortRange{{Proto: policy.ProtoTCP, First: 80, Last: 80}}}}}}))
	must(t, w.Apply(dstIfindex, policy.Endpoint{Ingress: policy.Rules{Isolated: true, Allows: []policy.Allow{
		{Prefix: hostPrefix(podIP), Ports: []policy.PortRange{{Proto: policy.ProtoTCP, First: 81, Last: 81}}}}}}))
	if got, _ := run(t, dp.FromContainer, req(synFlag)); got != actShot || drops(dstIfindex, maps.DirIngress) != 1 {
		t.Fatalf("ingress port not allowed: verdict %d, ingress drops %d", got, drops(dstIfindex, maps.DirIngress))
	}
	must(t, w.Apply(dstIfindex, policy.Endpoint{Ingress: policy.Rules{Isolated: true, Allows: []policy.Allow{
		{Prefix: hostPrefix(podIP), Ports: []policy.PortRange{{Proto: policy.ProtoTCP, First: 79, Last: 90}}}}},
		Egress: policy.Rules{Isolated: true}}))
	if got, _ := run(t, dp.FromContainer, req(synFlag)); got != actRedirect {
		t.Fatalf("allowed: verdict %d, want the redirect", got)
	}
	// The flow is known now at both ends: its next segment passes though
	// dst's rules no longer allow it (an established connection outlives
	// a policy change), while a new flow from another port does not.
	must(t, w.Apply(dstIfindex, policy.Endpoint{Ingress: policy.Rules{Isolated: true}, Egress: policy.Rules{Isolated: true}}))
	if got, _ := run(t, dp.FromContainer, req(ackFlag)); got != actRedirect {
		t.Fatalf("established: verdict %d, want the redirect", got)
	}
	other := packet(podMAC, protoTCP, podIP, dstIP, 40001, 80, synFlag)
	if got, _ := run(t, dp.FromContainer, other); got != actShot {
		t.Fatalf("new flow after the change: verdict %d, want a drop", got)
	}
	flows, err := dp.Maps.Policy().ListFlows()
	must(t, err)
	ends := map[int]bool{}
	for _, f := range flows {
		ends[f.Ifindex] = true
	}
	if !ends[loIfindex] || !ends[dstIfindex] {
		t.Fatalf("flow entries %+v, want one at each end", flows)
	}
}

// TestPolicyFlowEitherTable: the flow lookup tries first the table the
// ports suggest (the lower port the server's, so the other end opened the
// flow) and then the other: a flow whose opener dialled from the lower
// port, or with equal ports, is found all the same, at both ends, IPv4 and
// IPv6. Both pods are isolated with no rule, so only a flow entry lets a
// packet through; with none the packet is dropped.
func TestPolicyFlowEitherTable(t *testing.T) {
	dst6 := net.ParseIP("fd00:9::3")
	for _, c := range []struct {
		name               string
		podPort, peerPort  uint16
		podOpener, dstOpen maps.Dir // the tables holding the flow at each end
	}{
		{"opened-from-lower-port", 80, 40000, maps.DirEgress, maps.DirIngress},
		{"reply-from-lower-port", 80, 40000, maps.DirIngress, maps.DirEgress},
		{"opened-to-lower-port", 40000, 80, maps.DirEgress, maps.DirIngress},
		{"reply-to-lower-port", 40000, 80, maps.DirIngress, maps.DirEgress},
		{"equal-ports-opened", 5000, 5000, maps.DirEgress, maps.DirIngress},
		{"equal-ports-reply", 5000, 5000, maps.DirIngress, maps.DirEgress},
	} {
		for _, fam := range []struct {
			name     string
			src, dst net.IP
		}{{"v4", podIP, dstIP}, {"v6", podIP6, dst6}} {
			t.Run(c.name+"-"+fam.name, func(t *testing.T) {
				dp, w := policyDatapath(t)
				must(t, putEndpoint(dp.Maps, podIP6, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, maps.EndpointFlagPolicy)))
				must(t, putEndpoint(dp.Maps, dst6, maps.NewEndpointInfo(dstIfindex, dstMAC, dstHost, maps.EndpointFlagPolicy)))
				closed := policy.Endpoint{Ingress: policy.Rules{Isolated: true}, Egress: policy.Rules{Isolated: true}}
				must(t, w.Apply(loIfindex, closed))
				must(t, w.Apply(dstIfindex, closed))
				seg := packet(podMAC, protoTCP, fam.src, fam.dst, c.podPort, c.peerPort, ackFlag)
				if got, _ := run(t, dp.FromContainer, seg); got != actShot {
					t.Fatalf("no flow: verdict %d, want a drop", got)
				}
				putPolicyFlow(t, dp, loIfindex, c.podOpener, fam.src, c.podPort, fam.dst, c.peerPort)
				if got, _ := run(t, dp.FromContainer, seg); got != actShot {
					t.Fatalf("flow at the sender only: verdict %d, want a drop (the receiver has none)", got)
				}
				putPolicyFlow(t, dp, dstIfindex, c.dstOpen, fam.dst, c.peerPort, fam.src, c.podPort)
				if got, _ := run(t, dp.FromContainer, seg); got != actRedirect {
					t.Fatalf("flow at both ends: verdict %d, want the redirect", got)
				}
			})
		}
	}
}

// BenchmarkFromContainerPolicy times the fast path (from_container, a TCP
// segment to a pod of the node) without networkPolicy, with it and nothing
// selecting either pod, and with both isolated: an established flow (a
// hit in the flow table at each end) and a new one the rules deny (both
// tries looked up), with 1 and 100 peers in the rule set.
// go test -run - -bench FromContainerPolicy -benchtime 2000x ./pkg/datapath/
func BenchmarkFromContainerPolicy(b *testing.B) {
	peers := func(n int) []policy.Allow {
		out := []policy.Allow{{Prefix: hostPrefix(dstIP), Ports: []policy.PortRange{{Proto: policy.ProtoTCP, First: 80, Last: 80}}},
			{Prefix: hostPrefix(podIP), Ports: []policy.PortRange{{Proto: policy.ProtoTCP, First: 80, Last: 80}}}}
		for i := 0; i < n-1; i++ {
			out = append(out, policy.Allow{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 77, byte(i >> 8), byte(i)}), 32), AllPorts: true})
		}
		return out
	}
	for _, c := range []struct {
		name     string
		flag     bool
		peers    int
		dport    uint16
		wantVerd uint32
	}{
		{"no-policy", false, 0, 80, actRedirect},
		{"policy-open", true, 0, 80, actRedirect},
		{"isolated-established-1-peer", true, 1, 80, actRedirect},
		{"isolated-established-100-peers", true, 100, 80, actRedirect},
		{"isolated-denied-1-peer", true, 1, 81, actShot},
		{"isolated-denied-100-peers", true, 100, 81, actShot},
	} {
		b.Run(c.name, func(b *testing.B) {
			dp := testDatapath(b)
			if c.flag {
				var w *maps.PolicyWriter
				dp, w = policyDatapath(b)
				ep := policy.Endpoint{}
				if c.peers > 0 {
					r := policy.Rules{Isolated: true, Allows: peers(c.peers)}
					ep = policy.Endpoint{Ingress: r, Egress: r}
				}
				must(b, w.Apply(loIfindex, ep))
				must(b, w.Apply(dstIfindex, ep))
			}
			frame := packet(podMAC, protoTCP, podIP, dstIP, 40000, c.dport, ackFlag)
			benchFrames(b, dp, c.wantVerd, func(int) []byte { return frame })
		})
	}
	// A reply: the source pod answers a flow dst opened (dst:40000 to the
	// source's port 80), found in the source's table of flows its peers
	// opened and in dst's table of its own.
	b.Run("isolated-reply-1-peer", func(b *testing.B) {
		dp, w := policyDatapath(b)
		r := policy.Rules{Isolated: true, Allows: peers(1)}
		must(b, w.Apply(loIfindex, policy.Endpoint{Ingress: r, Egress: r}))
		must(b, w.Apply(dstIfindex, policy.Endpoint{Ingress: r, Egress: r}))
		putPolicyFlow(b, dp, loIfindex, maps.DirIngress, podIP, 80, dstIP, 40000)
		putPolicyFlow(b, dp, dstIfindex, maps.DirEgress, dstIP, 40000, podIP, 80)
		frame := packet(podMAC, protoTCP, podIP, dstIP, 80, 40000, ackFlag)
		benchFrames(b, dp, actRedirect, func(int) []byte { return frame })
	})
	// A new connection each run (a SYN from another source port): both
	// tables missed at each end, the tries, a record at each end (the LRU
	// tables full after 128 runs: each record evicts).
	b.Run("isolated-new-flow-1-peer", func(b *testing.B) {
		dp, w := policyDatapath(b)
		r := policy.Rules{Isolated: true, Allows: peers(1)}
		must(b, w.Apply(loIfindex, policy.Endpoint{Ingress: r, Egress: r}))
		must(b, w.Apply(dstIfindex, policy.Endpoint{Ingress: r, Egress: r}))
		benchFrames(b, dp, actRedirect, func(i int) []byte {
			return packet(podMAC, protoTCP, podIP, dstIP, uint16(32768+i%28000), 80, synFlag)
		})
	})
}

// benchFrames runs from_container b.N times on frame(i) and reports the
// mean kernel time per run.
func benchFrames(b *testing.B, dp *Datapath, want uint32, frame func(i int) []byte) {
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f := append([]byte(nil), frame(i)...) // the redirect rewrites MACs
		ret, d, err := dp.FromContainer.Benchmark(f, 1, nil)
		if err != nil {
			b.Fatal(err)
		}
		if ret != want {
			b.Fatalf("run %d: verdict %d, want %d", i, ret, want)
		}
		total += d
	}
	b.StopTimer()
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/run")
}

// putPolicyFlow writes a live TCP flow into the table of ifindex's flows
// opened by opener, as policy_judge would have recorded it: the pod's
// address and port first.
func putPolicyFlow(t testing.TB, dp *Datapath, ifindex int, opener maps.Dir, pod net.IP, podPort uint16, peer net.IP, peerPort uint16) {
	t.Helper()
	var id uint32
	pk := maps.PolicyCTPartKey{Ifindex: uint32(ifindex), Opener: uint32(opener)}
	must(t, mapstest.Map(dp.Maps, "cni_pol_ct_parts").Lookup(&pk, &id))
	tbl, err := ebpf.NewMapFromID(ebpf.MapID(id))
	must(t, err)
	defer tbl.Close()
	k := maps.PolicyCTKey{Ifindex: uint32(ifindex), Family: 2, Proto: protoTCP, PodPort: htons(podPort), PeerPort: htons(peerPort)}
	copy(k.PodAddr[:], pod.To4())
	copy(k.PeerAddr[:], peer.To4())
	if pod.To4() == nil {
		k.Family = 10 // AF_INET6
		copy(k.PodAddr[:], pod.To16())
		copy(k.PeerAddr[:], peer.To16())
	}
	var ts unix.Timespec
	must(t, unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts))
	now := uint64(ts.Nano())
	v := maps.PolicyCTVal{CreatedNs: now, SeenNs: now}
	if opener == maps.DirEgress {
		v.Flags = maps.PolicyCTEgress
	}
	must(t, tbl.Put(&k, &v))
}
