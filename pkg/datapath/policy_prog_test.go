package datapath

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// policyDatapath is testDatapath with both pods on a networkPolicy network
// (EP_F_POLICY): the source (lo) and the destination (dstIfindex).
func policyDatapath(t testing.TB) (*Datapath, *maps.PolicyWriter) {
	dp := testDatapath(t)
	must(t, putEndpoint(dp.Maps, podIP, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, maps.EndpointFlagPolicy)))
	must(t, putEndpoint(dp.Maps, dstIP, maps.NewEndpointInfo(dstIfindex, dstMAC, dstHost, maps.EndpointFlagPolicy)))
	must(t, dp.Maps.Policy().Enable())
	must(t, dp.Maps.Policy().SetPending(loIfindex))
	must(t, dp.Maps.Policy().SetPending(dstIfindex))
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
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f := append([]byte(nil), frame...) // the redirect rewrites MACs
				ret, d, err := dp.FromContainer.Benchmark(f, 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				if ret != c.wantVerd {
					b.Fatalf("verdict %d, want %d", ret, c.wantVerd)
				}
				total += d
			}
			b.StopTimer()
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/run")
		})
	}
}
