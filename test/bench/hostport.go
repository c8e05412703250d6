package main

// The hostPort scale benchmark: ADD latency and the rate
// of new TCP connections through a hostPort, from a remote host, with 1, 200
// and 1000 pods holding hostPorts, for ebpf-cni and for the reference
// ptp+portmap chain in the same run, beside a raw veth pair.
//
// Topology: a "remote" netns is routed to the node netns over a veth (the
// node's uplink, 198.51.100.1/24). Every pod of a configuration maps its
// own hostPort (hostPortBase + n) to port 80; the first pod serves. The
// baseline is a separate pair of namespaces joined by a bare veth, the
// client dialling the server's address directly: no CNI, no NAT, no
// forwarding. A connection is dial, read the server's one byte until EOF
// (the server closes first, so the client side keeps no TIME_WAIT), close.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

const (
	hostPortBase  = 20000 // population pods: hostPortBase + n
	hostPortTimed = 40000 // timed ADD+DEL pods: hostPortTimed + n
)

var (
	benchUplink4 = net.ParseIP("198.51.100.1").To4()
	benchRemote4 = net.ParseIP("198.51.100.2").To4()
	rawClient4   = net.ParseIP("203.0.113.1").To4()
	rawServer4   = net.ParseIP("203.0.113.2").To4()
)

// hpResults is the hostPort part of the JSON results.
type hpResults struct {
	Scale    []int     `json:"scale"`
	RefScale []int     `json:"referenceScale"`
	ConnSecs float64   `json:"connSeconds"`
	Workers  int       `json:"workers"`
	Reps     int       `json:"timedRepsPerPoint"`
	Points   []hpPoint `json:"points"`
}

type hpPoint struct {
	Config      string    `json:"config"`
	Pods        int       `json:"podsWithHostPorts"`
	AddMedianMs float64   `json:"addMedianMs"`
	AddP90Ms    float64   `json:"addP90Ms"`
	DelMedianMs float64   `json:"delMedianMs"`
	ConnsPerSec float64   `json:"connsPerSec"`
	ConnErrors  int64     `json:"connErrors"`
	RawPerSec   float64   `json:"rawConnsPerSec"`
	VsRaw       float64   `json:"vsRaw"`
	ConnSamples []float64 `json:"connsPerSecSamples"`
	RawSamples  []float64 `json:"rawConnsPerSecSamples"`
	AddSamples  []float64 `json:"addSamplesMs"`
	DelSamples  []float64 `json:"delSamplesMs"`
	// Load1 is the 1-minute load average when the point was measured.
	Load1 float64 `json:"load1"`
	// ebpf-cni's own phase timings (EBPF_CNI_TRACE), medians.
	AddPhases []phase `json:"addPhaseMediansMs,omitempty"`
	DelPhases []phase `json:"delPhaseMediansMs,omitempty"`
}

// connRounds is how many times each point alternates hostPort and raw runs.
const connRounds = 3

// hpEnv is the hostPort benchmark's extra topology.
type hpEnv struct {
	remote, rawClient, rawServer ns.NetNS
}

// setupHostPort creates the remote netns, the node's uplink and the raw pair.
func (b *bench) setupHostPort() error {
	var err error
	h := &hpEnv{}
	b.hp = h
	if h.remote, err = testenv.NewNetNS(filepath.Join(b.nsDir, "remote")); err != nil {
		return err
	}
	if h.rawClient, err = testenv.NewNetNS(filepath.Join(b.nsDir, "raw-client")); err != nil {
		return err
	}
	if h.rawServer, err = testenv.NewNetNS(filepath.Join(b.nsDir, "raw-server")); err != nil {
		return err
	}
	if err := testenv.VethBetween(b.node, "uplink0", benchUplink4, h.remote, "eth0", benchRemote4); err != nil {
		return fmt.Errorf("node uplink: %w", err)
	}
	if err := testenv.VethBetween(h.rawClient, "eth0", rawClient4, h.rawServer, "eth0", rawServer4); err != nil {
		return fmt.Errorf("raw veth pair: %w", err)
	}
	// The remote reaches every node address via the uplink.
	return testenv.RouteVia(h.remote, "eth0", benchUplink4)
}

func (b *bench) hpCapArgs(port int) string {
	js, _ := json.Marshal(map[string]any{"portMappings": []map[string]any{{"hostPort": port, "containerPort": 80, "protocol": "tcp"}}})
	return string(js)
}

// server accepts on :80 in netns, writes one byte and closes each connection.
type server struct{ ln net.Listener }

func startServer(netns ns.NetNS) (*server, error) {
	var ln net.Listener
	err := netns.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp4", ":80")
		return err
	})
	if err != nil {
		return nil, err
	}
	go func() {
		one := []byte{'x'}
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			c.Write(one)
			c.Close()
		}
	}()
	return &server{ln}, nil
}

func (s *server) close() { s.ln.Close() }

// connRate opens connections from netns to addr with workers in parallel
// for d and returns connections per second and the number of failures.
func connRate(ctx context.Context, netns ns.NetNS, addr string, workers int, d time.Duration) (float64, int64, error) {
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Locked in the client netns for the whole loop: every socket is born there.
			errc <- netns.Do(func(ns.NetNS) error {
				buf := make([]byte, 8)
				dialer := net.Dialer{Timeout: 2 * time.Second}
				for time.Now().Before(deadline) && ctx.Err() == nil {
					c, err := dialer.Dial("tcp4", addr)
					if err != nil {
						failed.Add(1)
						continue
					}
					c.SetDeadline(time.Now().Add(2 * time.Second))
					n, err := io.ReadFull(c, buf[:1])
					if err == nil {
						_, err = c.Read(buf) // EOF: the server closed
					}
					c.Close()
					if n == 1 && errors.Is(err, io.EOF) {
						ok.Add(1)
					} else {
						failed.Add(1)
					}
				}
				return nil
			})
		}()
	}
	wg.Wait()
	close(errc)
	for e := range errc {
		if e != nil {
			return 0, 0, e
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	el := time.Since(start).Seconds()
	return float64(ok.Load()) / el, failed.Load(), nil
}

// hpConfigs are the two configurations the hostPort benchmark compares.
func (b *bench) hpConfigs() []*config {
	ebpfNet := mustCIDR("10.248.0.0/16")
	pmNet := mustCIDR("10.249.0.0/16")
	return []*config{
		{
			key: "ptp-portmap", label: "ptp+portmap", netName: "bench-ptp-portmap", subnet: pmNet, hostPorts: true,
			list: map[string]any{"plugins": []any{
				map[string]any{"type": "ptp", "ipMasq": false, "ipam": b.hostLocal(pmNet)},
				map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
			}},
		},
		{
			key: "ebpf-hostport", label: "ebpf-cni (portMappings)", netName: "bench-ebpf-hostport", subnet: ebpfNet, hostPorts: true,
			list: map[string]any{"plugins": []any{map[string]any{
				"type": "ebpf-cni", "pinDir": b.pinDir, "stateDir": b.state, "ipam": b.hostLocal(ebpfNet), "maxPods": b.maxPods(),
				"capabilities": map[string]bool{"portMappings": true},
			}}},
		},
	}
}

// runHostPort measures every configuration at every scale point. portmap
// goes first: ebpf-cni's node hooks stay attached once set up, and its
// uplink program would then see portmap's packets too.
func (b *bench) runHostPort(ctx context.Context, start time.Time) error {
	o := b.opts
	b.res.HostPort = &hpResults{Scale: o.hpScale, RefScale: o.hpRefScale, ConnSecs: o.connSecs, Workers: o.workers, Reps: o.scaleReps}
	d := time.Duration(o.connSecs * float64(time.Second))
	rawSrv, err := startServer(b.hp.rawServer)
	if err != nil {
		return fmt.Errorf("raw server: %w", err)
	}
	defer rawSrv.close()
	raw := func() (float64, error) {
		r, _, err := connRate(ctx, b.hp.rawClient, net.JoinHostPort(rawServer4.String(), "80"), o.workers, d)
		return r, err
	}
	if _, err := raw(); err != nil { // warm-up
		return err
	}
	for _, c := range b.hpCfgs {
		if err := b.hostPortScale(ctx, c, raw, d, start); err != nil {
			return fmt.Errorf("%s: %w", c.label, err)
		}
	}
	return nil
}

func (b *bench) hostPortScale(ctx context.Context, c *config, raw func() (float64, error), d time.Duration, start time.Time) error {
	o := b.opts
	type member struct {
		pod  ns.NetNS
		port int
	}
	var (
		present []member
		srv     *server
	)
	defer func() {
		if srv != nil {
			srv.close()
		}
	}()
	// Untimed population changes run 4 at a time.
	parallel := func(n int, f func(i int) error) error {
		sem := make(chan struct{}, 4)
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			if ctx.Err() != nil {
				break
			}
			wg.Add(1)
			sem <- struct{}{}
			go func(i int) {
				defer wg.Done()
				defer func() { <-sem }()
				errs <- f(i)
			}(i)
		}
		wg.Wait()
		close(errs)
		var all error
		for e := range errs {
			all = errors.Join(all, e)
		}
		return errors.Join(all, ctx.Err())
	}
	var mu sync.Mutex
	seq := 0
	points := o.hpScale
	if c.key == "ptp-portmap" {
		points = o.hpRefScale
	}
	for _, p := range points {
		if len(present) < p {
			logf("hostPort %s: adding pods %d..%d", c.label, len(present)+1, p)
		}
		from := len(present)
		grown := make([]member, p-from)
		err := parallel(p-from, func(i int) error {
			mu.Lock()
			pod, err := b.newPod()
			mu.Unlock()
			if err != nil {
				return err
			}
			port := hostPortBase + from + i
			grown[i] = member{pod, port}
			_, out, _, err := b.cnitoolCap(c, "add", pod, b.hpCapArgs(port))
			if err != nil {
				return err
			}
			return b.checkAdd(c, pod, out)
		})
		present = append(present, grown...)
		if err != nil {
			return fmt.Errorf("growing to %d pods: %w", p, err)
		}
		// The newest pod serves: its rule is the last of portmap's chain, the
		// worst case of a linear rule list (the average is half of it).
		// ebpf-cni's lookups do not depend on which pod it is.
		if srv != nil {
			srv.close()
		}
		newest := present[len(present)-1]
		if srv, err = startServer(newest.pod); err != nil {
			return err
		}
		// Alternate hostPort and raw measurements so drift and background
		// load hit both alike; report the medians.
		target := net.JoinHostPort(benchUplink4.String(), fmt.Sprint(newest.port))
		var rates, raws []float64
		var failed int64
		for r := 0; r < connRounds; r++ {
			rate, f, err := connRate(ctx, b.hp.remote, target, o.workers, d)
			if err != nil {
				return err
			}
			if rate == 0 {
				return fmt.Errorf("no connection through hostPort %s succeeded (%d failed)", target, f)
			}
			failed += f
			rawRate, err := raw()
			if err != nil {
				return err
			}
			rates, raws = append(rates, rate), append(raws, rawRate)
		}
		rate, rawRate := testenv.Median(rates), testenv.Median(raws)
		pt := hpPoint{Config: c.key, Pods: p, ConnsPerSec: rate, ConnErrors: failed, RawPerSec: rawRate, VsRaw: rate / rawRate,
			ConnSamples: rates, RawSamples: raws}

		var adds, dels []float64
		var addPh, delPh [][]phase
		for i := 0; i < o.scaleReps; i++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			mu.Lock()
			pod, err := b.newPod()
			mu.Unlock()
			if err != nil {
				return err
			}
			capArgs := b.hpCapArgs(hostPortTimed + seq)
			seq++
			add, out, addErr, err := b.cnitoolCap(c, "add", pod, capArgs)
			if err != nil {
				return err
			}
			if err := b.checkAdd(c, pod, out); err != nil {
				return err
			}
			del, _, delErr, err := b.cnitoolCap(c, "del", pod, capArgs)
			if err != nil {
				return err
			}
			if ph := parsePhases(addErr, "ADD"); ph != nil {
				addPh = append(addPh, ph)
			}
			if ph := parsePhases(delErr, "DEL"); ph != nil {
				delPh = append(delPh, ph)
			}
			if err := b.removePod(pod); err != nil {
				return err
			}
			adds, dels = append(adds, ms(add)), append(dels, ms(del))
		}
		pt.AddMedianMs, pt.AddP90Ms, pt.DelMedianMs = testenv.Median(adds), testenv.P90(adds), testenv.Median(dels)
		pt.AddSamples, pt.DelSamples, pt.Load1 = adds, dels, testenv.Load1()
		pt.AddPhases, pt.DelPhases = phaseMedians(addPh), phaseMedians(delPh)
		b.res.HostPort.Points = append(b.res.HostPort.Points, pt)
		logf("  hostPort %-24s %4d pods: %7.0f conn/s (raw %7.0f, %.2fx, %d failed), ADD %.1f ms, DEL %.1f ms (%s)",
			c.label, p, rate, rawRate, pt.VsRaw, failed, pt.AddMedianMs, pt.DelMedianMs, time.Since(start).Round(time.Second))
	}
	if srv != nil { // nil when no point was measured (-hostport-ref-scale "")
		srv.close()
		srv = nil
	}
	logf("hostPort %s: deleting %d pods", c.label, len(present))
	err := parallel(len(present), func(i int) error {
		m := present[i]
		if _, _, _, err := b.cnitoolCap(c, "del", m.pod, b.hpCapArgs(m.port)); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		return b.removePod(m.pod)
	})
	if err != nil {
		return err
	}
	return b.assertClean(c)
}

// hostPortMarkdown renders the hostPort section of the report.
func (r *results) hostPortMarkdown() string {
	h := r.HostPort
	if h == nil || len(h.Points) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## hostPort at scale\n\n")
	fmt.Fprintf(&b, "New TCP connections per second from a remote netns to node-uplink-address:hostPort of the most recently added pod (the last rule of portmap's chain; dial, read 1 byte until the server's close, close; %d client goroutines, %d runs of %.0f s alternating with the same client against a raw veth pair: no CNI, no NAT, no forwarding; medians), every pod holding its own hostPort. ADD/DEL: %d timed cycles of one more pod with a hostPort at each point (cnitool wall time, medians).\n\n", h.Workers, connRounds, h.ConnSecs, h.Reps)
	fmt.Fprintf(&b, "| config | pods with hostPorts | ADD median ms | ADD p90 ms | DEL median ms | conn/s via hostPort | raw veth conn/s | × raw | failed |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	pts := append([]hpPoint(nil), h.Points...)
	sort.SliceStable(pts, func(i, j int) bool {
		if pts[i].Pods != pts[j].Pods {
			return pts[i].Pods < pts[j].Pods
		}
		return pts[i].Config < pts[j].Config
	})
	for _, p := range pts {
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.1f | %.1f | %.0f | %.0f | %.2f× | %d |\n",
			r.labels[p.Config], p.Pods, p.AddMedianMs, p.AddP90Ms, p.DelMedianMs, p.ConnsPerSec, p.RawPerSec, p.VsRaw, p.ConnErrors)
	}
	var phased []string
	for _, p := range pts {
		for _, x := range []struct {
			op string
			ph []phase
		}{{"ADD", p.AddPhases}, {"DEL", p.DelPhases}} {
			if len(x.ph) == 0 {
				continue
			}
			var parts []string
			for _, ph := range x.ph {
				parts = append(parts, fmt.Sprintf("%s %.2f", ph.Name, ph.Ms))
			}
			phased = append(phased, fmt.Sprintf("- %s %s, %d pods with hostPorts: %s", r.labels[p.Config], x.op, p.Pods, strings.Join(parts, ", ")))
		}
	}
	if len(phased) > 0 {
		fmt.Fprintf(&b, "\nebpf-cni's own phase timings (EBPF_CNI_TRACE, medians in ms, inside the plugin):\n\n%s\n", strings.Join(phased, "\n"))
	}
	return b.String()
}

// raiseClientLimits widens the client namespaces' port range, so a few
// seconds of connections never run out of source ports.
func raiseClientLimits(netns ns.NetNS) error {
	return netns.Do(func(ns.NetNS) error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("1024 65000"), 0o644)
	})
}
