package main

// The hostPort scale benchmark: ADD latency and the rate
// of new TCP connections through a hostPort, from a remote host, with 1, 200
// and 1000 pods holding hostPorts, for ebpf-cni and for the reference
// ptp+portmap chain in the same run, beside two baselines.
//
// Topology: a "remote" netns is routed to each plugin's node netns over a
// veth of its own (the node's uplink: ebpf-cni's 198.51.100.1/24, the
// reference plugins' 198.51.102.1/24). Each plugin has a fresh node netns
// of its own, so no plugin's netfilter hooks (portmap's and ptp's nat
// rules turn conntrack on in their netns, and DEL leaves the chains) tax
// another's packets, and ebpf-cni's uplink hooks see no reference traffic:
// the routed floor, ebpf-cni and the reference chain each run on a node
// with only their own rules (-node-conntrack: and kube-proxy's, in all
// three). Every pod of a configuration maps its
// own hostPort (hostPortBase + n) to port 80; the newest pod serves. The
// raw baseline is a separate pair of namespaces joined by a bare veth, the
// client dialling the server's address directly: no CNI, no NAT, no
// forwarding. The routed baseline has the hostPort path's hops without its
// translation: the same remote netns, over a second veth (eth1) into a node
// netns of its own with no programs, forwarded by plain routing to a pod
// namespace's own address over a veth pair (what ptp sets up, without NAT):
// the floor of a path through a node. A connection is dial, read the
// server's one byte until EOF (the server closes first, so the client side
// keeps no TIME_WAIT), close.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

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
	// The routed baseline: the remote's eth1, the routed node's uplink, its
	// pod veth and the pod (routedNet is routed to the node by the remote).
	routedRemote4 = net.ParseIP("198.51.101.2").To4()
	routedUplink4 = net.ParseIP("198.51.101.1").To4()
	routedGW4     = net.ParseIP("10.234.0.1").To4()
	routedPod4    = net.ParseIP("10.234.0.2").To4()
	routedNet     = mustCIDR("10.234.0.0/24")
	// The reference plugins' node's uplink and the remote's end of it.
	refUplink4 = net.ParseIP("198.51.102.1").To4()
	refRemote4 = net.ParseIP("198.51.102.2").To4()
	// outside4 is the masquerade part's server, on the remote's lo: outside
	// every node, reached over each node's uplink.
	outside4 = net.ParseIP("198.18.0.80").To4()
)

// hpResults is the hostPort part of the JSON results.
type hpResults struct {
	Scale    []int     `json:"scale"`
	RefScale []int     `json:"referenceScale"`
	ConnSecs float64   `json:"connSeconds"`
	Workers  int       `json:"workers"`
	Reps     int       `json:"timedRepsPerPoint"`
	Points   []hpPoint `json:"points"`
	// Masq: new connections/s from a pod through masquerade (masqconn.go).
	MasqScale []int       `json:"masqScale,omitempty"`
	Masq      []masqPoint `json:"masq,omitempty"`
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
	// The routed baseline (same client, a node with no programs, the pod's
	// own address), measured in the same rounds.
	RoutedPerSec  float64   `json:"routedConnsPerSec"`
	VsRouted      float64   `json:"vsRouted"`
	RoutedSamples []float64 `json:"routedConnsPerSecSamples"`
	// RoutedVeths: the pod veths of the routed floor's node at this point
	// (1, or the point's pods with -routed-veths).
	RoutedVeths int `json:"routedPodVeths"`
	// CPUPerConn and RoutedCPUPerConn: this process's CPU time per
	// connection through the hostPort and through the routed floor (the
	// clients, the server and the softirq work of their packets; medians
	// of the runs), as the masquerade points have it: on a machine other
	// work loads, conn/s moves with the CPU left to the bench, this with
	// what a connection costs.
	CPUPerConn       float64   `json:"cpuUsPerConn"`
	RoutedCPUPerConn float64   `json:"routedCpuUsPerConn"`
	AddSamples       []float64 `json:"addSamplesMs"`
	DelSamples       []float64 `json:"delSamplesMs"`
	// Load1 is the 1-minute load average when the point was measured.
	Load1 float64 `json:"load1"`
	// ebpf-cni's own phase timings (EBPF_CNI_TRACE), medians.
	AddPhases []phase `json:"addPhaseMediansMs,omitempty"`
	DelPhases []phase `json:"delPhaseMediansMs,omitempty"`
	// AddPhaseSamples: each ADD's phases (the own-work row, rows.go).
	AddPhaseSamples [][]phase `json:"addPhasesMs,omitempty"`
}

// connRounds is how many times each point alternates hostPort and raw runs.
const connRounds = 3

// hpEnv is the hostPort benchmark's extra topology.
type hpEnv struct {
	remote, rawClient, rawServer ns.NetNS
	// routedNode and routedPod: the routed baseline, no programs anywhere.
	routedNode, routedPod ns.NetNS
	// ebpfNode (pin directory ebpfPin) and refNode: the node netns of
	// ebpf-cni's configurations and of the reference plugins'.
	ebpfNode, refNode ns.NetNS
	ebpfPin           string
	// routedPeers holds the peers of the routed node's extra veths
	// (-routed-veths); routedVeths is how many there are.
	routedPeers ns.NetNS
	routedVeths int
}

// uplinkOf is the address a remote dials for a configuration's hostPorts.
func (h *hpEnv) uplinkOf(c *config) net.IP {
	if c.node == h.refNode {
		return refUplink4
	}
	return benchUplink4
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
	if h.ebpfNode, err = b.newNode("node-hp-ebpf"); err != nil {
		return err
	}
	if h.refNode, err = b.newNode("node-hp-ref"); err != nil {
		return err
	}
	h.ebpfPin = b.newPinDir("hp")
	if err := testenv.VethBetween(h.ebpfNode, "uplink0", benchUplink4, h.remote, "eth0", benchRemote4); err != nil {
		return fmt.Errorf("node uplink: %w", err)
	}
	if err := testenv.VethBetween(h.refNode, "uplink0", refUplink4, h.remote, "eth2", refRemote4); err != nil {
		return fmt.Errorf("reference node uplink: %w", err)
	}
	if err := testenv.VethBetween(h.rawClient, "eth0", rawClient4, h.rawServer, "eth0", rawServer4); err != nil {
		return fmt.Errorf("raw veth pair: %w", err)
	}
	// The remote reaches every node address via the uplink.
	if err := testenv.RouteVia(h.remote, "eth0", benchUplink4); err != nil {
		return err
	}
	return b.setupRouted(h)
}

// setupRouted builds the routed baseline and the outside server's address.
func (b *bench) setupRouted(h *hpEnv) error {
	var err error
	if h.routedNode, err = b.newNetNS("routed-node"); err != nil {
		return err
	}
	if h.routedPod, err = b.newNetNS("routed-pod"); err != nil {
		return err
	}
	if err := testenv.VethBetween(h.remote, "eth1", routedRemote4, h.routedNode, "uplink0", routedUplink4); err != nil {
		return fmt.Errorf("routed node uplink: %w", err)
	}
	if err := testenv.VethBetween(h.routedNode, "pod0", routedGW4, h.routedPod, "eth0", routedPod4); err != nil {
		return fmt.Errorf("routed pod veth: %w", err)
	}
	if err := testenv.RouteVia(h.routedPod, "eth0", routedGW4); err != nil {
		return err
	}
	host := &net.IPNet{IP: outside4, Mask: net.CIDRMask(32, 32)}
	routes := []struct {
		n    ns.NetNS
		dev  string
		dst  *net.IPNet
		via  net.IP
		addr bool // put dst on lo instead
	}{
		{h.remote, "eth1", routedNet, routedUplink4, false},
		{h.remote, "lo", host, nil, true},
		{h.routedNode, "uplink0", host, routedRemote4, false},
		{h.ebpfNode, "uplink0", host, benchRemote4, false},
		{h.refNode, "uplink0", host, refRemote4, false},
	}
	for _, r := range routes {
		err := r.n.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(r.dev)
			if err != nil {
				return err
			}
			if r.addr {
				return netlink.AddrAdd(l, &netlink.Addr{IPNet: r.dst})
			}
			return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: r.dst, Gw: r.via})
		})
		if err != nil {
			return fmt.Errorf("routed baseline: %s %s: %w", r.dev, r.dst, err)
		}
	}
	if err := h.routedNode.Do(func(ns.NetNS) error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}); err != nil {
		return err
	}
	if !b.opts.nodeCT {
		return nil
	}
	for _, n := range []ns.NetNS{h.routedNode, h.ebpfNode, h.refNode} {
		err := n.Do(func(ns.NetNS) error {
			// kube-proxy's rule: a conntrack match turns conntrack on in
			// the netns (an empty nft nat chain does not).
			if out, err := exec.Command("iptables", "-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP").CombinedOutput(); err != nil {
				return fmt.Errorf("node conntrack: %v: %s", err, out)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// nfState says what netfilter does in a netns: its base chains (nft's
// hooks, iptables-nft's included) and its conntrack entries (none while
// no rule needs conntrack there).
func nfState(n ns.NetNS) string {
	var out []byte
	_ = n.Do(func(ns.NetNS) error {
		out, _ = exec.Command("nft", "list", "ruleset").Output()
		return nil
	})
	var hooks []string
	table := ""
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == "table" {
			table = f[2]
		}
		if i := slices.Index(f, "hook"); i >= 0 && i+1 < len(f) {
			hooks = append(hooks, table+"/"+f[i+1])
		}
	}
	if len(hooks) == 0 {
		hooks = []string{"none"}
	}
	return fmt.Sprintf("nf hooks %s, %d conntrack entries", strings.Join(hooks, ","), ctCount(n))
}

// ctCount is the conntrack entries of a netns (-1: no conntrack there).
func ctCount(n ns.NetNS) int {
	c := -1
	_ = n.Do(func(ns.NetNS) error {
		data, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
		if err == nil {
			fmt.Sscan(string(data), &c)
		}
		return nil
	})
	return c
}

func (b *bench) hpCapArgs(port int) string {
	js, _ := json.Marshal(map[string]any{"portMappings": []map[string]any{{"hostPort": port, "containerPort": 80, "protocol": "tcp"}}})
	return string(js)
}

// server accepts on :80 in netns, writes one byte and closes each connection.
type server struct{ ln net.Listener }

func startServer(netns ns.NetNS) (*server, error) { return startServerOn(netns, 80) }

// startServerOn is startServer on another port.
func startServerOn(netns ns.NetNS, port int) (*server, error) {
	var ln net.Listener
	err := netns.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
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

// hpConfigs are the configurations the hostPort part compares: the two of
// the hostPort benchmark, and with -masq-scale the two of the masquerade
// one (masqconn.go), each plugin's in its node (setupHostPort).
func (b *bench) hpConfigs() []*config {
	ebpfNet := mustCIDR("10.248.0.0/16")
	pmNet := mustCIDR("10.249.0.0/16")
	h := b.hp
	cfgs := []*config{
		{
			key: "ptp-portmap", label: "ptp+portmap", netName: "bench-ptp-portmap", subnet: pmNet, hostPorts: true, node: h.refNode,
			list: map[string]any{"plugins": []any{
				map[string]any{"type": "ptp", "ipMasq": false, "ipam": b.hostLocal(pmNet)},
				map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
			}},
		},
		{
			key: "ebpf-hostport", label: "ebpf-cni (portMappings)", netName: "bench-ebpf-hostport", subnet: ebpfNet, hostPorts: true,
			node: h.ebpfNode, pinDir: h.ebpfPin,
			list: map[string]any{"plugins": []any{map[string]any{
				"type": "ebpf-cni", "pinDir": h.ebpfPin, "stateDir": b.stateFor(h.ebpfPin), "ipam": b.hostLocal(ebpfNet), "maxPods": b.maxPods(),
				"capabilities": map[string]bool{"portMappings": true},
			}}},
		},
	}
	if len(b.opts.masqScale) == 0 {
		return cfgs
	}
	m := b.masqConfigs()
	return []*config{cfgs[0], m[0], cfgs[1], m[1]}
}

// hpBase is the baselines every connection measurement alternates with.
type hpBase struct {
	raw, routed func() (float64, error)
	// routedOut: the routed pod to outside4:port.
	routedOut func(port int) (float64, error)
}

// runHostPort measures every configuration at every scale point.
func (b *bench) runHostPort(ctx context.Context, start time.Time) error {
	o := b.opts
	b.res.HostPort = &hpResults{Scale: o.hpScale, RefScale: o.hpRefScale, ConnSecs: o.connSecs, Workers: o.workers, Reps: o.scaleReps,
		MasqScale: o.masqScale}
	d := time.Duration(o.connSecs * float64(time.Second))
	if o.bpfStats {
		const knob = "/proc/sys/kernel/bpf_stats_enabled"
		old, err := os.ReadFile(knob)
		if err != nil {
			return err
		}
		if err := os.WriteFile(knob, []byte("1"), 0o644); err != nil {
			return err
		}
		defer os.WriteFile(knob, old, 0o644)
	}
	// The raw pair's server, the routed pod's, and the outside one (on the
	// remote) the masquerade part's pods dial.
	var srvs []*server
	defer func() {
		for _, s := range srvs {
			s.close()
		}
	}()
	for _, n := range []ns.NetNS{b.hp.rawServer, b.hp.routedPod, b.hp.remote} {
		s, err := startServer(n)
		if err != nil {
			return fmt.Errorf("baseline server: %w", err)
		}
		srvs = append(srvs, s)
	}
	rate := func(n ns.NetNS, ip net.IP) func() (float64, error) {
		return func() (float64, error) {
			r, _, err := connRate(ctx, n, net.JoinHostPort(ip.String(), "80"), o.workers, d)
			return r, err
		}
	}
	base := hpBase{
		raw:    rate(b.hp.rawClient, rawServer4),
		routed: rate(b.hp.remote, routedPod4),
		routedOut: func(port int) (float64, error) {
			r, _, err := connRate(ctx, b.hp.routedPod, net.JoinHostPort(outside4.String(), fmt.Sprint(port)), o.workers, d)
			return r, err
		},
	}
	for _, f := range []func() (float64, error){base.raw, base.routed, rate(b.hp.routedPod, outside4)} { // warm-up
		if _, err := f(); err != nil {
			return err
		}
	}
	for _, c := range b.hpCfgs {
		var err error
		if isMasqConfig(c) {
			err = b.masqScale(ctx, c, base, d, start)
		} else {
			err = b.hostPortScale(ctx, c, base, d, start)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", c.label, err)
		}
	}
	return nil
}

// member is a pod of a population and its hostPort (0: none).
type member struct {
	pod  ns.NetNS
	port int
}

// population is one configuration's pods at the scale points: grown 4 ADDs
// at a time (untimed), all deleted at the end.
type population struct {
	b       *bench
	c       *config
	ctx     context.Context
	mu      sync.Mutex // b.newPod and b.removePod
	present []member
	// caps is the CAP_ARGS of the pod with hostPort port ("" for none).
	caps func(port int) string
}

// parallel runs f(0..n-1), 4 at a time, until the population's context ends.
func (p *population) parallel(n int, f func(i int) error) error {
	return parallel(p.ctx, n, 4, f)
}

// grow adds pods until there are n.
func (p *population) grow(n int) error {
	if len(p.present) >= n {
		return nil
	}
	logf("%s: adding pods %d..%d", p.c.label, len(p.present)+1, n)
	from := len(p.present)
	grown := make([]member, n-from)
	err := p.parallel(n-from, func(i int) error {
		p.mu.Lock()
		pod, err := p.b.newPod()
		p.mu.Unlock()
		if err != nil {
			return err
		}
		port := hostPortBase + from + i
		grown[i] = member{pod, port}
		_, out, _, err := p.b.cnitoolCap(p.c, "add", pod, p.caps(port))
		if err != nil {
			return err
		}
		return p.b.checkAdd(p.c, pod, out)
	})
	p.present = append(p.present, grown...)
	if err != nil {
		return fmt.Errorf("growing to %d pods: %w", n, err)
	}
	return nil
}

// newest is the most recently added pod.
func (p *population) newest() member { return p.present[len(p.present)-1] }

// removeAll deletes every pod and checks the configuration left nothing.
func (p *population) removeAll() error {
	logf("%s: deleting %d pods", p.c.label, len(p.present))
	err := p.parallel(len(p.present), func(i int) error {
		m := p.present[i]
		if _, _, _, err := p.b.cnitoolCap(p.c, "del", m.pod, p.caps(m.port)); err != nil {
			return err
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.b.removePod(m.pod)
	})
	if err != nil {
		return err
	}
	return p.b.assertClean(p.c)
}

// alternate alternates the measured path with its baselines connRounds
// times, so drift and background load hit all alike.
func alternate(measure func() (float64, int64, error), bases ...func() (float64, error)) (rates []float64, baseRates [][]float64, failed int64, err error) {
	baseRates = make([][]float64, len(bases))
	for r := 0; r < connRounds; r++ {
		rate, f, err := measure()
		if err != nil {
			return nil, nil, 0, err
		}
		failed += f
		rates = append(rates, rate)
		for i, base := range bases {
			br, err := base()
			if err != nil {
				return nil, nil, 0, err
			}
			baseRates[i] = append(baseRates[i], br)
		}
	}
	return rates, baseRates, failed, nil
}

func (b *bench) hostPortScale(ctx context.Context, c *config, base hpBase, d time.Duration, start time.Time) error {
	o := b.opts
	pop := &population{b: b, c: c, ctx: ctx, caps: b.hpCapArgs}
	var srv *server
	defer func() {
		if srv != nil {
			srv.close()
		}
	}()
	seq := 0
	points := o.hpScale
	if c.key == "ptp-portmap" {
		points = o.hpRefScale
	}
	for _, p := range points {
		if err := pop.grow(p); err != nil {
			return err
		}
		// The newest pod serves: its rule is the last of portmap's chain, the
		// worst case of a linear rule list (the average is half of it).
		// ebpf-cni's lookups do not depend on which pod it is.
		if srv != nil {
			srv.close()
		}
		newest := pop.newest()
		var err error
		if srv, err = startServer(newest.pod); err != nil {
			return err
		}
		target := net.JoinHostPort(b.hp.uplinkOf(c).String(), fmt.Sprint(newest.port))
		var cpu, routedCPU []float64
		measure := func() (float64, int64, error) {
			c0 := procCPU()
			rate, f, err := connRate(ctx, b.hp.remote, target, o.workers, d)
			if err == nil && rate == 0 {
				err = fmt.Errorf("no connection through hostPort %s succeeded (%d failed)", target, f)
			}
			cpu = append(cpu, cpuPerConn(c0, rate, d))
			return rate, f, err
		}
		routed := func() (float64, error) {
			c0 := procCPU()
			rate, err := base.routed()
			routedCPU = append(routedCPU, cpuPerConn(c0, rate, d))
			return rate, err
		}
		if o.routedVeths && c.isEBPF() {
			if err := b.growRoutedVeths(p); err != nil {
				return err
			}
		}
		// One discarded hostPort run first: the hostPort run opens every
		// round, and the first one after a population's growth (999 ADDs
		// at the 1000-pod point) was about 2% slower than the next two in
		// round 21's runs, the routed floor's not (docs/performance.md).
		if _, _, err := measure(); err != nil {
			return err
		}
		cpu = cpu[:0]
		stats0 := b.progStats(c)
		rates, bases, failed, err := alternate(measure, base.raw, routed)
		b.logProgStats(c, p, stats0)
		if err != nil {
			return err
		}
		raws, routeds := bases[0], bases[1]
		rate, rawRate, routedRate := testenv.Median(rates), testenv.Median(raws), testenv.Median(routeds)
		pt := hpPoint{Config: c.key, Pods: p, ConnsPerSec: rate, ConnErrors: failed, RawPerSec: rawRate, VsRaw: rate / rawRate,
			ConnSamples: rates, RawSamples: raws, RoutedPerSec: routedRate, VsRouted: rate / routedRate, RoutedSamples: routeds,
			CPUPerConn: testenv.Median(cpu), RoutedCPUPerConn: testenv.Median(routedCPU)}
		if err := b.timedHostPortCycles(ctx, pop, &pt, &seq); err != nil {
			return err
		}
		pt.RoutedVeths = 1 + b.hp.routedVeths
		b.res.HostPort.Points = append(b.res.HostPort.Points, pt)
		logf("  hostPort %-24s %4d pods: %7.0f conn/s (raw %7.0f, %.2fx, %d failed), ADD %.1f ms, DEL %.1f ms (%s)",
			c.label, p, rate, rawRate, pt.VsRaw, failed, pt.AddMedianMs, pt.DelMedianMs, time.Since(start).Round(time.Second))
		logf("  hostPort %-24s %4d pods: routed, no programs %7.0f conn/s (its node %d pod veths), hostPort %.2fx of it; CPU %.1f us/conn (routed %.1f, %.2fx); load %.2f; node: %s; routed node: %s",
			c.label, p, routedRate, pt.RoutedVeths, pt.VsRouted, pt.CPUPerConn, pt.RoutedCPUPerConn, pt.CPUPerConn/pt.RoutedCPUPerConn, pt.Load1,
			nfState(b.nodeOf(c)), nfState(b.hp.routedNode))
	}
	if srv != nil { // nil when no point was measured (-hostport-ref-scale "")
		srv.close()
		srv = nil
	}
	return pop.removeAll()
}

// growRoutedVeths gives the routed floor's node pods-1 veths besides its
// pod0, each up with a /32 route to an address of 10.235.0.0/16 of its own
// and a permanent neighbour for it, as an ebpf-cni node has one host veth,
// one route and one neighbour per pod; the
// peers wait, up, in one netns of their own (no pod behind them: nothing
// dials them). The floor is then measured on a node with as many devices
// and routes as ebpf-cni's at the point.
func (b *bench) growRoutedVeths(pods int) error {
	h := b.hp
	if h.routedPeers == nil {
		var err error
		if h.routedPeers, err = b.newNetNS("routed-peers"); err != nil {
			return err
		}
	}
	want := pods - 1
	if h.routedVeths >= want {
		return nil
	}
	logf("routed floor: adding host veths %d..%d to its node", h.routedVeths+1, want)
	// IPv6 off on the new veths of both ends, as on ebpf-cni's IPv4-only
	// host veths: no link-local address, DAD or MLD per veth.
	for _, n := range []ns.NetNS{h.routedNode, h.routedPeers} {
		if err := n.Do(func(ns.NetNS) error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1"), 0o644)
		}); err != nil {
			return err
		}
	}
	return h.routedNode.Do(func(ns.NetNS) error {
		for ; h.routedVeths < want; h.routedVeths++ {
			i := h.routedVeths
			name := fmt.Sprintf("rv%d", i)
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: fmt.Sprintf("rp%d", i),
				PeerNamespace: netlink.NsFd(int(h.routedPeers.Fd()))}
			if err := netlink.LinkAdd(v); err != nil {
				return fmt.Errorf("routed veth %s: %w", name, err)
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			dst := &net.IPNet{IP: net.IPv4(10, 235, byte(i/250), byte(i%250+1)).To4(), Mask: net.CIDRMask(32, 32)}
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
				return fmt.Errorf("routed veth %s route: %w", name, err)
			}
			// ebpf-cni's node has a permanent neighbour per pod, too.
			mac := net.HardwareAddr{0x02, 0xeb, 0, byte(i >> 8), byte(i), 1}
			if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
				IP: dst.IP, HardwareAddr: mac}); err != nil {
				return fmt.Errorf("routed veth %s neighbour: %w", name, err)
			}
		}
		return h.routedPeers.Do(func(ns.NetNS) error {
			links, err := netlink.LinkList()
			if err != nil {
				return err
			}
			for _, l := range links {
				if err := netlink.LinkSetUp(l); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// timedHostPortCycles times o.scaleReps ADD+DEL of one more pod with a
// hostPort on top of pop, into pt.
func (b *bench) timedHostPortCycles(ctx context.Context, pop *population, pt *hpPoint, seq *int) error {
	c := pop.c
	var adds, dels []float64
	var addPh, delPh [][]phase
	for i := 0; i < b.opts.scaleReps; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		pop.mu.Lock()
		pod, err := b.newPod()
		pop.mu.Unlock()
		if err != nil {
			return err
		}
		capArgs := b.hpCapArgs(hostPortTimed + *seq)
		*seq++
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
	pt.AddPhases, pt.DelPhases, pt.AddPhaseSamples = phaseMedians(addPh), phaseMedians(delPh), addPh
	return nil
}

// hostPortMarkdown renders the hostPort section of the report.
func (r *results) hostPortMarkdown() string {
	h := r.HostPort
	if h == nil || len(h.Points) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## hostPort at scale\n\n")
	fmt.Fprintf(&b, "New TCP connections per second from a remote netns to node-uplink-address:hostPort of the most recently added pod (the last rule of portmap's chain; dial, read 1 byte until the server's close, close; %d client goroutines, %d runs of %.0f s alternating with the same client against a raw veth pair: no CNI, no NAT, no forwarding, and against the routed baseline: the same client over a second veth into a node netns with no programs, routed to a pod netns's own address, the hostPort path's hops without its translation; medians), every pod holding its own hostPort. ADD/DEL: %d timed cycles of one more pod with a hostPort at each point (cnitool wall time, medians).\n\n", h.Workers, connRounds, h.ConnSecs, h.Reps)
	fmt.Fprintf(&b, "| config | pods with hostPorts | ADD median ms | ADD p90 ms | DEL median ms | conn/s via hostPort | raw veth conn/s | × raw | failed | routed conn/s | × routed | CPU µs/conn | routed CPU µs/conn | routed node's pod veths |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	pts := append([]hpPoint(nil), h.Points...)
	sort.SliceStable(pts, func(i, j int) bool {
		if pts[i].Pods != pts[j].Pods {
			return pts[i].Pods < pts[j].Pods
		}
		return pts[i].Config < pts[j].Config
	})
	for _, p := range pts {
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.1f | %.1f | %.0f | %.0f | %.2f× | %d | %.0f | %.2f× | %.1f | %.1f | %d |\n",
			r.labels[p.Config], p.Pods, p.AddMedianMs, p.AddP90Ms, p.DelMedianMs, p.ConnsPerSec, p.RawPerSec, p.VsRaw, p.ConnErrors, p.RoutedPerSec, p.VsRouted,
			p.CPUPerConn, p.RoutedCPUPerConn, p.RoutedVeths)
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
