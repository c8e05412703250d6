package datapath

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// The bandwidth admission (bpf/lib/bandwidth.h) on hand-made frames
// (BPF_PROG_TEST_RUN): the egress bucket in from_container, the ingress
// bucket on the redirect into a pod, and the ingress queue's admission in
// to_container (pass, mark CE, drop). test/integration's bandwidth tests
// show the rates with real traffic; these show each verdict.
//
// The rate is 80 bit/s, so one frame costs seconds of tokens: the refill
// between two runs (microseconds, or a stalled runner's milliseconds) never
// changes a verdict. Each bucket is sized in frames of cost c.

const bwTestRate = 80 // bit/s: 10 bytes a second, 1e8 ns a byte

// bwLimit is a limit of burst, queue and mark given in frames of n bytes
// at bwTestRate, times two (halves are what the margins need).
func bwLimit(n int, burst2, queue2, mark2 uint64) maps.Limit {
	costNs := uint64(n) * 1e9 * 8 / bwTestRate
	return maps.Limit{RateBps: bwTestRate, BurstBits: uint64(n) * 8 * burst2 / 2, QueueNs: costNs * queue2 / 2, MarkNs: costNs * mark2 / 2}
}

func countAt(t *testing.T, dp *Datapath, idx int, dir maps.Dir, r maps.Reason) uint64 {
	t.Helper()
	c, err := dp.Maps.Stats().Counters(idx)
	if err != nil {
		t.Fatal(err)
	}
	return c[maps.CounterKey{Dir: dir, Reason: r}].Packets
}

// wantVerdicts runs a copy of frame once per verdict wanted and returns
// the frames after each run.
func wantVerdicts(t *testing.T, run func([]byte) (uint32, []byte), frame []byte, want ...uint32) [][]byte {
	t.Helper()
	var outs [][]byte
	for i, w := range want {
		got, out := run(append([]byte(nil), frame...))
		if got != w {
			t.Fatalf("frame %d of %d: verdict %d, want %d", i+1, len(want), got, w)
		}
		outs = append(outs, out)
	}
	return outs
}

// TestBandwidthEgressAdmission: a pod with an egress limit (EP_F_BW_EGRESS)
// sends while its bucket is not in debt, each frame charged in full; then
// every frame is dropped and counted, uncharged. IPv4 and IPv6, to the
// stack and to another pod of the node (the bucket is the sender's either way).
func TestBandwidthEgressAdmission(t *testing.T) {
	for _, c := range []struct {
		name  string
		frame []byte
		pass  uint32
	}{
		{"IPv4 to the stack", append(eth(podMAC, 0x0800), ipv4(podIP, net.ParseIP("192.0.2.9"), 64)...), actOK},
		{"IPv6 to the stack", append(eth(podMAC, 0x86dd), ipv6(podIP6, net.ParseIP("fd00:1::1"))...), actOK},
		{"IPv4 to a pod of the node", append(eth(podMAC, 0x0800), ipv4(podIP, dstIP, 64)...), actRedirect},
	} {
		t.Run(c.name, func(t *testing.T) {
			dp := testDatapath(t)
			ep := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, maps.FlagBandwidthEgress)
			must(t, putEndpoint(dp.Maps, podIP, ep))
			must(t, putEndpoint(dp.Maps, podIP6, ep))
			// A burst of 1.5 frames: the second frame finds the bucket at half
			// a frame (not in debt), the third at minus half.
			must(t, dp.Maps.Bandwidth().PutLimit(loIfindex, maps.DirEgress, bwLimit(len(c.frame), 3, 0, 0)))
			before := countAt(t, dp, loIfindex, maps.DirEgress, maps.ReasonDropBandwidth)
			runIt := func(f []byte) (uint32, []byte) { return run(t, dp.FromContainer, f) }
			wantVerdicts(t, runIt, c.frame, c.pass, c.pass, actShot, actShot)
			if got := countAt(t, dp, loIfindex, maps.DirEgress, maps.ReasonDropBandwidth) - before; got != 2 {
				t.Fatalf("%d egress bandwidth drops counted, want 2", got)
			}
			l, ok, err := dp.Maps.Bandwidth().LookupLimit(loIfindex, maps.DirEgress)
			if err != nil || !ok || l.RateBps != bwTestRate {
				t.Fatalf("limit after the runs: %+v %v %v", l, ok, err)
			}
		})
	}
}

// TestBandwidthRedirectAdmission: a same-node pod-to-pod frame is
// redirected into the destination past its host veth's egress hook, so its
// ingress bucket (EP_F_BW_INGRESS in the destination's entry) is applied
// on the redirect: admitted while not in debt, then dropped and counted
// for the destination.
func TestBandwidthRedirectAdmission(t *testing.T) {
	dp := testDatapath(t)
	must(t, putEndpoint(dp.Maps, dstIP, maps.NewEndpointInfo(dstIfindex, dstMAC, dstHost, maps.FlagBandwidthIngress)))
	frame := append(eth(podMAC, 0x0800), ipv4(podIP, dstIP, 64)...)
	must(t, dp.Maps.Bandwidth().PutLimit(dstIfindex, maps.DirIngress, bwLimit(len(frame), 3, 0, 0)))
	before := countAt(t, dp, dstIfindex, maps.DirIngress, maps.ReasonDropBandwidth)
	runIt := func(f []byte) (uint32, []byte) { return run(t, dp.FromContainer, f) }
	wantVerdicts(t, runIt, frame, actRedirect, actRedirect, actShot)
	if got := countAt(t, dp, dstIfindex, maps.DirIngress, maps.ReasonDropBandwidth) - before; got != 1 {
		t.Fatalf("%d ingress bandwidth drops counted for the destination, want 1", got)
	}
	// The sender has no egress limit: nothing counted against it.
	if got := countAt(t, dp, loIfindex, maps.DirEgress, maps.ReasonDropBandwidth); got != 0 {
		t.Fatalf("%d egress bandwidth drops counted for the sender, want 0", got)
	}
}

// TestBandwidthQueueAdmission: the ingress queue's admission in
// to_container for a pod whose link entry says it has an ingress limit
// (LI_F_BW_KNOWN | EP_F_BW_INGRESS). With a burst of one frame, a queue of
// 2.5 and a mark threshold of 1.5: the first frame passes as it is, the
// second and third (backlog 2 and 3 frames) pass marked CE with a valid IP
// checksum, the fourth (backlog would pass the queue's capacity) is
// dropped and counted. A frame that is not ECN-capable is never marked.
func TestBandwidthQueueAdmission(t *testing.T) {
	for _, ect := range []bool{true, false} {
		name := "ECN-capable"
		if !ect {
			name = "not ECN-capable"
		}
		t.Run(name, func(t *testing.T) {
			dp := testDatapath(t)
			li := maps.NewLinkInfo(podMAC, hostMAC)
			li.Flags = maps.LinkFlagBandwidthKnown | maps.FlagBandwidthIngress
			must(t, dp.Maps.Links().Put(loIfindex, li))
			frame := packet(hostMAC, protoTCP, gwIP, podIP, 40000, 80, ackFlag)
			copy(frame[0:6], podMAC) // the neighbour entry's MAC: no rewrite
			if ect {
				frame[15] = 0x02 // ECT(0)
				binary.BigEndian.PutUint16(frame[24:], 0)
				binary.BigEndian.PutUint16(frame[24:], csum(frame[14:34]))
			}
			must(t, dp.Maps.Bandwidth().PutLimit(loIfindex, maps.DirIngress, bwLimit(len(frame), 2, 5, 3)))
			before := countAt(t, dp, loIfindex, maps.DirIngress, maps.ReasonDropBandwidth)
			runIt := func(f []byte) (uint32, []byte) { return run(t, dp.ToContainer, f) }
			outs := wantVerdicts(t, runIt, frame, actOK, actOK, actOK, actShot)
			for i, out := range outs[:3] {
				ecn := out[15] & 3
				want := byte(0)
				if ect {
					want = 2
					if i > 0 {
						want = 3 // CE
					}
				}
				if ecn != want {
					t.Fatalf("frame %d: ECN bits %d, want %d", i+1, ecn, want)
				}
				if p := parse(t, out); !p.l3ok || !p.l4ok {
					t.Fatalf("frame %d: checksums IP %v, TCP %v after the queue's admission", i+1, p.l3ok, p.l4ok)
				}
			}
			if got := countAt(t, dp, loIfindex, maps.DirIngress, maps.ReasonDropBandwidth) - before; got != 1 {
				t.Fatalf("%d ingress bandwidth drops counted, want 1", got)
			}
		})
	}
}
