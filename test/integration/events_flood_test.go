// Events under a flood: a pod floods spoofed frames while an observer
// follows; every drop is accounted for, sent or counted lost.

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
	"github.com/vishvananda/netlink"
)

// floodFrames sends n copies of frame from the pod as fast as one raw
// socket does, and returns the rate it achieved.
func floodFrames(pod ns.NetNS, frame []byte, n int, pps int) (float64, error) {
	var rate float64
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		sa := &syscall.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}
		start := time.Now()
		for i := 0; i < n; i++ {
			if pps > 0 {
				if ahead := time.Duration(i)*time.Second/time.Duration(pps) - time.Since(start); ahead > 0 {
					time.Sleep(ahead)
				}
			}
			if err := syscall.Sendto(fd, frame, 0, sa); err != nil {
				return err
			}
		}
		rate = float64(n) / time.Since(start).Seconds()
		return nil
	})
	return rate, err
}

// TestEventsFlood: a pod floods spoofed frames while an observer follows:
// events past the rate limit are lost, and every drop is accounted for
// (sent + lost = dropped: none is silent); the follower is told of the
// losses; the agent keeps answering observe and /metrics meanwhile.
func TestEventsFlood(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	conf := e.WriteConfDir()
	port := 20000 + int(time.Now().UnixNano()%20000)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	e.StartAgent(conf, "--metrics-addr", addr, "--event-rate", "200", "--event-burst", "100")
	pod := e.NewPod()
	e.CleanupDel(pod, "evf")
	r := e.AddK8s(pod, "evf", "load", "flooder")
	v4, _ := testenv.PodIPs(t, r)
	_, idx := e.HostVeth("evf")
	m := e.Maps()
	podMAC, hostMAC := podMACOf(t, pod, "eth0"), hostMACOf(m, idx)

	// A follower, as a user would run it, through the binary.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var follow *exec.Cmd
	lines := make(chan string, 100000)
	must(t, e.InNode(func() error {
		follow = exec.CommandContext(ctx, filepath.Join(testenv.BinDir, "ebpf-agent"), "observe", "-o", "json", "--state-dir", e.StateDir, "--pod", "load/flooder")
		out, err := follow.StdoutPipe()
		if err != nil {
			return err
		}
		if err := follow.Start(); err != nil {
			return err
		}
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		return nil
	}))
	time.Sleep(300 * time.Millisecond) // the follower subscribes

	c0, err := m.Events().Counters()
	must(t, err)
	before := counter(t, m, idx, maps.DirEgress, maps.ReasonDropSpoofIP).Packets
	frame := ipv4UDPFrame(podMAC, hostMAC, net.ParseIP("10.250.9.98"), testenv.NodeIP4)
	const n = 30000
	type result struct {
		rate float64
		err  error
	}
	done := make(chan result)
	go func() {
		r, err := floodFrames(pod, frame, n, 10000)
		done <- result{r, err}
	}()
	// Responsive while flooded: observe --last and a scrape, each within 2 s.
	for i := 0; i < 3; i++ {
		time.Sleep(500 * time.Millisecond)
		start := time.Now()
		observeJSON(t, e, "--last", "5")
		scrape(t, e, addr)
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("observe --last and a scrape took %v while flooded", d)
		}
	}
	res := <-done
	must(t, res.err)
	rate := res.rate
	waitCounter(t, m, idx, maps.ReasonDropSpoofIP, before+n)
	time.Sleep(1500 * time.Millisecond) // the follower's loss report
	cancel()
	follow.Wait()

	c1, err := m.Events().Counters()
	must(t, err)
	sent, lost := c1.Sent-c0.Sent, (c1.LostRate-c0.LostRate)+(c1.LostRing-c0.LostRing)
	t.Logf("flood: %d frames at %.0f/s; events sent %d, lost %d (rate %d, ring %d)", n, rate, sent, lost, c1.LostRate-c0.LostRate, c1.LostRing-c0.LostRing)
	if sent+lost != n {
		t.Errorf("events sent %d + lost %d = %d, want the %d drops: a drop without event or loss count", sent, lost, sent+lost, n)
	}
	if lost == 0 {
		t.Errorf("a %d-frame flood at %.0f/s over a limit of 200/s per CPU lost no event", n, rate)
	}
	var got, lostReported uint64
	for l := range lines {
		var r events.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("observe -o json line: %q: %v", l, err)
		}
		switch {
		case r.Type == "lost" && r.Lost != nil:
			lostReported += r.Lost.RateLimited + r.Lost.RingFull
		case r.Type == "drop" && r.Pod == "load/flooder" && r.Src == "10.250.9.98":
			got++
		}
	}
	if got == 0 || got > sent {
		t.Errorf("the follower got %d drop events, the datapath sent %d", got, sent)
	}
	if lostReported == 0 {
		t.Errorf("the follower was told of no loss (datapath lost %d)", lost)
	}
	t.Logf("follower: %d events, %d reported lost", got, lostReported)
	// The metrics say the same.
	var metrics strings.Builder
	sc := bufio.NewScanner(strings.NewReader(scrape(t, e, addr)))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "ebpf_cni_events_lost_total") || strings.HasPrefix(sc.Text(), "ebpf_cni_drop_events_total") {
			metrics.WriteString(sc.Text() + "\n")
		}
	}
	if !strings.Contains(metrics.String(), `ebpf_cni_drop_events_total{direction="egress",namespace="load",pod="flooder",reason="drop_spoof_ip"}`) ||
		!strings.Contains(metrics.String(), `ebpf_cni_events_lost_total{cause="rate_limited"}`) {
		t.Errorf("metrics:\n%s", metrics.String())
	}
	_ = v4
	e.MustDel(pod, "evf")
}
