//go:build masqbench

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestMasqBench compares egress masquerade in BPF (ebpf-cni ipMasq, node A
// of the lab) with iptables MASQUERADE (the reference ptp plugin with
// ipMasq, node B) in the same run: iperf3 throughput from a pod to the
// outside server, and new TCP connections per second (connect, read the
// answer, close; one client, sequential). A benchmark, not a test: built only
// with -tags masqbench (make bench-masq), so the test suite never skips it.
func TestMasqBench(t *testing.T) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatal("iperf3 not installed (make bench-masq installs it)")
	}
	cmd := exec.Command("go", "build", "-o", testenv.BinDir+"/", "github.com/containernetworking/plugins/plugins/main/ptp")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build ptp: %v\n%s", err, out)
	}
	lab := newMasqLab(t)
	lab.b.Extra = map[string]any{"type": "ptp", "ipMasq": true}
	lab.b.IPAM["routes"] = []map[string]string{{"dst": "0.0.0.0/0"}} // ebpf-cni adds the default route itself
	pa, pb := lab.a.NewPod(), lab.b.NewPod()
	lab.a.CleanupDel(pa, "bench-a")
	lab.a.Add(pa, "bench-a")
	lab.b.CleanupDel(pb, "bench-b")
	lab.b.Add(pb, "bench-b")

	serve(t, lab.out, 7000, "outside")
	var srv *exec.Cmd
	err := lab.out.Do(func(ns.NetNS) error {
		srv = exec.Command("iperf3", "-s", "-p", "5201")
		return srv.Start()
	})
	if err != nil {
		t.Fatalf("iperf3 server: %v", err)
	}
	t.Cleanup(func() {
		srv.Process.Kill()
		srv.Wait()
	})
	time.Sleep(300 * time.Millisecond)

	// Both must really be masqueraded.
	mustAsk(t, pa, "tcp", hp(outsideIP, 7000), 0, "outside", labNodeA)
	mustAsk(t, pb, "tcp", hp(outsideIP, 7000), 0, "outside", labNodeB)

	iperf := func(pod ns.NetNS) float64 {
		t.Helper()
		var out []byte
		err := pod.Do(func(ns.NetNS) error {
			var err error
			out, err = exec.Command("iperf3", "-c", outsideIP.String(), "-p", "5201", "-t", "3", "-J").Output()
			return err
		})
		if err != nil {
			t.Fatalf("iperf3: %v\n%s", err, out)
		}
		var r struct {
			End struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("iperf3 output: %v", err)
		}
		return r.End.SumReceived.BitsPerSecond / 1e9
	}
	connRate := func(pod ns.NetNS) float64 {
		t.Helper()
		n := 0
		var d time.Duration
		err := pod.Do(func(ns.NetNS) error {
			start := time.Now()
			for time.Since(start) < 2*time.Second {
				c, err := net.DialTimeout("tcp4", hp(outsideIP, 7000), 2*time.Second)
				if err != nil {
					return err
				}
				c.SetDeadline(time.Now().Add(2 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				c.Close()
				if err != nil || !strings.HasPrefix(line, "outside ") {
					return fmt.Errorf("answer %q: %v", line, err)
				}
				n++
			}
			d = time.Since(start)
			return nil
		})
		if err != nil {
			t.Fatalf("connection %d: %v", n+1, err)
		}
		return float64(n) / d.Seconds()
	}

	type result struct{ gbps, cps []float64 }
	res := map[string]*result{"ebpf-cni ipMasq (BPF)": {}, "ptp ipMasq (iptables MASQUERADE)": {}}
	pods := map[string]ns.NetNS{"ebpf-cni ipMasq (BPF)": pa, "ptp ipMasq (iptables MASQUERADE)": pb}
	order := []string{"ebpf-cni ipMasq (BPF)", "ptp ipMasq (iptables MASQUERADE)"}
	for round := 0; round < 2; round++ {
		for _, k := range order {
			r := res[k]
			r.gbps = append(r.gbps, iperf(pods[k]))
			r.cps = append(r.cps, connRate(pods[k]))
		}
	}
	best := func(v []float64) float64 {
		m := 0.0
		for _, x := range v {
			if x > m {
				m = x
			}
		}
		return m
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%-36s %22s %28s\n", "pod -> outside (node masquerades)", "TCP Gbit/s (rounds)", "new conn/s (rounds)")
	for _, k := range order {
		r := res[k]
		fmt.Fprintf(&sb, "%-36s %6.2f (%5.2f, %5.2f) %12.0f (%6.0f, %6.0f)\n", k, best(r.gbps), r.gbps[0], r.gbps[1],
			best(r.cps), r.cps[0], r.cps[1])
	}
	t.Log(sb.String())
	if out, err := lab.a.MasqAgent("dump", "nat", "-o", "json"); err == nil {
		var d struct {
			Flows []struct {
				Closing bool `json:"closing"`
			} `json:"flows"`
			Counters map[string]uint64 `json:"counters"`
		}
		if json.Unmarshal(out, &d) == nil {
			closing := 0
			for _, f := range d.Flows {
				if f.Closing {
					closing++
				}
			}
			t.Logf("node A: %d flows in cni_snat (%d closing); counters %v", len(d.Flows), closing, d.Counters)
		}
	}
}
