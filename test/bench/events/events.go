// Package events is the events part of the benchmark (go run ./test/bench
// -parts events): what datapath events cost.
//
//   - pod-to-pod TCP throughput (iperf3, 1 stream) and request/response
//     latency (1-byte ping-pong over one TCP connection) between two pods
//     of one node, with events off and with flow events on for every pod
//     (drops on too), alternating per round; the ratio on/off is judged
//     against 0.97;
//   - the agent's CPU while an observer follows a flood of 10 000 dropped
//     packets a second (spoofed frames from a pod), with drop events off
//     and on (default rate limit), and what the datapath sent and lost.
//
// One node netns with ebpf-cni (its own pin and state directories) and the
// agent running in it, two pods ADDed with cnitool; everything is removed
// on exit.
package events

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// Options of the part.
type Options struct {
	Rounds    int // rounds, each measuring off and on
	TputSecs  int // seconds per iperf3 run
	RRCount   int // round trips per latency measurement
	FloodSecs int // seconds of the drop flood per measurement
	FloodPPS  int // its rate
	OutDir    string
	Quick     bool
}

// NewOptions gives the defaults (quick: fewer and shorter runs).
func NewOptions(quick bool, outDir string) *Options {
	o := &Options{Rounds: 5, TputSecs: 5, RRCount: 20000, FloodSecs: 5, FloodPPS: 10000, OutDir: outDir, Quick: quick}
	if quick {
		o.Rounds, o.TputSecs, o.RRCount, o.FloodSecs = 2, 3, 5000, 3
	}
	return o
}

var binaries = []string{
	"./cmd/ebpf-cni", "./cmd/ebpf-agent",
	"github.com/containernetworking/plugins/plugins/ipam/host-local",
	"github.com/containernetworking/cni/cnitool",
}

const (
	netName  = "evbench"
	nodeIP   = "192.0.2.1/32"
	subnet   = "10.248.0.0/16"
	tputPort = 5201
	rrPort   = 5301
)

// Bench is the part's state.
type Bench struct {
	o                                  *Options
	root, binDir, confDir, state, ipam string
	nsDir, pinDir, cache, cacheMount   string
	node, a, b                         ns.NetNS
	aIP, bIP                           net.IP
	added                              []ns.NetNS
	procs                              *testenv.Procs
	agent                              *testenv.Proc
	rows                               []testenv.Row
}

func logf(format string, a ...any) { fmt.Fprintf(os.Stderr, "bench events: "+format+"\n", a...) }

// New builds the binaries, the node, the pods and starts the agent.
func New(ctx context.Context, o *Options) (*Bench, error) {
	id := testenv.RandHex(4)
	root, err := os.MkdirTemp("", "ebpfevbench-"+id+"-")
	if err != nil {
		return nil, err
	}
	b := &Bench{o: o, root: root, binDir: filepath.Join(root, "bin"), confDir: filepath.Join(root, "net.d"),
		state: filepath.Join(root, "state"), ipam: filepath.Join(root, "ipam"), nsDir: filepath.Join(root, "netns"),
		cache: filepath.Join(root, "cni-cache"), pinDir: filepath.Join("/sys/fs/bpf", "ebpfevbench-"+id), procs: testenv.NewProcs()}
	for _, d := range []string{b.binDir, b.confDir, b.state, b.ipam, b.nsDir, b.cache} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return b, err
		}
	}
	if err := testenv.Build(ctx, b.binDir, binaries, logf); err != nil {
		return b, err
	}
	if b.cacheMount, err = testenv.HideCNICache(b.cache, ".ebpfevbench-"+id, logf); err != nil {
		return b, err
	}
	conf := map[string]any{"cniVersion": "1.0.0", "name": netName, "plugins": []any{map[string]any{
		"type": "ebpf-cni", "pinDir": b.pinDir, "stateDir": b.state,
		"ipam": map[string]any{"type": "host-local", "dataDir": b.ipam, "ranges": [][]map[string]string{{{"subnet": subnet}}},
			"routes": []map[string]string{{"dst": "0.0.0.0/0"}}},
	}}}
	data, _ := json.Marshal(conf)
	if err := os.WriteFile(filepath.Join(b.confDir, netName+".conflist"), data, 0o600); err != nil {
		return b, err
	}
	if b.node, err = testenv.NewNetNS(filepath.Join(b.nsDir, "node")); err != nil {
		return b, err
	}
	if err := testenv.SetupNode(b.node, nodeIP); err != nil {
		return b, err
	}
	if b.a, b.aIP, err = b.addPod("a"); err != nil {
		return b, err
	}
	if b.b, b.bIP, err = b.addPod("b"); err != nil {
		return b, err
	}
	b.agent, err = b.procs.Start(ctx, b.node, filepath.Join(b.binDir, "ebpf-agent"), "run", "--pin-dir", b.pinDir,
		"--state-dir", b.state, "--cni-conf-dir", b.confDir, "--cni-bin-dir", b.binDir, "--metrics-addr", "", "--hostports=false")
	if err != nil {
		return b, err
	}
	// Ready once its socket answers.
	for i := 0; ; i++ {
		if _, err := b.cli("events"); err == nil {
			if out, _ := b.cli("events"); strings.Contains(out, "agent: read") {
				break
			}
		}
		if i > 100 {
			return b, fmt.Errorf("the agent did not come up")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return b, nil
}

func (b *Bench) addPod(name string) (ns.NetNS, net.IP, error) {
	n, err := testenv.NewNetNS(filepath.Join(b.nsDir, name))
	if err != nil {
		return nil, nil, err
	}
	b.added = append(b.added, n)
	out, err := b.cnitool("add", n)
	if err != nil {
		return n, nil, err
	}
	var r struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.IPs) == 0 {
		return n, nil, fmt.Errorf("ADD %s: %v\n%s", name, err, out)
	}
	ip, _, err := net.ParseCIDR(r.IPs[0].Address)
	return n, ip, err
}

func (b *Bench) cnitool(verb string, p ns.NetNS) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	var runErr error
	err := b.node.Do(func(ns.NetNS) error {
		cmd := exec.Command(filepath.Join(b.binDir, "cnitool"), verb, netName, p.Path())
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "NETCONFPATH=" + b.confDir, "CNI_PATH=" + b.binDir, "CNI_IFNAME=eth0"}
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		runErr = cmd.Run()
		return nil
	})
	if err == nil && runErr != nil {
		err = fmt.Errorf("cnitool %s: %v: %s", verb, runErr, stderr.String())
	}
	return stdout.Bytes(), err
}

// cli runs `ebpf-agent ARGS` against the bench's node.
func (b *Bench) cli(args ...string) (string, error) {
	args = append(args, "--pin-dir", b.pinDir, "--state-dir", b.state)
	out, err := exec.Command(filepath.Join(b.binDir, "ebpf-agent"), args...).CombinedOutput()
	return string(out), err
}

// setMode turns events off, or drops and flow events for every pod on.
func (b *Bench) setMode(on bool) error {
	args := []string{"events", "--drops", "off", "--flows", "off"}
	if on {
		args = []string{"events", "--drops", "on", "--flows", "node"}
	}
	out, err := b.cli(args...)
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// Run measures.
func (b *Bench) Run(ctx context.Context) error {
	var tput, rr [2][]float64 // [off, on]
	load := testenv.Loadavg()
	for round := 0; round < b.o.Rounds; round++ {
		for _, i := range []int{round % 2, 1 - round%2} { // alternate which goes first
			if err := b.setMode(i == 1); err != nil {
				return err
			}
			bps, err := b.iperf(ctx)
			if err != nil {
				return err
			}
			us, err := b.rr()
			if err != nil {
				return err
			}
			tput[i] = append(tput[i], bps/1e9)
			rr[i] = append(rr[i], us)
			logf("round %d, events %s: %.2f Gbit/s, RTT median %.1f µs", round+1, []string{"off", "flows on"}[i], bps/1e9, us)
		}
	}
	const goal = 0.97
	for _, m := range []struct {
		metric, unit string
		v            [2][]float64
		higherBetter bool
	}{{"pod-to-pod TCP throughput (iperf3, 1 stream)", "Gbit/s", tput, true}, {"request/response RTT median (1 byte over TCP)", "µs", rr, false}} {
		off := testenv.NewRow("events", "events off", m.metric, "", m.unit, m.v[0])
		off.Load = load
		on := testenv.NewRow("events", "flow events on (every pod) + drop events", m.metric, "", m.unit, m.v[1])
		on.Against("events off", off.Median)
		on.Load = load
		ratio := on.Ratio
		if !m.higherBetter && on.Median > 0 {
			ratio = off.Median / on.Median // as speed: >= 0.97 means at most ~3% slower
		}
		on.Goal(fmt.Sprintf(">= %.2fx of events off (as speed: %.3f)", goal, ratio), ratio >= goal)
		b.rows = append(b.rows, off, on)
	}

	// The agent under a drop flood, followed by an observer.
	for _, on := range []bool{false, true} {
		if err := b.setMode(false); err != nil {
			return err
		}
		if on {
			if out, err := b.cli("events", "--drops", "on"); err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
		}
		cpu, obsCPU, sent, lost, pps, err := b.flood(ctx)
		if err != nil {
			return err
		}
		label := map[bool]string{false: "drop events off", true: "drop events on (default rate limit)"}[on]
		logf("flood %.0f/s, %s: agent CPU %.1f%%, observer %.1f%%, events sent %d, lost %d", pps, label, cpu, obsCPU, sent, lost)
		r := testenv.NewRow("events", label, "agent CPU while `observe` follows a drop flood", fmt.Sprintf("%.0f dropped packets/s for %d s; sent %d, lost %d events", pps, b.o.FloodSecs, sent, lost), "% of a CPU", []float64{cpu})
		r.Load = testenv.Loadavg()
		o := testenv.NewRow("events", label, "observer (ebpf-agent observe -o json) CPU during the same flood", "", "% of a CPU", []float64{obsCPU})
		b.rows = append(b.rows, r, o)
	}
	return nil
}

// iperf runs one iperf3 measurement from pod a to pod b.
func (b *Bench) iperf(ctx context.Context) (float64, error) {
	srv, err := b.procs.Start(ctx, b.b, "iperf3", "-s", "-1", "-p", strconv.Itoa(tputPort), "-B", b.bIP.String())
	if err != nil {
		return 0, err
	}
	defer srv.Kill()
	if err := testenv.WaitListen(srv, tputPort); err != nil {
		return 0, err
	}
	var out []byte
	err = b.a.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.CommandContext(ctx, "iperf3", "-c", b.bIP.String(), "-p", strconv.Itoa(tputPort), "-t", strconv.Itoa(b.o.TputSecs), "-J").Output()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("iperf3: %v: %s", err, testenv.Tail(string(out)))
	}
	j, err := testenv.ParseIperf(out, "client")
	if err != nil {
		return 0, err
	}
	return j.End.SumReceived.BitsPerSecond, nil
}

// rr measures the median round trip of RRCount 1-byte exchanges over one
// TCP connection from pod a to pod b, in µs.
func (b *Bench) rr() (float64, error) {
	var ln net.Listener
	if err := b.b.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(b.bIP.String(), strconv.Itoa(rrPort)))
		return err
	}); err != nil {
		return 0, err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 1)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	var c net.Conn
	if err := b.a.Do(func(ns.NetNS) error {
		var err error
		c, err = net.Dial("tcp", net.JoinHostPort(b.bIP.String(), strconv.Itoa(rrPort)))
		return err
	}); err != nil {
		return 0, err
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	buf := []byte{'x'}
	rtts := make([]float64, 0, b.o.RRCount)
	for i := 0; i < b.o.RRCount; i++ {
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
		if _, err := c.Read(buf); err != nil {
			return 0, err
		}
		rtts = append(rtts, float64(time.Since(t0).Nanoseconds())/1e3)
	}
	return testenv.Median(rtts), nil
}

// cpuTicks is a process's utime+stime in clock ticks.
func cpuTicks(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return u + s, nil
}

const ticksPerSec = 100 // USER_HZ

// flood sends FloodPPS spoofed frames a second from pod a for FloodSecs
// while `observe -o json` follows, and returns the agent's and the
// observer's CPU (% of one CPU), the events sent and lost meanwhile, and
// the rate achieved.
func (b *Bench) flood(ctx context.Context) (agentPct, obsPct float64, sent, lost uint64, pps float64, err error) {
	m, err := datapath.OpenMaps(b.pinDir)
	if err != nil {
		return
	}
	defer m.Close()
	obs := exec.CommandContext(ctx, filepath.Join(b.binDir, "ebpf-agent"), "observe", "-o", "json", "--state-dir", b.state, "--pin-dir", b.pinDir)
	obs.Stdout, obs.Stderr = nil, nil
	if err = obs.Start(); err != nil {
		return
	}
	defer func() { obs.Process.Kill(); obs.Wait() }()
	time.Sleep(300 * time.Millisecond)

	var l netlink.Link
	var hostMAC, podMAC net.HardwareAddr
	_ = b.a.Do(func(ns.NetNS) error {
		l, err = netlink.LinkByName("eth0")
		if err == nil {
			podMAC = l.Attrs().HardwareAddr
			if ns, e := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V4); e == nil && len(ns) > 0 {
				hostMAC = ns[0].HardwareAddr
			}
		}
		return nil
	})
	if err != nil {
		return
	}
	if hostMAC == nil {
		hostMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	}
	frame := spoofedUDP(podMAC, hostMAC, net.ParseIP("10.247.9.9"), net.ParseIP("192.0.2.1"))
	c0, err := m.Events().Counters()
	if err != nil {
		return
	}
	a0, _ := cpuTicks(b.agent.Pid())
	o0, _ := cpuTicks(obs.Process.Pid)
	start := time.Now()
	n := b.o.FloodPPS * b.o.FloodSecs
	err = b.a.Do(func(ns.NetNS) error {
		fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		sa := &syscall.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}
		for i := 0; i < n; i++ {
			if ahead := time.Duration(i)*time.Second/time.Duration(b.o.FloodPPS) - time.Since(start); ahead > 0 {
				time.Sleep(ahead)
			}
			if err := syscall.Sendto(fd, frame, 0, sa); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return
	}
	wall := time.Since(start).Seconds()
	time.Sleep(200 * time.Millisecond) // the agent drains the ring
	a1, _ := cpuTicks(b.agent.Pid())
	o1, _ := cpuTicks(obs.Process.Pid)
	c1, err := m.Events().Counters()
	if err != nil {
		return
	}
	secs := time.Since(start).Seconds()
	return (a1 - a0) / ticksPerSec / secs * 100, (o1 - o0) / ticksPerSec / secs * 100,
		c1.Sent - c0.Sent, (c1.LostRate - c0.LostRate) + (c1.LostRing - c0.LostRing), float64(n) / wall, nil
}

func spoofedUDP(src, dst net.HardwareAddr, sip, dip net.IP) []byte {
	h := make([]byte, 20)
	udp := []byte{0x30, 0x39, 0x00, 0x09, 0, 12, 0, 0, 'f', 'l', 'd', '!'}
	h[0], h[8], h[9] = 0x45, 64, 17
	total := 20 + len(udp)
	h[2], h[3] = byte(total>>8), byte(total)
	copy(h[12:], sip.To4())
	copy(h[16:], dip.To4())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	c := ^uint16(sum)
	h[10], h[11] = byte(c>>8), byte(c)
	eth := append(append(append([]byte{}, dst...), src...), 0x08, 0x00)
	return append(append(eth, h...), udp...)
}

// Rows are the part's figures.
func (b *Bench) Rows() []testenv.Row { return b.rows }

// Cleanup stops the agent, DELs the pods and removes everything.
func (b *Bench) Cleanup() {
	if b.agent != nil {
		b.agent.Stop(5 * time.Second)
	}
	b.procs.KillAll()
	for _, n := range b.added {
		if b.node != nil {
			b.cnitool("del", n)
		}
		testenv.RemoveNetNS(n)
	}
	if b.node != nil {
		testenv.RemoveNetNS(b.node)
	}
	if b.cacheMount != "" {
		syscall.Unmount(b.cacheMount, syscall.MNT_DETACH)
	}
	os.RemoveAll(b.pinDir)
	os.RemoveAll(b.root)
}
