//go:build latbench

package integration

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestP2PLatencyBench measures same-node pod-to-pod request/response
// latency through ebpf-cni's fast path: a TCP client in one pod sends one
// byte and waits for the server in the other pod to echo it, LAT_ROUNDS
// (default 20000) times per round, LAT_REPEAT (default 3) rounds; and Ping
// RTTs; with the kernel's BPF run-time statistics on, the mean time
// cni_from_container takes per packet. Run with: go test -tags latbench -count=1 -run TestP2PLatencyBench -v ./test/
func TestP2PLatencyBench(t *testing.T) {
	rounds := envInt("LAT_ROUNDS", 20000)
	repeat := envInt("LAT_REPEAT", 3)
	e := testenv.New(t)
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "a")
	e.CleanupDel(b, "b")
	e.Add(a, "a")
	bIP, _ := testenv.PodIPs(t, e.Add(b, "b"))

	var ln net.Listener
	if err := b.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp4", net.JoinHostPort(bIP.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acceptEach(ln, func(c net.Conn) { io.Copy(c, c) })
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("enable BPF statistics: %v", err)
	}
	defer stats.Close()
	dp, err := datapath.Open(e.PinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	progStat := func() (time.Duration, uint64) {
		st, err := dp.FromContainer.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st.Runtime, st.RunCount
	}
	for r := 0; r < repeat; r++ {
		rt0, n0 := progStat()
		var lat []time.Duration
		err := a.Do(func(ns.NetNS) error {
			c, err := net.Dial("tcp4", ln.Addr().String())
			if err != nil {
				return err
			}
			defer c.Close()
			c.(*net.TCPConn).SetNoDelay(true)
			buf := []byte{1}
			for i := 0; i < rounds; i++ {
				t0 := time.Now()
				if _, err := c.Write(buf); err != nil {
					return err
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					return err
				}
				lat = append(lat, time.Since(t0))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		var sum time.Duration
		for _, d := range lat {
			sum += d
		}
		rt1, n1 := progStat()
		t.Logf("TCP 1-byte RR round %d: n=%d mean %.1f µs p50 %.1f µs p90 %.1f µs p99 %.1f µs; cni_from_container %.1f ns/run over %d runs",
			r+1, len(lat), us(sum/time.Duration(len(lat))), us(lat[len(lat)/2]), us(lat[len(lat)*9/10]), us(lat[len(lat)*99/100]),
			float64(rt1-rt0)/float64(n1-n0), n1-n0)
	}
	if err := a.Do(func(ns.NetNS) error {
		out, err := execOut("ping", "-q", "-c", fmt.Sprint(rounds/4), "-i", "0", bIP.String())
		t.Logf("Ping: %s", lastLine(out))
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func execOut(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
