package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
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

// procs tracks every process started in a pod, so cleanup can kill them.
type procs struct {
	mu sync.Mutex
	m  map[*proc]struct{}
}

type proc struct {
	desc           string
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	err            error
}

func newProcs() *procs { return &procs{m: map[*proc]struct{}{}} }

// start runs a command in a network namespace: it is forked from the
// goroutine's locked thread inside n.Do, so it is born in n.
func (ps *procs) start(ctx context.Context, n ns.NetNS, name string, args ...string) (*proc, error) {
	p := &proc{desc: name + " " + strings.Join(args, " "), done: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, name, args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	// Killed if we die without cleaning up (the forking thread stays alive
	// as long as the process does: ns.Do returns it to the scheduler).
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var startErr error
	if err := n.Do(func(ns.NetNS) error {
		startErr = p.cmd.Start()
		return nil
	}); err != nil {
		return nil, err
	}
	if startErr != nil {
		return nil, fmt.Errorf("start %s: %w", p.desc, startErr)
	}
	ps.m[p] = struct{}{}
	go func() {
		p.err = p.cmd.Wait()
		ps.mu.Lock()
		delete(ps.m, p)
		ps.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// wait waits for the process to exit, killing it after timeout.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s: still running after %s, killed\nstdout: %s\nstderr: %s", p.desc, timeout,
			tail(p.stdout.String()), tail(p.stderr.String()))
	}
	if p.err != nil {
		return fmt.Errorf("%s: %v\nstdout: %s\nstderr: %s", p.desc, p.err, tail(p.stdout.String()), tail(p.stderr.String()))
	}
	return nil
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// killAll kills every process still running and waits for them.
func (ps *procs) killAll() int {
	ps.mu.Lock()
	var all []*proc
	for p := range ps.m {
		all = append(all, p)
	}
	ps.mu.Unlock()
	for _, p := range all {
		p.kill()
	}
	return len(all)
}

func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// waitListen waits until the process has a listening IPv4 TCP socket on port,
// read from its own /proc/PID/net/tcp (its netns's table), so the server is
// never probed with a connection that would count as its one test.
func waitListen(p *proc, port int) error {
	want := fmt.Sprintf(":%04X", port)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before listening: %v\nstdout: %s\nstderr: %s", p.desc, p.err,
				tail(p.stdout.String()), tail(p.stderr.String()))
		default:
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", p.cmd.Process.Pid))
		if err == nil {
			sc := bufio.NewScanner(bytes.NewReader(data))
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == "0A" {
					return nil
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s: not listening on port %d after 5 s", p.desc, port)
}

// iperfJSON is the part of iperf3 -J output the benchmark reads.
type iperfJSON struct {
	Intervals []struct {
		Sum iperfSum `json:"sum"`
	} `json:"intervals"`
	End struct {
		SumSent     iperfSum `json:"sum_sent"`
		SumReceived iperfSum `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

type iperfSum struct {
	Start         float64 `json:"start"`
	End           float64 `json:"end"`
	Seconds       float64 `json:"seconds"`
	Bytes         uint64  `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Retransmits   *int64  `json:"retransmits"`
	Sender        bool    `json:"sender"`
}

func parseIperf(out []byte, who string) (*iperfJSON, error) {
	var j iperfJSON
	if err := json.Unmarshal(out, &j); err != nil {
		return nil, fmt.Errorf("%s: output is not iperf3 JSON: %v\n%s", who, err, tail(string(out)))
	}
	if j.Error != "" {
		return nil, fmt.Errorf("%s: iperf3 error: %s", who, j.Error)
	}
	return &j, nil
}

func intervals(j *iperfJSON) []interval {
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
	p, err := b.procs.start(ctx, from.ns, "ping", "-n", "-c", strconv.Itoa(count),
		"-i", fmt.Sprintf("%.1f", pingInterval.Seconds()), "-W", "2", to.String())
	if err != nil {
		return nil, err
	}
	timeout := time.Duration(count)*pingInterval + 10*time.Second
	err = p.wait(timeout)
	// ping exits 1 when some replies are missing: that is a result, not a failure.
	if ee, ok := p.err.(*exec.ExitError); ok && ee.ExitCode() == 1 && ctx.Err() == nil {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	return parsePing(p.stdout.String(), count)
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
// with pings from the peer to the limited pod while it runs.
func (b *bench) measure(ctx context.Context, c *config, limited *pod, rateBps uint64, dir string) (*run, error) {
	sender, receiver := limited, c.peer
	if dir == "ingress" {
		sender, receiver = c.peer, limited
	}
	secs := int(b.opts.duration / time.Second)
	r := &run{
		Config: c.key, RateBps: rateBps, Direction: dir, Seconds: secs,
		Sender:   fmt.Sprintf("%s %s", sender.name, sender.ip),
		Receiver: fmt.Sprintf("%s %s", receiver.name, receiver.ip),
		Started:  time.Now().UTC().Format(time.RFC3339),
		LoadAvg:  loadavg(),
	}
	srv, err := b.procs.start(ctx, receiver.ns, "iperf3", "-s", "-1", "-J", "-i", "1",
		"-B", receiver.ip.String(), "-p", strconv.Itoa(iperfPort))
	if err != nil {
		return nil, err
	}
	defer srv.kill() // no-op once it exited
	if err := waitListen(srv, iperfPort); err != nil {
		return nil, err
	}
	drops0, err := b.limiterDrops(c)
	if err != nil {
		return nil, err
	}
	cli, err := b.procs.start(ctx, sender.ns, "iperf3", "-c", receiver.ip.String(), "-p", strconv.Itoa(iperfPort),
		"-t", strconv.Itoa(secs), "-i", "1", "-J", "--connect-timeout", "5000")
	if err != nil {
		return nil, err
	}
	defer cli.kill()

	// Pings from the peer to the limited pod while the stream runs: from
	// loadPingDelay until about half a second before the end.
	n := int((b.opts.duration - loadPingDelay - 500*time.Millisecond) / pingInterval)
	n = min(n, b.opts.loadPings)
	var pingErr error
	if err := sleepCtx(ctx, loadPingDelay); err != nil {
		return nil, err
	}
	r.PingLoad, pingErr = b.ping(ctx, c.peer, limited.ip, n)

	if err := cli.wait(b.opts.duration + 30*time.Second); err != nil {
		return nil, fmt.Errorf("iperf3 client: %w", err)
	}
	if err := srv.wait(15 * time.Second); err != nil {
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

	sj, err := parseIperf(srv.stdout.Bytes(), "iperf3 server (receiver)")
	if err != nil {
		return nil, err
	}
	cj, err := parseIperf(cli.stdout.Bytes(), "iperf3 client (sender)")
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
		return nil, fmt.Errorf("iperf3 server received nothing:\n%s", tail(srv.stdout.String()))
	}
	r.evaluate()
	return r, nil
}
