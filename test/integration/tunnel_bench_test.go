//go:build tunnelbench

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnelBench (make bench-tunnel): iperf3 throughput from a pod of node 1 to a pod of node 2 (one subnet, the
// tunnel lab) routed host-gw and through the VXLAN tunnel, rounds
// interleaved, the same pods (MTU 1450 both ways, the tunnel's).
func TestTunnelBench(t *testing.T) {
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
	mode := func(args ...string) {
		for _, e := range []*testenv.Env{n1, n2} {
			if _, err := e.MasqAgent(append([]string{"peers", "--peers", pf, "--cni-conf-dir", t.TempDir()}, args...)...); err != nil {
				t.Fatal(err)
			}
		}
	}
	mode("--tunnel", "vxlan")
	for _, e := range []*testenv.Env{n1, n2} {
		e.Extra["mtu"] = 1450
	}
	p1, p2 := n1.NewPod(), n2.NewPod()
	n1.CleanupDel(p1, "b1")
	n2.CleanupDel(p2, "b2")
	n1.Add(p1, "b1")
	a2 := v4Of(t, n2.Add(p2, "b2"))
	var srv *exec.Cmd
	if err := p2.Do(func(ns.NetNS) error {
		srv = exec.Command("iperf3", "-s", "-p", "5201")
		return srv.Start()
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	time.Sleep(300 * time.Millisecond)
	iperf := func() float64 {
		var out []byte
		err := p1.Do(func(ns.NetNS) error {
			var err error
			out, err = exec.Command("iperf3", "-c", a2.String(), "-p", "5201", "-t", "3", "-J").Output()
			return err
		})
		if err != nil {
			t.Fatalf("iperf3: %v\n%s", err, out)
		}
		j, err := testenv.ParseIperf(out, "iperf3")
		if err != nil {
			t.Fatal(err)
		}
		return j.End.SumReceived.BitsPerSecond / 1e9
	}
	const rounds = 5
	var gw, tun []float64
	for r := 0; r < rounds; r++ {
		mode("--tunnel", "off")
		gw = append(gw, iperf())
		mode("--tunnel", "vxlan")
		tun = append(tun, iperf())
	}
	med := func(v []float64) float64 { s := append([]float64{}, v...); sort.Float64s(s); return s[len(s)/2] }
	mg, mt := med(gw), med(tun)
	fmt.Printf("cross-node pod-to-pod TCP throughput, medians of %d interleaved 3 s iperf3 runs: host-gw %.2f Gbit/s, vxlan tunnel %.2f Gbit/s, ratio %.2fx\n", rounds, mg, mt, mt/mg)
	t.Logf("host-gw %v\ntunnel %v", gw, tun)
}
