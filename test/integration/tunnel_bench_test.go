//go:build tunnelbench

package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// tunBenchGoal is issue 24's throughput goal, tunnel against host-gw.
const tunBenchGoal = 0.90

// benchEnvInt reads a positive integer knob of the benchmark, else def.
func benchEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestTunnelBench (make bench-tunnel; make bench's tunnel part): from a pod
// of node 1 to a pod of node 2 (one subnet of the tunnel lab), iperf3 TCP
// throughput and 1-byte TCP request/response, routed host-gw and through
// the VXLAN tunnel, the same pods (MTU 1450 both ways, the tunnel's: the
// same MSS, so the ratio is the tunnel's cost per packet), the routes
// switched between runs and the order alternating every round. A second
// pair of pods at MTU 1500, what a node without the tunnel gives its pods,
// is measured in the host-gw runs: the tunnel against it includes the MTU
// the overhead takes. TUNNEL_BENCH_ROUNDS (7) and TUNNEL_BENCH_SECS (3)
// size it; TUNNEL_BENCH_OUT names a JSON file for the rows (test/bench);
// TUNNEL_BENCH_NODE_CPUS=1 gives each node a CPU of its own (pinNodes).
func TestTunnelBench(t *testing.T) {
	rounds, secs := benchEnvInt("TUNNEL_BENCH_ROUNDS", 7), benchEnvInt("TUNNEL_BENCH_SECS", 3)
	b := newTunBench(t)
	mode, p1, p2, a2, q1, b2 := b.mode, b.p1, b.p2, b.a2, b.q1, b.b2
	iperf := func(c ns.NetNS, to net.IP) float64 { return b.iperf(c, to, secs) }
	rr := func() float64 {
		us, err := testenv.RRMedian(p1, p2, a2, 5301, 5000)
		if err != nil {
			t.Fatalf("request/response: %v", err)
		}
		return us
	}
	var gw, tun, gw1500, gwRR, tunRR []float64
	load := testenv.Loadavg()
	for r := 0; r < rounds; r++ {
		for _, tunnel := range []bool{r%2 == 1, r%2 == 0} {
			mode(tunnel)
			if tunnel {
				tun, tunRR = append(tun, iperf(p1, a2)), append(tunRR, rr())
				continue
			}
			gw, gwRR = append(gw, iperf(p1, a2)), append(gwRR, rr())
			gw1500 = append(gw1500, iperf(q1, b2))
		}
		t.Logf("round %d (load %s): host-gw %.2f Gbit/s %.1f µs, MTU 1500 %.2f Gbit/s; vxlan %.2f Gbit/s %.1f µs",
			r+1, testenv.Loadavg(), gw[r], gwRR[r], gw1500[r], tun[r], tunRR[r])
	}
	load += " to " + testenv.Loadavg()
	lab := "both nodes on both CPUs"
	if tunBenchNodeCPUs() {
		lab = "each node on its own CPU"
	}
	tput := fmt.Sprintf("cross-node pod-to-pod TCP throughput (iperf3, 1 stream, %d s; %s)", secs, lab)
	rrm := "cross-node request/response RTT median (1 byte over TCP, 5000 exchanges; " + lab + ")"
	rows := []testenv.Row{
		testenv.NewRow("tunnel", "host-gw (pod MTU 1450)", tput, "", "Gbit/s", gw),
		testenv.NewRow("tunnel", "vxlan tunnel (pod MTU 1450)", tput, "", "Gbit/s", tun),
		testenv.NewRow("tunnel", "host-gw (pod MTU 1500)", tput, "", "Gbit/s", gw1500),
		testenv.NewRow("tunnel", "vxlan tunnel (pod MTU 1450)", tput, "against host-gw at the uplink's MTU", "Gbit/s", tun),
		testenv.NewRow("tunnel", "host-gw (pod MTU 1450)", rrm, "", "µs", gwRR),
		testenv.NewRow("tunnel", "vxlan tunnel (pod MTU 1450)", rrm, "", "µs", tunRR),
	}
	rows[1].Against("host-gw (pod MTU 1450)", rows[0].Median)
	rows[1].Goal(fmt.Sprintf(">= %.2fx of host-gw", tunBenchGoal), rows[1].Ratio >= tunBenchGoal)
	rows[3].Against("host-gw (pod MTU 1500)", rows[2].Median)
	rows[5].Against("host-gw (pod MTU 1450)", rows[4].Median)
	for i := range rows {
		rows[i].Load = load
	}
	fmt.Print(testenv.RowsMarkdown(rows))
	fmt.Printf("cross-node pod-to-pod (%s), medians of %d interleaved rounds: throughput host-gw %.2f Gbit/s, vxlan %.2f Gbit/s, ratio %.2fx (goal %.2fx); RTT host-gw %.1f µs, vxlan %.1f µs (as speed %.2fx)\n",
		lab, rounds, rows[0].Median, rows[1].Median, rows[1].Ratio, tunBenchGoal, rows[4].Median, rows[5].Median, rows[4].Median/rows[5].Median)
	if f := os.Getenv("TUNNEL_BENCH_OUT"); f != "" {
		js, _ := json.Marshal(rows)
		if err := os.WriteFile(f, js, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// tunBench is the benchmark's lab: nodes 1 and 2 of the tunnel lab on
// IPv4 host-gw or VXLAN (mode), a pod pair at MTU 1450 (p1 to p2 at a2) and
// one at 1500 (q1 to b2), an iperf3 server in each server pod.
type tunBench struct {
	t          *testing.T
	mode       func(tunnel bool)
	modeArgs   func(tunnel, variant bool, extra []string) // mode with more `peers` arguments (TestTunnelBenchAB's B)
	p1, p2, q1 ns.NetNS
	q2         ns.NetNS
	n1, n2     ns.NetNS // the nodes
	router     ns.NetNS
	a2, b2     net.IP
	iperfArgs  []string // every stream's (the node-CPU switch's affinity)
}

func newTunBench(t *testing.T) *tunBench {
	t.Helper()
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatal("iperf3 not installed")
	}
	lab := newTunLab(t)
	n1, n2 := lab.nodes[0], lab.nodes[1]
	// IPv4 only: host-gw has no IPv6 node address to route via.
	var peers []agent.Peer
	for i, e := range []*testenv.Env{n1, n2} {
		p4, _ := tunPods(i)
		e.IPAM["ranges"] = [][]map[string]string{{{"subnet": p4}}}
		peers = append(peers, agent.Peer{NodeIP: tunNode[i].String(), PodCIDRs: []string{p4}})
	}
	pf := filepath.Join(t.TempDir(), "peers4.json")
	pj, _ := json.Marshal(peers)
	if err := os.WriteFile(pf, pj, 0o600); err != nil {
		t.Fatal(err)
	}
	b := &tunBench{t: t, n1: n1.Node, n2: n2.Node, router: lab.router}
	b.modeArgs = func(tunnel, variant bool, extra []string) {
		m := "off"
		if tunnel {
			m = "vxlan"
		}
		args := []string{"peers", "--peers", pf, "--cni-conf-dir", t.TempDir(), "--tunnel", m}
		if variant {
			args = append(args, extra...)
		}
		for _, e := range []*testenv.Env{n1, n2} {
			if _, err := e.MasqAgent(args...); err != nil {
				t.Fatal(err)
			}
		}
	}
	b.mode = func(tunnel bool) { b.modeArgs(tunnel, false, nil) }
	b.mode(true)
	pair := func(mtu int, name string) (ns.NetNS, ns.NetNS, net.IP) {
		for _, e := range []*testenv.Env{n1, n2} {
			e.Extra["mtu"] = mtu
		}
		c, s := n1.NewPod(), n2.NewPod()
		n1.CleanupDel(c, name+"c")
		n2.CleanupDel(s, name+"s")
		n1.Add(c, name+"c")
		a := v4Of(t, n2.Add(s, name+"s"))
		if err := s.Do(func(ns.NetNS) error {
			srv := exec.Command("iperf3", "-s", "-p", "5201")
			if err := srv.Start(); err != nil {
				return err
			}
			t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return c, s, a
	}
	b.p1, b.p2, b.a2 = pair(1450, "b")
	b.q1, b.q2, b.b2 = pair(1500, "m")
	if tunBenchNodeCPUs() {
		b.pinNodes()
	}
	time.Sleep(300 * time.Millisecond)
	return b
}

// iperf is one iperf3 TCP stream of secs from c to to, in Gbit/s received.
func (b *tunBench) iperf(c ns.NetNS, to net.IP, secs int) float64 {
	return b.iperfJSON(c, to, secs).End.SumReceived.BitsPerSecond / 1e9
}

// iperfJSON runs the stream with extra iperf3 arguments, returning its report.
func (b *tunBench) iperfJSON(c ns.NetNS, to net.IP, secs int, extra ...string) *testenv.IperfJSON {
	var out []byte
	err := c.Do(func(ns.NetNS) error {
		var err error
		args := append([]string{"-c", to.String(), "-p", "5201", "-t", strconv.Itoa(secs), "-J"}, b.iperfArgs...)
		args = append(args, extra...)
		out, err = exec.Command("iperf3", args...).Output()
		return err
	})
	if err != nil {
		b.t.Fatalf("iperf3: %v\n%s", err, out)
	}
	j, err := testenv.ParseIperf(out, "iperf3")
	if err != nil {
		b.t.Fatal(err)
	}
	return j
}

// TestTunnelProfile (go test -tags tunnelbench -run TestTunnelProfile): the
// benchmark's lab held while one iperf3 stream (MTU 1450 pods) runs
// TUNNEL_PROFILE_SECS (10) in each mode, host-gw then VXLAN
// (TUNNEL_PROFILE_ROUNDS times; TUNNEL_PROFILE_IPERF_ARGS adds iperf3
// client arguments, e.g. "-A 0,1"), and TUNNEL_PROFILE_CMD runs by sh -c
// beside it, from the host's netns, with TUNNEL_MODE (host-gw or vxlan) and
// TUNNEL_PROFILE_SECS in its environment, and the netns paths
// TUNNEL_NODE1_NS, TUNNEL_NODE2_NS (sender's, receiver's node),
// TUNNEL_CLIENT_NS, TUNNEL_SERVER_NS (nsenter --net=): a perf record or a
// bpftrace count of where the time goes (docs/performance.md#tunnel). Its
// output is logged with the stream's throughput.
func TestTunnelProfile(t *testing.T) {
	secs, rounds := benchEnvInt("TUNNEL_PROFILE_SECS", 10), benchEnvInt("TUNNEL_PROFILE_ROUNDS", 1)
	probe := os.Getenv("TUNNEL_PROFILE_CMD")
	b := newTunBench(t)
	for r := 0; r < rounds; r++ {
		for _, tunnel := range []bool{false, true} {
			b.mode(tunnel)
			name := "host-gw"
			if tunnel {
				name = "vxlan"
			}
			var cmd *exec.Cmd
			var out strings.Builder
			if probe != "" {
				cmd = exec.Command("sh", "-c", probe)
				cmd.Env = append(os.Environ(), "TUNNEL_MODE="+name, "TUNNEL_PROFILE_SECS="+strconv.Itoa(secs),
					"TUNNEL_NODE1_NS="+b.n1.Path(), "TUNNEL_NODE2_NS="+b.n2.Path(),
					"TUNNEL_CLIENT_NS="+b.p1.Path(), "TUNNEL_SERVER_NS="+b.p2.Path())
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Start(); err != nil {
					t.Fatalf("TUNNEL_PROFILE_CMD: %v", err)
				}
			}
			j := b.iperfJSON(b.p1, b.a2, secs, strings.Fields(os.Getenv("TUNNEL_PROFILE_IPERF_ARGS"))...)
			if cmd != nil {
				if err := cmd.Wait(); err != nil {
					t.Errorf("TUNNEL_PROFILE_CMD (%s): %v", name, err)
				}
			}
			var retr int64
			if r := j.End.SumSent.Retransmits; r != nil {
				retr = *r
			}
			if j.End.SumReceived.Bytes == 0 {
				t.Fatalf("%s: the stream moved nothing", name)
			}
			g, cpu := j.End.SumReceived.BitsPerSecond/1e9, j.End.CPUUtilization
			// The two processes' CPU (with the softirq work done in their
			// context) per Gbit: the path's cost, whatever else runs.
			t.Logf("%s: %.2f Gbit/s, CPU client %.0f%% server %.0f%%, %.1f ms CPU per Gbit, %d retransmits (load %s)\n%s",
				name, g, cpu.HostTotal, cpu.RemoteTotal, 10*(cpu.HostTotal+cpu.RemoteTotal)/g, retr, testenv.Loadavg(), out.String())
		}
	}
}
