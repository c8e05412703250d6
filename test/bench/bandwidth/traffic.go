package bandwidth

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

const (
	iperfPort    = 5201
	pingInterval = 200 * time.Millisecond
	// loadPingDelay lets TCP leave slow start before the pings under load.
	loadPingDelay = time.Second
	// fullInterval is the shortest receiver interval counted as a 1 s
	// interval: iperf3 ends a run with a stub of a few milliseconds (or the
	// last fraction of a second of a queue draining), and under CPU load its
	// timer makes some intervals 0.9 or 1.1 s long (those count, their
	// rate is over their own length).
	fullInterval = 0.5
)

func intervals(j *testenv.IperfJSON) []interval {
	var out []interval
	for _, iv := range j.Intervals {
		s := iv.Sum
		out = append(out, interval{Start: s.Start, End: s.End, Seconds: s.Seconds, Bytes: s.Bytes,
			Bps: s.BitsPerSecond, Retransmits: s.Retransmits})
	}
	return out
}

// ping sends count pings from one pod to an address and returns the RTTs.
func (b *bench) ping(ctx context.Context, from *pod, to net.IP, count int) (*pingStats, error) {
	p, err := b.procs.Start(ctx, from.ns, "ping", "-n", "-c", strconv.Itoa(count),
		"-i", fmt.Sprintf("%.1f", pingInterval.Seconds()), "-W", "2", to.String())
	if err != nil {
		return nil, err
	}
	timeout := time.Duration(count)*pingInterval + 10*time.Second
	err = p.Wait(timeout)
	// ping exits 1 when some replies are missing: that is a result, not a failure.
	if ee, ok := p.Err().(*exec.ExitError); ok && ee.ExitCode() == 1 && ctx.Err() == nil {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	return parsePing(p.Stdout.String(), count)
}

func parsePing(out string, count int) (*pingStats, error) {
	s := &pingStats{Sent: count, RTTsMs: []float64{}}
	for _, line := range strings.Split(out, "\n") {
		if i := strings.Index(line, "time="); i >= 0 && strings.Contains(line, "bytes from") {
			f := strings.Fields(line[i+len("time="):])
			if len(f) > 0 {
				if v, err := strconv.ParseFloat(f[0], 64); err == nil {
					s.RTTsMs = append(s.RTTsMs, v)
				}
			}
		}
		if strings.Contains(line, "packets transmitted") {
			var tx, rx int
			if _, err := fmt.Sscanf(line, "%d packets transmitted, %d received", &tx, &rx); err == nil {
				s.Sent = tx
			}
		}
	}
	s.Received = len(s.RTTsMs)
	if s.Received == 0 {
		return s, nil
	}
	s.summarize()
	return s, nil
}

// measure runs one TCP stream through the limited pod in one direction,
// with pings to the limited pod while it runs.
func (b *bench) measure(ctx context.Context, c *config, limited *pod, rateBps uint64, dir string) (*run, error) {
	sender, receiver := limited, c.peer
	switch dir {
	case "ingress":
		sender, receiver = c.peer, limited
	case "remote":
		sender, receiver = c.remote, limited
	}
	// Pings travel the stream's path: from the remote host for remote
	// streams, else from the peer pod to the limited one.
	pinger := c.peer
	if dir == "remote" {
		pinger = c.remote
	}
	secs := int(b.opts.duration / time.Second)
	r := &run{
		Config: c.key, RateBps: rateBps, Direction: dir, Seconds: secs,
		Sender:   fmt.Sprintf("%s %s", sender.name, sender.ip),
		Receiver: fmt.Sprintf("%s %s", receiver.name, receiver.ip),
		Started:  time.Now().UTC().Format(time.RFC3339),
		LoadAvg:  testenv.Loadavg(),
	}
	srv, err := b.procs.Start(ctx, receiver.ns, "iperf3", "-s", "-1", "-J", "-i", "1",
		"-B", receiver.ip.String(), "-p", strconv.Itoa(iperfPort))
	if err != nil {
		return nil, err
	}
	defer srv.Kill() // no-op once it exited
	if err := testenv.WaitListen(srv, iperfPort); err != nil {
		return nil, err
	}
	drops0, err := b.limiterDrops(c)
	if err != nil {
		return nil, err
	}
	cli, err := b.procs.Start(ctx, sender.ns, "iperf3", "-c", receiver.ip.String(), "-p", strconv.Itoa(iperfPort),
		"-t", strconv.Itoa(secs), "-i", "1", "-J", "--connect-timeout", "5000")
	if err != nil {
		return nil, err
	}
	defer cli.Kill()

	// Pings from the peer to the limited pod while the stream runs: from
	// loadPingDelay until about half a second before the end.
	n := int((b.opts.duration - loadPingDelay - 500*time.Millisecond) / pingInterval)
	n = min(n, b.opts.loadPings)
	var pingErr error
	if err := testenv.SleepCtx(ctx, loadPingDelay); err != nil {
		return nil, err
	}
	r.PingLoad, pingErr = b.ping(ctx, pinger, limited.ip, n)

	if err := cli.Wait(b.opts.duration + 30*time.Second); err != nil {
		return nil, fmt.Errorf("iperf3 client: %w", err)
	}
	if err := srv.Wait(15 * time.Second); err != nil {
		return nil, fmt.Errorf("iperf3 server: %w", err)
	}
	if pingErr != nil {
		return nil, fmt.Errorf("ping under load: %w", pingErr)
	}
	drops1, err := b.limiterDrops(c)
	if err != nil {
		return nil, err
	}
	r.LimiterDrops = drops1 - drops0

	sj, err := testenv.ParseIperf(srv.Stdout.Bytes(), "iperf3 server (receiver)")
	if err != nil {
		return nil, err
	}
	cj, err := testenv.ParseIperf(cli.Stdout.Bytes(), "iperf3 client (sender)")
	if err != nil {
		return nil, err
	}
	r.ReceiverIntervals = intervals(sj)
	r.SenderIntervals = intervals(cj)
	rcv := sj.End.SumReceived
	r.ReceivedBytes, r.ReceivedSeconds, r.ReceivedBps = rcv.Bytes, rcv.Seconds, rcv.BitsPerSecond
	r.ClientSumReceivedBps = cj.End.SumReceived.BitsPerSecond
	r.SentBytes = cj.End.SumSent.Bytes
	if cj.End.SumSent.Retransmits != nil {
		r.Retransmits = *cj.End.SumSent.Retransmits
	}
	if r.ReceivedBytes == 0 || len(r.ReceiverIntervals) == 0 {
		return nil, fmt.Errorf("iperf3 server received nothing:\n%s", testenv.Tail(srv.Stdout.String()))
	}
	r.evaluate()
	return r, nil
}
