package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

const (
	cniVersion = "1.0.0"
	ifName     = "eth0"
	// hostPort is the port mapping the chain configuration sets up.
	hostPort = 18080
)

var nodeIP = "192.0.2.1/32"

// binaries built into the temp bin dir; ebpf-cni from this tree, the rest at
// the versions go.mod pins as tool dependencies.
var binaries = []string{
	"./cmd/ebpf-cni",
	"./cmd/ebpf-agent",
	"github.com/containernetworking/plugins/plugins/ipam/host-local",
	"github.com/containernetworking/plugins/plugins/main/ptp",
	"github.com/containernetworking/plugins/plugins/meta/portmap",
	"github.com/containernetworking/plugins/plugins/meta/bandwidth",
	"github.com/containernetworking/plugins/plugins/main/loopback",
	"github.com/containernetworking/cni/cnitool",
}

// config is one network configuration under test.
type config struct {
	key     string // ebpf, ptp, chain, loopback
	label   string
	netName string
	subnet  *net.IPNet // nil for loopback
	capArgs string     // CAP_ARGS for cnitool, "" for none
	atScale bool
	// hostPorts: a configuration of the hostPort benchmark (hostport.go),
	// not of the latency rounds.
	hostPorts bool
	list      map[string]any

	// node is the configuration's node netns (nil: the shared b.node);
	// pinDir its ebpf-cni pin directory ("" : b.pinDir). A pin directory
	// serves one node netns: configurations in a node of their own have
	// their own pin directory.
	node   ns.NetNS
	pinDir string
	// stateDir is ebpf-cni's stateDir ("": b.state).
	stateDir string
	// cniPath overrides CNI_PATH (the memory benchmark's wrappers).
	cniPath string
	// confDir, when set, also receives the conflist (the agent's view).
	confDir string
	// tun: a tunnel pod start configuration's node (tunstart.go); nil
	// for the others.
	tun *tunStart
}

// isEBPF is true for ebpf-cni configurations.
func (c *config) isEBPF() bool {
	return strings.HasPrefix(c.key, "ebpf") || strings.HasPrefix(c.key, "tput-ebpf") || strings.HasPrefix(c.key, "mem-ebpf") ||
		strings.HasPrefix(c.key, "burst-ebpf")
}

// mapsPorts is true for ebpf-cni configurations with the portMappings capability.
func (c *config) mapsPorts() bool {
	if !c.isEBPF() {
		return false
	}
	for _, p := range c.list["plugins"].([]any) {
		if caps, ok := p.(map[string]any)["capabilities"].(map[string]bool); ok && caps["portMappings"] {
			return true
		}
	}
	return false
}

type bench struct {
	opts    *options
	id      string
	root    string
	binDir  string
	confDir string
	cache   string // bind-mounted over /var/lib/cni
	state   string // ebpf-cni stateDir
	ipamDir string // host-local dataDir
	nsDir   string // network namespace mount points
	pinDir  string

	cacheMount string // where cache is mounted, "" when not mounted
	node       ns.NetNS
	fullNode   ns.NetNS // ebpf-cni +hostPort+bandwidth's node (latency)
	// netnses are the namespaces other than b.node and pods (extra nodes,
	// remotes, raw pairs), pinDirs the pin directories other than b.pinDir,
	// procs the processes started in namespaces: all removed at cleanup.
	netnses map[string]ns.NetNS
	pinDirs []string
	procs   *testenv.Procs
	agents  map[string]*testenv.Proc // ebpf-agent run, by pin directory (agent.go)
	verbEnd time.Time                // when the last cnitool ended (podMu)
	// lastHostIf is the host veth of the last addPod's pod; lastAddCPU
	// and lastDelCPU the CPU time of the last addPod's and delPod's verb.
	lastHostIf             string
	lastAddCPU, lastDelCPU time.Duration
	pods                   map[string]ns.NetNS // live pod namespaces by path
	podSeq                 int
	podMu                  sync.Mutex // pods and podSeq, for parallel ADDs
	// ebpf-cni's EBPF_CNI_TRACE phase timings of the last ADD and DEL.
	addPhases, delPhases []phase
	configs              []*config
	hpCfgs               []*config // the hostPort benchmark's
	hp                   *hpEnv
	masqSeq              int // the masquerade points' server ports (masqconn.go)
	res                  *results
}

// newBench prepares everything; on error the returned bench (if non-nil)
// holds what was created so far, for cleanup.
func newBench(ctx context.Context, opts *options) (*bench, error) {
	id := testenv.RandHex(4)
	root, err := os.MkdirTemp("", "ebpfbench-"+id+"-")
	if err != nil {
		return nil, err
	}
	b := &bench{
		opts:    opts,
		id:      id,
		root:    root,
		binDir:  filepath.Join(root, "bin"),
		confDir: filepath.Join(root, "net.d"),
		cache:   filepath.Join(root, "cni-cache"),
		state:   filepath.Join(root, "ebpf-cni-state"),
		ipamDir: filepath.Join(root, "host-local"),
		nsDir:   filepath.Join(root, "netns"),
		pinDir:  filepath.Join("/sys/fs/bpf", "ebpfbench-"+id),
		pods:    map[string]ns.NetNS{},
		netnses: map[string]ns.NetNS{},
		procs:   testenv.NewProcs(),
		agents:  map[string]*testenv.Proc{},
	}
	logf("run %s: temp dir %s, pin dir %s", id, root, b.pinDir)
	for _, d := range []string{b.binDir, b.confDir, b.cache, b.state, b.ipamDir, b.nsDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return b, err
		}
	}
	b.res = newResults(opts)
	if err := testenv.Build(ctx, b.binDir, binaries, logf); err != nil {
		return b, err
	}
	if b.cacheMount, err = testenv.HideCNICache(b.cache, ".ebpfbench-"+b.id, logf); err != nil {
		return b, err
	}
	if err := b.setupNode(); err != nil {
		return b, err
	}
	if opts.parts[partLatency] {
		// ebpf-cni with hostPort + bandwidth, in a node of its own: its
		// hostPort hooks would otherwise also see the hostPort
		// benchmark's portmap traffic on the shared node's uplink.
		if b.fullNode, err = b.newNode("node-full"); err != nil {
			return b, err
		}
	}
	if opts.parts[partHostPort] {
		if err := b.setupHostPort(); err != nil {
			return b, err
		}
		for _, n := range []ns.NetNS{b.hp.remote, b.hp.rawClient} {
			if err := raiseClientLimits(n); err != nil {
				return b, err
			}
		}
	}
	if err := b.writeConfigs(); err != nil {
		return b, err
	}
	return b, nil
}

func (b *bench) setupNode() error {
	node, err := testenv.NewNetNS(filepath.Join(b.nsDir, "node"))
	if err != nil {
		return fmt.Errorf("create node netns: %w", err)
	}
	b.node = node
	return testenv.SetupNode(node, nodeIP)
}

// newNetNS creates a namespace nsDir/name tracked for cleanup.
func (b *bench) newNetNS(name string) (ns.NetNS, error) {
	n, err := testenv.NewNetNS(filepath.Join(b.nsDir, name))
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	b.netnses[n.Path()] = n
	return n, nil
}

// newNode creates another node netns (lo up, the node address on lo).
func (b *bench) newNode(name string) (ns.NetNS, error) {
	n, err := b.newNetNS(name)
	if err != nil {
		return nil, err
	}
	return n, testenv.SetupNode(n, nodeIP)
}

// maxPods sizes the maps of b.pinDir, which every network on it must name
// alike: the largest population of the scale and hostPort parts, the pods
// timed on top of it, and room for the latency rounds' leftovers.
func (b *bench) maxPods() int {
	n := 0
	for _, p := range slices.Concat(b.opts.scale, b.opts.hpScale, b.opts.masqScale) {
		n = max(n, p)
	}
	return max(110, n+b.opts.scaleReps+64)
}

// newPinDir names another pin directory of this run, removed at cleanup.
func (b *bench) newPinDir(suffix string) string {
	p := b.pinDir + "-" + suffix
	b.pinDirs = append(b.pinDirs, p)
	return p
}

func (b *bench) nodeOf(c *config) ns.NetNS {
	if c.node != nil {
		return c.node
	}
	return b.node
}

func (b *bench) stateOf(c *config) string {
	if c.stateDir != "" {
		return c.stateDir
	}
	return b.stateFor(b.pinOf(c))
}

// stateFor is the state directory of the node whose pin directory is
// pinDir: b.state for b.pinDir, one of its own for every other. A state
// directory is a node's, as the pin directory is: the agent of each node
// listens on its events socket there, and a second agent refuses a socket
// another one answers on.
func (b *bench) stateFor(pinDir string) string {
	if pinDir == b.pinDir || pinDir == "" {
		return b.state
	}
	d := filepath.Join(b.root, "state-"+filepath.Base(pinDir))
	_ = os.MkdirAll(d, 0o700) // a failure shows at the first ADD, naming the directory
	return d
}

// ebpfPlugin is an ebpf-cni plugin entry with the given capabilities.
func (b *bench) ebpfPlugin(subnet *net.IPNet, pinDir, stateDir string, caps ...string) map[string]any {
	p := map[string]any{"type": "ebpf-cni", "pinDir": pinDir, "stateDir": stateDir, "ipam": b.hostLocal(subnet)}
	if len(caps) > 0 {
		cm := map[string]bool{}
		for _, c := range caps {
			cm[c] = true
		}
		p["capabilities"] = cm
	}
	return p
}

func (b *bench) pinOf(c *config) string {
	if c.pinDir != "" {
		return c.pinDir
	}
	return b.pinDir
}

func mustCIDR(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

func (b *bench) hostLocal(subnet *net.IPNet) map[string]any {
	return map[string]any{
		"type":    "host-local",
		"dataDir": b.ipamDir,
		"ranges":  [][]map[string]string{{{"subnet": subnet.String()}}},
		// ebpf-cni adds a default route anyway; give ptp the same so both
		// configure the same routes in the pod.
		"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
	}
}

// chainCapArgs is what a runtime passes for a pod with one hostPort and a
// 100 Mbit/s limit each way.
func chainCapArgs() string {
	capArgs, err := json.Marshal(map[string]any{
		"portMappings": []map[string]any{{"hostPort": hostPort, "containerPort": 80, "protocol": "tcp"}},
		"bandwidth": map[string]any{
			"ingressRate": 100_000_000, "ingressBurst": 1_000_000,
			"egressRate": 100_000_000, "egressBurst": 1_000_000,
		},
	})
	if err != nil {
		panic(err)
	}
	return string(capArgs)
}

func (b *bench) writeConfigs() error {
	ebpfNet := mustCIDR("10.250.0.0/16")
	ptpNet := mustCIDR("10.251.0.0/16")
	chainNet := mustCIDR("10.252.0.0/16")
	ebpfTCNet := mustCIDR("10.253.0.0/16")
	fullNet := mustCIDR("10.247.0.0/16")
	capArgs := chainCapArgs()
	b.configs = []*config{
		{
			key: "ebpf-full", label: "ebpf-cni +hostPort+bandwidth", netName: "bench-ebpf-full", subnet: fullNet, capArgs: capArgs,
			node: b.fullNode, pinDir: b.newPinDir("full"),
		},
		{
			key: "ebpf", label: "ebpf-cni", netName: "bench-ebpf-cni", subnet: ebpfNet, atScale: true,
			list: map[string]any{"plugins": []any{map[string]any{
				"type": "ebpf-cni", "pinDir": b.pinDir, "stateDir": b.state, "ipam": b.hostLocal(ebpfNet), "maxPods": b.maxPods(),
			}}},
		},
		{
			key: "ebpf-tc", label: "ebpf-cni attachMode=tc", netName: "bench-ebpf-cni-tc", subnet: ebpfTCNet,
			list: map[string]any{"plugins": []any{map[string]any{
				"type": "ebpf-cni", "attachMode": "tc", "pinDir": b.pinDir, "stateDir": b.state, "ipam": b.hostLocal(ebpfTCNet), "maxPods": b.maxPods(),
			}}},
		},
		{
			key: "ptp", label: "ptp", netName: "bench-ptp", subnet: ptpNet, atScale: true,
			list: map[string]any{"plugins": []any{map[string]any{
				"type": "ptp", "ipMasq": false, "ipam": b.hostLocal(ptpNet),
			}}},
		},
		{
			key: "chain", label: "ptp+portmap+bandwidth", netName: "bench-chain", subnet: chainNet, capArgs: capArgs,
			list: map[string]any{"plugins": []any{
				map[string]any{"type": "ptp", "ipMasq": false, "ipam": b.hostLocal(chainNet)},
				map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
				map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}},
			}},
		},
		{
			key: "loopback", label: "loopback (floor)", netName: "bench-loopback",
			list: map[string]any{"plugins": []any{map[string]any{"type": "loopback"}}},
		},
	}
	full := b.configs[0]
	full.list = map[string]any{"plugins": []any{b.ebpfPlugin(fullNet, full.pinDir, b.stateFor(full.pinDir), "portMappings", "bandwidth")}}
	if !b.opts.attachTC {
		b.configs = append(b.configs[:2], b.configs[3:]...)
	}
	if b.opts.parts[partLatency] && b.opts.tunnelStart && b.opts.agent {
		tc, err := b.tunStartConfigs()
		if err != nil {
			return err
		}
		b.configs = append(b.configs, tc...)
	}
	switch {
	case b.opts.parts[partLatency]:
	case b.opts.parts[partScale]:
		// Only the configurations measured at scale.
		var keep []*config
		for _, c := range b.configs {
			if c.atScale {
				keep = append(keep, c)
			}
		}
		b.configs = keep
	default:
		b.configs = nil
	}
	if b.opts.parts[partHostPort] {
		b.hpCfgs = b.hpConfigs()
	}
	for _, c := range append(append([]*config(nil), b.configs...), b.hpCfgs...) {
		if err := b.register(c); err != nil {
			return err
		}
	}
	return nil
}

// register writes a configuration's conflist where cnitool (and, with
// c.confDir, the agent) finds it, and records it in the results.
func (b *bench) register(c *config) error {
	c.list["cniVersion"] = cniVersion
	c.list["name"] = c.netName
	data, err := json.MarshalIndent(c.list, "", "  ")
	if err != nil {
		return err
	}
	dirs := []string{b.confDir, c.confDir}
	if c.tun != nil {
		// The node's agent renders it into b.confDir (tunstart.go).
		dirs = []string{filepath.Dir(c.tun.tmpl)}
	}
	for _, dir := range dirs {
		if dir == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, c.netName+".conflist"), data, 0o600); err != nil {
			return err
		}
	}
	b.res.addConfig(c, string(data))
	return nil
}

// newPod creates a fresh pod network namespace (not timed).
func (b *bench) newPod() (ns.NetNS, error) {
	b.podMu.Lock()
	b.podSeq++
	path := filepath.Join(b.nsDir, fmt.Sprintf("pod-%d", b.podSeq))
	b.podMu.Unlock()
	p, err := testenv.NewNetNS(path)
	if err != nil {
		return nil, fmt.Errorf("create pod netns: %w", err)
	}
	// lo up, as runtimes bring it up before the pod's network (containerd
	// and podman with the loopback plugin, CRI-O itself): ebpf-cni's DEL
	// parks the pod's nexthop objects on lo (issue 30, round 14).
	if err := p.Do(func(ns.NetNS) error {
		return netlink.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo"}})
	}); err != nil {
		testenv.RemoveNetNS(p)
		return nil, fmt.Errorf("pod netns: lo up: %w", err)
	}
	b.podMu.Lock()
	b.pods[p.Path()] = p
	b.podMu.Unlock()
	return p, nil
}

func (b *bench) removePod(p ns.NetNS) error {
	b.podMu.Lock()
	delete(b.pods, p.Path())
	b.podMu.Unlock()
	return testenv.RemoveNetNS(p)
}

// cnitool runs `cnitool VERB NET NETNS` in the node netns and returns its
// wall time: process start to exit, as a runtime waiting on CNI sees it.
func (b *bench) cnitool(c *config, verb string, pod ns.NetNS) (time.Duration, []byte, []byte, error) {
	return b.cnitoolCap(c, verb, pod, c.capArgs)
}

// cnitoolCap is cnitool with the CAP_ARGS (capability arguments) given.
func (b *bench) cnitoolCap(c *config, verb string, pod ns.NetNS, capArgs string) (time.Duration, []byte, []byte, error) {
	r, err := b.cnitoolRun(c, verb, pod, capArgs)
	return r.wall, r.stdout, r.stderr, err
}

// verbRun is one cnitool run: its wall time, and the CPU time (user and
// system) of cnitool and every process it waited for (the plugins, and
// the IPAM plugin they exec): on a machine others load, what a verb
// costs the node's CPUs moves far less than its wall time (issue 30).
type verbRun struct {
	wall, cpu      time.Duration
	stdout, stderr []byte
}

// cnitoolRun is cnitoolCap with the CPU time.
func (b *bench) cnitoolRun(c *config, verb string, pod ns.NetNS, capArgs string) (verbRun, error) {
	cniPath := b.binDir
	if c.cniPath != "" {
		cniPath = c.cniPath
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"NETCONFPATH=" + b.confDir,
		"CNI_PATH=" + cniPath,
		"CNI_IFNAME=" + ifName,
	}
	if capArgs != "" {
		env = append(env, "CAP_ARGS="+capArgs)
	}
	if c.isEBPF() && b.opts.phases {
		// ebpf-cni prints one line of phase timings to stderr; cnitool
		// passes plugin stderr through.
		env = append(env, "EBPF_CNI_TRACE=1")
	}
	var stdout, stderr bytes.Buffer
	var d, cpu time.Duration
	var runErr error
	err := b.nodeOf(c).Do(func(ns.NetNS) error {
		// Forked from this goroutine's locked thread: born in the node netns.
		cmd := exec.Command(filepath.Join(b.binDir, "cnitool"), verb, c.netName, pod.Path())
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		runErr = cmd.Run()
		end := time.Now()
		d = end.Sub(start)
		if ps := cmd.ProcessState; ps != nil {
			cpu = ps.UserTime() + ps.SystemTime() // wait4's rusage: waited-for children included
		}
		b.podMu.Lock()
		if end.After(b.verbEnd) {
			b.verbEnd = end
		}
		b.podMu.Unlock()
		return nil
	})
	if err == nil && runErr != nil {
		err = fmt.Errorf("cnitool %s %s %s: %v\nstdout: %s\nstderr: %s", verb, c.netName, pod.Path(), runErr,
			strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String()))
	}
	return verbRun{wall: d, cpu: cpu, stdout: stdout.Bytes(), stderr: stderr.Bytes()}, err
}

// addResult is the part of a CNI result the sanity checks read.
type addResult struct {
	CNIVersion string `json:"cniVersion"`
	Interfaces []struct {
		Name    string `json:"name"`
		Sandbox string `json:"sandbox"`
	} `json:"interfaces"`
	IPs []struct {
		Address   string `json:"address"`
		Interface *int   `json:"interface"`
	} `json:"ips"`
}

// checkAdd verifies the ADD result and that the pod really got it.
func (b *bench) checkAdd(c *config, pod ns.NetNS, out []byte) error {
	fail := func(format string, a ...any) error {
		return fmt.Errorf("%s ADD in %s: %s\nresult: %s", c.label, pod.Path(), fmt.Sprintf(format, a...), bytes.TrimSpace(out))
	}
	var r addResult
	if err := json.Unmarshal(out, &r); err != nil {
		return fail("result is not JSON: %v", err)
	}
	if r.CNIVersion != cniVersion {
		return fail("cniVersion %q, want %s", r.CNIVersion, cniVersion)
	}
	if len(r.IPs) == 0 {
		return fail("no ips in the result")
	}
	var addrs []*net.IPNet
	for _, ipc := range r.IPs {
		ip, n, err := net.ParseCIDR(ipc.Address)
		if err != nil {
			return fail("ips: %q is not a CIDR", ipc.Address)
		}
		n.IP = ip
		if c.subnet != nil && !c.subnet.Contains(ip) {
			return fail("address %s is outside %s", ip, c.subnet)
		}
		if c.subnet == nil && !ip.IsLoopback() {
			return fail("address %s is not a loopback address", ip)
		}
		addrs = append(addrs, n)
	}
	dev := ifName
	if c.subnet == nil {
		dev = "lo"
	}
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("no %s in the pod: %v", dev, err)
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("%s in the pod is down", dev)
		}
		have, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, want := range addrs {
			found := false
			for _, a := range have {
				if a.IP.Equal(want.IP) {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("%s in the pod lacks %s", dev, want)
			}
		}
		return nil
	})
	if err != nil {
		return fail("%v", err)
	}
	if c.key == "chain" {
		if err := b.checkChain(c, r); err != nil {
			return fail("%v", err)
		}
	}
	if err := checkMTU(c, pod); err != nil {
		return fail("%v", err)
	}
	return nil
}

// checkChain proves portmap and bandwidth did their work: a DNAT rule for the
// host port, and tbf qdiscs on the host veth and its ifb.
func (b *bench) checkChain(c *config, r addResult) error {
	hostIf := ""
	for _, i := range r.Interfaces {
		if i.Sandbox == "" {
			hostIf = i.Name
		}
	}
	if hostIf == "" {
		return errors.New("no host interface in the result")
	}
	rules, err := nodeIptablesNAT(b.nodeOf(c))
	if err != nil {
		return err
	}
	if !strings.Contains(rules, fmt.Sprintf("--dport %d", hostPort)) {
		return fmt.Errorf("portmap: no rule for host port %d in the node's nat table:\n%s", hostPort, rules)
	}
	return b.nodeOf(c).Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		tbfOn := map[string]bool{}
		ifb := ""
		for _, l := range links {
			if l.Type() == "ifb" {
				ifb = l.Attrs().Name
			}
			qs, err := netlink.QdiscList(l)
			if err != nil {
				return err
			}
			for _, q := range qs {
				if q.Type() == "tbf" {
					tbfOn[l.Attrs().Name] = true
				}
			}
		}
		if !tbfOn[hostIf] {
			return fmt.Errorf("bandwidth: no tbf qdisc on host veth %s", hostIf)
		}
		if ifb == "" || !tbfOn[ifb] {
			return errors.New("bandwidth: no ifb device with a tbf qdisc for the egress limit")
		}
		return nil
	})
}

func nodeIptablesNAT(node ns.NetNS) (string, error) {
	var out []byte
	err := node.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("iptables-save", "-t", "nat").CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables-save in the node netns: %v: %s", err, out)
		}
		return nil
	})
	return string(out), err
}

// checkDel verifies the pod interface is gone after DEL.
func (b *bench) checkDel(c *config, pod ns.NetNS) error {
	if c.subnet == nil {
		return nil // loopback's DEL leaves lo as it is
	}
	return pod.Do(func(ns.NetNS) error {
		if _, err := netlink.LinkByName(ifName); err == nil {
			return fmt.Errorf("%s DEL in %s: %s still exists in the pod", c.label, pod.Path(), ifName)
		}
		return nil
	})
}

// leftovers lists what a configuration left in the node after all DELs.
func (b *bench) leftovers(c *config) ([]string, error) {
	var out []string
	err := b.nodeOf(c).Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if n := l.Attrs().Name; n != "lo" && n != "uplink0" && (!c.tun.tunnelled() || n != datapath.TunnelDevice) {
				out = append(out, fmt.Sprintf("link %s (%s)", l.Attrs().Name, l.Type()))
			}
		}
		if c.subnet == nil {
			return nil
		}
		routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst != nil && c.subnet.Contains(r.Dst.IP) {
				out = append(out, "route "+r.Dst.String())
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ents, _ := os.ReadDir(filepath.Join(b.ipamDir, c.netName))
	for _, e := range ents {
		if net.ParseIP(e.Name()) != nil {
			out = append(out, "host-local reservation "+e.Name())
		}
	}
	if c.isEBPF() {
		recs, _ := os.ReadDir(filepath.Join(b.stateOf(c), c.netName))
		for _, r := range recs {
			out = append(out, "ebpf-cni state record "+r.Name())
		}
		for _, p := range datapath.VethLinkPins(b.pinOf(c)) {
			out = append(out, "ebpf-cni link pin "+filepath.Base(p.Path))
		}
	}
	if c.key == "ptp-portmap" {
		rules, err := nodeIptablesNAT(b.nodeOf(c))
		if err != nil {
			return nil, err
		}
		if strings.Contains(rules, "CNI-DN-") {
			out = append(out, "portmap's per-pod CNI-DN- chains")
		}
	}
	if c.mapsPorts() && c.pinDir != "" {
		// A pin directory of its own: every mapping, flow and limit left is this configuration's.
		if m, err := datapath.OpenMaps(c.pinDir); err == nil {
			hps, _ := m.HostPorts().List()
			flows, _ := m.HostPorts().ListCT()
			limits, _ := m.Bandwidth().ListLimits()
			m.Close()
			if len(hps) > 0 || len(flows) > 0 || len(limits) > 0 {
				out = append(out, fmt.Sprintf("%d hostPort mappings, %d flows and %d bandwidth limits in the maps", len(hps), len(flows), len(limits)))
			}
		}
	}
	if c.key == "ebpf-hostport" {
		if m, err := datapath.OpenMaps(b.pinDir); err == nil {
			hps, _ := m.HostPorts().List()
			flows, _ := m.HostPorts().ListCT()
			m.Close()
			if len(hps) > 0 || len(flows) > 0 {
				out = append(out, fmt.Sprintf("%d hostPort mappings and %d flows in the maps", len(hps), len(flows)))
			}
		}
	}
	if c.key == "chain" {
		rules, err := nodeIptablesNAT(b.nodeOf(c))
		if err != nil {
			return nil, err
		}
		if strings.Contains(rules, fmt.Sprintf("--dport %d", hostPort)) {
			out = append(out, fmt.Sprintf("iptables rule for host port %d", hostPort))
		}
	}
	return out, nil
}

func (b *bench) assertClean(c *config) error {
	if err := b.settleAll(c); err != nil {
		return err
	}
	l, err := b.leftovers(c)
	if err != nil {
		return err
	}
	if len(l) > 0 {
		return fmt.Errorf("%s left state behind after DEL:\n  %s", c.label, strings.Join(l, "\n  "))
	}
	return nil
}

// addPod runs a checked ADD of a new pod and returns it with the ADD time.
func (b *bench) addPod(c *config) (ns.NetNS, time.Duration, error) {
	pod, err := b.newPod()
	if err != nil {
		return nil, 0, err
	}
	r, err := b.cnitoolRun(c, "add", pod, c.capArgs)
	d, out, stderr := r.wall, r.stdout, r.stderr
	if err != nil {
		return pod, 0, fmt.Errorf("ADD failed: %w", err)
	}
	b.lastAddCPU = r.cpu
	if err := b.checkAdd(c, pod, out); err != nil {
		return pod, 0, err
	}
	b.addPhases = parsePhases(stderr, "ADD")
	b.lastHostIf = hostIfOf(out)
	return pod, d, nil
}

// hostIfOf is the host-side interface of an ADD result (the one without a
// sandbox), "" for none.
func hostIfOf(out []byte) string {
	var r addResult
	if json.Unmarshal(out, &r) == nil {
		for _, i := range r.Interfaces {
			if i.Sandbox == "" {
				return i.Name
			}
		}
	}
	return ""
}

// ifindexOf is a node link's ifindex, 0 when there is none.
func (b *bench) ifindexOf(c *config, name string) int {
	idx := 0
	b.nodeOf(c).Do(func(ns.NetNS) error {
		if l, err := netlink.LinkByName(name); err == nil {
			idx = l.Attrs().Index
		}
		return nil
	})
	return idx
}

// delPod runs a checked DEL and removes the pod netns; it returns the DEL time.
func (b *bench) delPod(c *config, pod ns.NetNS) (time.Duration, error) {
	r, err := b.cnitoolRun(c, "del", pod, c.capArgs)
	d, stderr := r.wall, r.stderr
	if err != nil {
		return 0, fmt.Errorf("DEL failed: %w", err)
	}
	b.lastDelCPU = r.cpu
	b.delPhases = parsePhases(stderr, "DEL")
	if err := b.checkDel(c, pod); err != nil {
		return 0, err
	}
	if err := b.removePod(pod); err != nil {
		return 0, err
	}
	return d, nil
}

// cycle is one timed ADD and DEL of a fresh pod, recorded with pods
// present unless it is a warm-up (pods < 0). With an agent running, each
// verb starts once the agent's background work is done, and that work's
// time after each verb is recorded too (agent.go).
func (b *bench) cycle(c *config, pods int) (add, del time.Duration, err error) {
	pod, add, err := b.addPod(c)
	if err != nil {
		return 0, 0, err
	}
	host, addCPU := b.lastHostIf, b.lastAddCPU
	addBg, err := b.settle(c, bgWork{hostIfs: []string{host}})
	if err != nil {
		return 0, 0, err
	}
	idx := b.ifindexOf(c, host)
	del, err = b.delPod(c, pod)
	if err != nil {
		return 0, 0, err
	}
	delBg, err := b.settle(c, bgWork{handedOff: []int{idx}})
	if err != nil {
		return 0, 0, err
	}
	if pods >= 0 {
		b.res.record(c, "ADD", pods, add, b.addPhases)
		b.res.record(c, "DEL", pods, del, b.delPhases)
		if b.hasAgent(c) {
			b.res.record(c, opAddBg, pods, addBg, nil)
			b.res.record(c, opDelBg, pods, delBg, nil)
		}
		if c.tun != nil {
			// The tunnel comparison (tunstart.go): what the verbs cost the
			// CPUs moves far less than their wall time on a loaded machine.
			b.res.record(c, opAddCPU, pods, addCPU, nil)
			b.res.record(c, opDelCPU, pods, b.lastDelCPU, nil)
		}
	}
	return add, del, nil
}

// The agent's background work after a verb, recorded as series of these ops.
const (
	opAddBg = "ADD background"
	opDelBg = "DEL background"
	// The CPU time of a burst's verbs (burstRows).
	opAddCPU = "ADD CPU time"
	opDelCPU = "DEL CPU time"
)

// parsePhases reads ebpf-cni's EBPF_CNI_TRACE line for verb, e.g.
// "ebpf-cni ADD: total=12.34ms parse=0.50ms ...", into ordered phases.
func parsePhases(stderr []byte, verb string) []phase {
	prefix := "ebpf-cni " + verb + ":"
	for _, line := range strings.Split(string(stderr), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix)
		if !ok {
			continue
		}
		var ps []phase
		for _, f := range strings.Fields(rest) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			var x float64
			if _, err := fmt.Sscanf(strings.TrimSuffix(v, "ms"), "%g", &x); err == nil {
				ps = append(ps, phase{k, x})
			}
		}
		return ps
	}
	return nil
}

func (b *bench) run(ctx context.Context) error {
	start := time.Now()
	part := func(name string, f func() error) error {
		t := time.Now()
		if err := f(); err != nil {
			return err
		}
		b.res.PartTimes = append(b.res.PartTimes, partTime{name, time.Since(t).Round(time.Second).String()})
		return nil
	}
	// Throughput first: before the other parts have created and deleted
	// hundreds of namespaces, whose teardown the kernel finishes in the
	// background for a while.
	if b.opts.parts[partThroughput] {
		if err := part("throughput", func() error { return b.runThroughput(ctx, start) }); err != nil {
			return fmt.Errorf("throughput benchmark: %w", err)
		}
	}
	if len(b.configs) > 0 {
		if err := part("latency and scale", func() error { return b.runLatency(ctx, start) }); err != nil {
			return err
		}
	}
	if len(b.hpCfgs) > 0 {
		if err := part("hostPort", func() error { return b.runHostPort(ctx, start) }); err != nil {
			return fmt.Errorf("hostPort benchmark: %w", err)
		}
	}
	if b.opts.parts[partMemory] {
		if err := part("memory", func() error { return b.runMemory(ctx, start) }); err != nil {
			return fmt.Errorf("memory benchmark: %w", err)
		}
	}
	if b.opts.parts[partBurst] {
		if err := part("burst", func() error { return b.runBurst(ctx, start) }); err != nil {
			return fmt.Errorf("burst benchmark: %w", err)
		}
	}
	if b.opts.parts[partColdStart] {
		if err := part("coldstart", func() error { return b.runColdStart(ctx, start) }); err != nil {
			return fmt.Errorf("coldstart benchmark: %w", err)
		}
	}
	b.res.Elapsed = time.Since(start).Round(time.Millisecond).String()
	logf("measurements done in %s", time.Since(start).Round(time.Second))
	return b.res.write(b.opts.outDir)
}

// runLatency is the ADD/DEL latency benchmark: warm-up, interleaved rounds,
// then the at-scale runs.
func (b *bench) runLatency(ctx context.Context, start time.Time) error {
	if b.opts.agent {
		// An agent per node with ebpf-cni pods, as a node would have it.
		nodes := map[string]*config{}
		for _, c := range b.configs {
			if c.isEBPF() && nodes[b.pinOf(c)] == nil {
				nodes[b.pinOf(c)] = c
			}
		}
		for pin, c := range nodes {
			if _, _, err := b.startAgent(ctx, b.nodeOf(c), pin, b.confDir, true, c.tun.agentFlags()...); err != nil {
				return err
			}
			if c.tun != nil {
				if err := b.tunStartReady(ctx, c); err != nil {
					return err
				}
			}
		}
	}
	if b.opts.parts[partLatency] {
		if err := b.runRounds(ctx, start); err != nil {
			return err
		}
	}
	if b.opts.parts[partScale] {
		for _, c := range b.configs {
			if c.atScale {
				if err := b.runScale(ctx, c, start); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// runRounds is the ADD/DEL latency of one pod: warm-up, then interleaved rounds.
func (b *bench) runRounds(ctx context.Context, start time.Time) error {
	// Warm-up: page cache, and for ebpf-cni loading and pinning the datapath.
	for _, c := range b.configs {
		if err := ctx.Err(); err != nil {
			return err
		}
		add, del, err := b.cycle(c, -1)
		if err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		b.res.warmup(c, add, del, b.addPhases, b.delPhases)
		logf("warm-up %-22s ADD %7.2f ms  DEL %7.2f ms", c.label, ms(add), ms(del))
	}
	if len(datapath.ProgramPins(b.pinDir)) == 0 {
		return fmt.Errorf("ebpf-cni warm-up ADD did not pin the datapath in %s", b.pinDir)
	}

	// Configurations interleaved, order balanced (roundOrder), so drift and
	// background work (async netns teardown) hit all of them alike.
	logf("latency: %d rounds of ADD+DEL over %d configurations", b.opts.n, len(b.configs))
	roundsStart, ticks := time.Now(), b.agentTicks()
	for i := 0; i < b.opts.n; i++ {
		for _, c := range b.roundOrder(i) {
			if err := ctx.Err(); err != nil {
				return err
			}
			if _, _, err := b.cycle(c, 0); err != nil {
				return err
			}
		}
		if (i+1)%5 == 0 || i+1 == b.opts.n {
			logf("  round %d/%d (%s)", i+1, b.opts.n, time.Since(start).Round(time.Second))
		}
	}
	b.logAgentCPU(ticks, time.Since(roundsStart))
	for _, c := range b.configs {
		if err := b.assertClean(c); err != nil {
			return err
		}
	}
	return nil
}

// runScale grows a population of pods of one configuration through each
// scale point and times scaleReps more ADD+DEL at each.
func (b *bench) runScale(ctx context.Context, c *config, start time.Time) error {
	// On failure or interrupt the pods are left to cleanup, which removes
	// their namespaces and the node's.
	var (
		present []ns.NetNS
		hosts   bgWork // their host veths, for the agent's background work
	)
	for _, p := range b.opts.scale {
		if len(present) < p {
			logf("at scale %s: adding pods %d..%d", c.label, len(present)+1, p)
		}
		for len(present) < p {
			if err := ctx.Err(); err != nil {
				return err
			}
			pod, _, err := b.addPod(c)
			if err != nil {
				return fmt.Errorf("at scale, pod %d: %w", len(present)+1, err)
			}
			present = append(present, pod)
			hosts.hostIfs = append(hosts.hostIfs, b.lastHostIf)
			if n := len(present); n%50 == 0 || n == p {
				logf("  %s: %d/%d pods present (%s)", c.label, n, p, time.Since(start).Round(time.Second))
			}
		}
		if bg, err := b.settle(c, hosts); err != nil {
			return err
		} else if bg > 0 {
			logf("  %s: the agent moved the pods to tcx %s after the last ADD", c.label, bg.Round(time.Millisecond))
		}
		for i := 0; i < b.opts.scaleReps; i++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			if _, _, err := b.cycle(c, p); err != nil {
				return fmt.Errorf("at scale %d: %w", p, err)
			}
		}
		logf("  %s: timed %d ADD+DEL with %d pods present", c.label, b.opts.scaleReps, p)
	}
	for _, p := range present {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := b.delPod(c, p); err != nil {
			return fmt.Errorf("at scale teardown: %w", err)
		}
		present = present[1:]
	}
	return b.assertClean(c)
}

// cleanup removes everything the run created; it is safe on a partial setup.
func (b *bench) cleanup() {
	var errs []error
	if n := b.procs.KillAll(); n > 0 {
		logf("killed %d leftover processes (iperf3, ebpf-agent)", n)
	}
	for path, p := range b.pods {
		if err := testenv.RemoveNetNS(p); err != nil {
			errs = append(errs, err)
		}
		delete(b.pods, path)
	}
	if b.hp != nil {
		for _, n := range []ns.NetNS{b.hp.remote, b.hp.rawClient, b.hp.rawServer} {
			if n != nil {
				if err := testenv.RemoveNetNS(n); err != nil {
					errs = append(errs, err)
				}
			}
		}
		b.hp = nil
	}
	for path, n := range b.netnses {
		if err := testenv.RemoveNetNS(n); err != nil {
			errs = append(errs, err)
		}
		delete(b.netnses, path)
	}
	if b.node != nil {
		if err := testenv.RemoveNetNS(b.node); err != nil {
			errs = append(errs, err)
		}
		b.node = nil
	}
	for _, p := range append([]string{b.pinDir}, b.pinDirs...) {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("remove pin dir: %w", err))
		}
	}
	if b.cacheMount != "" {
		if err := unix.Unmount(b.cacheMount, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", b.cacheMount, err))
		}
		b.cacheMount = ""
	}
	if err := os.RemoveAll(b.root); err != nil {
		errs = append(errs, fmt.Errorf("remove temp dir: %w", err))
	}
	if len(errs) > 0 {
		logf("cleanup incomplete: %v", errors.Join(errs...))
		return
	}
	logf("cleaned up: processes, node and pod namespaces, %s, %s", strings.Join(append([]string{b.pinDir}, b.pinDirs...), ", "), b.root)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
