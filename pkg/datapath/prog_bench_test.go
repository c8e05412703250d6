package datapath

import (
	"testing"
	"time"
)

// BenchmarkFromContainerPodToPod times cni_from_container on a same-node
// pod-to-pod TCP segment (the fast path: checks, then bpf_redirect_peer) with
// BPF_PROG_TEST_RUN; ns/run is the kernel's mean run time of the program
// (ns/op adds the syscall around each run).
// go test -run - -bench FromContainer -benchtime 20x ./pkg/datapath/
func BenchmarkFromContainerPodToPod(b *testing.B) {
	for _, c := range []struct {
		name  string
		proto byte
	}{{"tcp", protoTCP}, {"udp", protoUDP}} {
		b.Run(c.name, func(b *testing.B) {
			dp := testDatapath(b)
			frame := packet(podMAC, c.proto, podIP, dstIP, 40000, 80, ackFlag)
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				// One run per call: the redirect rewrites the frame's MACs,
				// which a repeated run would then drop as spoofed. The
				// skb's device is lo (ifindex 1), the endpoint's host veth here.
				ret, d, err := dp.FromContainer.Benchmark(frame, 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				if ret != actRedirect {
					b.Fatalf("verdict %d, want the redirect of the fast path", ret)
				}
				total += d
			}
			b.StopTimer()
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/run")
		})
	}
}
