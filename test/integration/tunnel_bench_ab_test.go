//go:build tunnelbench

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelBenchAB (go test -tags tunnelbench -run TestTunnelBenchAB): an
// A/B of a tunnel variant in the benchmark's lab, the same pods, every
// round running host-gw, VXLAN as the agent sets it up (A) and VXLAN with
// the variant (B), in an order that rotates each round, so drift and other
// jobs fall on all three alike. The variant: TUNNEL_AB_ARGS, more arguments
// of `ebpf-agent peers` (e.g. "--tunnel-mac-check=false"), and
// TUNNEL_AB_SETUP / TUNNEL_AB_UNDO, shell commands run after switching to B
// and before leaving it (device settings; TUNNEL_NODE1_NS, TUNNEL_NODE2_NS,
// TUNNEL_CLIENT_NS, TUNNEL_SERVER_NS in their environment, as
// TestTunnelProfile's). TUNNEL_BENCH_ROUNDS (7), TUNNEL_BENCH_SECS (3).
func TestTunnelBenchAB(t *testing.T) {
	rounds, secs := benchEnvInt("TUNNEL_BENCH_ROUNDS", 7), benchEnvInt("TUNNEL_BENCH_SECS", 3)
	bargs := strings.Fields(os.Getenv("TUNNEL_AB_ARGS"))
	b := newTunBench(t)
	sh := func(env string) {
		c := os.Getenv(env)
		if c == "" {
			return
		}
		cmd := exec.Command("sh", "-c", c)
		cmd.Env = append(os.Environ(), "TUNNEL_NODE1_NS="+b.n1.Path(), "TUNNEL_NODE2_NS="+b.n2.Path(),
			"TUNNEL_CLIENT_NS="+b.p1.Path(), "TUNNEL_SERVER_NS="+b.p2.Path())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", env, err, out)
		}
	}
	rr := func() float64 {
		us, err := testenv.RRMedian(b.p1, b.p2, b.a2, 5301, 5000)
		if err != nil {
			t.Fatalf("request/response: %v", err)
		}
		return us
	}
	names := []string{"host-gw", "vxlan A", "vxlan B"}
	tput, rtt := make([][]float64, 3), make([][]float64, 3)
	load := testenv.Loadavg()
	for r := 0; r < rounds; r++ {
		line := fmt.Sprintf("round %d (load %s):", r+1, testenv.Loadavg())
		for k := 0; k < 3; k++ {
			m := (r + k) % 3
			if m == 0 {
				b.mode(false)
			} else {
				b.modeArgs(true, m == 2, bargs)
			}
			if m == 2 {
				sh("TUNNEL_AB_SETUP")
			}
			tput[m], rtt[m] = append(tput[m], b.iperf(b.p1, b.a2, secs)), append(rtt[m], rr())
			if m == 2 {
				sh("TUNNEL_AB_UNDO")
			}
			line += fmt.Sprintf(" %s %.2f Gbit/s %.1f µs;", names[m], tput[m][r], rtt[m][r])
		}
		t.Log(line)
	}
	load += " to " + testenv.Loadavg()
	med := func(s []float64) (float64, float64, float64) {
		c := append([]float64(nil), s...)
		sort.Float64s(c)
		return c[len(c)/2], c[0], c[len(c)-1]
	}
	g, _, _ := med(tput[0])
	for m := range names {
		md, lo, hi := med(tput[m])
		rm, rlo, rhi := med(rtt[m])
		fmt.Printf("%-8s %d rounds: %.2f Gbit/s (%.2f-%.2f), %.2fx host-gw; RTT %.1f µs (%.1f-%.1f); load %s\n",
			names[m], rounds, md, lo, hi, md/g, rm, rlo, rhi, load)
	}
	fmt.Printf("B: TUNNEL_AB_ARGS=%q TUNNEL_AB_SETUP=%q TUNNEL_AB_UNDO=%q\n",
		os.Getenv("TUNNEL_AB_ARGS"), os.Getenv("TUNNEL_AB_SETUP"), os.Getenv("TUNNEL_AB_UNDO"))
}
