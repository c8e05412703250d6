package bandwidth

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
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

const (
	cniVersion = "1.0.0"
	ifName     = "eth0"
	// containerdBurst is what containerd 1.6 passes as burst whatever the rate.
	containerdBurst = 4294967295
	nodeIP          = "192.0.2.1/32"
)

// The remote host of each configuration: a netns routed to its node over an
// uplink veth, whose TCP the node cannot pace (issue 15).
var (
	uplinkIP = net.ParseIP("198.51.100.1").To4()
	remoteIP = net.ParseIP("198.51.100.2").To4()
)

// binaries built into the temp bin dir; ebpf-cni from this tree, the rest at
// the versions go.mod pins as tool dependencies.
var binaries = []string{
	"./cmd/ebpf-cni",
	"github.com/containernetworking/plugins/plugins/ipam/host-local",
	"github.com/containernetworking/plugins/plugins/main/ptp",
	"github.com/containernetworking/plugins/plugins/meta/bandwidth",
	"github.com/containernetworking/cni/cnitool",
}

// config is one network configuration under test, with its own node netns.
type config struct {
	key     string // ebpf, chain
	label   string
	netName string
	subnet  *net.IPNet
	list    map[string]any

	node   ns.NetNS
	peer   *pod
	remote *pod // another host, behind the node's uplink
}

// pod is a pod network namespace and what its ADD gave it.
type pod struct {
	name   string
	ns     ns.NetNS
	ip     net.IP
	hostIf string // host end of its veth in the node netns
	added  bool   // ADD succeeded and no DEL yet
}

type bench struct {
	opts    *Options
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
	netnses    map[string]ns.NetNS
	configs    []*config
	procs      *testenv.Procs
	maps       *maps.Maps // ebpf-cni's pinned maps, opened after its first ADD
	res        *results
}

// newBench prepares everything; on error the returned bench (if non-nil)
// holds what was created so far, for cleanup.
func newBench(ctx context.Context, opts *Options) (*bench, error) {
	id := testenv.RandHex(4)
	root, err := os.MkdirTemp("", "ebpfbwbench-"+id+"-")
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
		pinDir:  filepath.Join("/sys/fs/bpf", "ebpfbwbench-"+id),
		netnses: map[string]ns.NetNS{},
		procs:   testenv.NewProcs(),
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
	if b.cacheMount, err = testenv.HideCNICache(b.cache, ".ebpfbwbench-"+b.id, logf); err != nil {
		return b, err
	}
	if err := b.writeConfigs(); err != nil {
		return b, err
	}
	for _, c := range b.configs {
		if c.node, err = b.newNode(c.key); err != nil {
			return b, err
		}
		if c.remote, err = b.newRemote(c); err != nil {
			return b, err
		}
	}
	b.res.SchFq = b.probeFq(b.configs[0])
	return b, nil
}

// newRemote creates the configuration's remote host: uplink0 in the node,
// eth0 in the remote netns, the remote's default route via the node.
func (b *bench) newRemote(c *config) (*pod, error) {
	n, err := b.createNetNS("remote-" + c.key)
	if err != nil {
		return nil, err
	}
	if err := testenv.VethBetween(c.node, "uplink0", uplinkIP, n, "eth0", remoteIP); err != nil {
		return nil, fmt.Errorf("%s: uplink to the remote host: %w", c.label, err)
	}
	if err := testenv.RouteVia(n, "eth0", uplinkIP); err != nil {
		return nil, fmt.Errorf("%s: remote host's default route: %w", c.label, err)
	}
	return &pod{name: "remote", ns: n, ip: remoteIP}, nil
}

// probeFq tells whether the kernel has sch_fq, which EDT (skb->tstamp set by
// a BPF program) needs: ebpf-cni's queue is HTB because this one may not.
func (b *bench) probeFq(c *config) string {
	var res string
	_ = c.node.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			res = "unknown: " + err.Error()
			return nil
		}
		q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_ROOT,
			Handle: netlink.MakeHandle(0x77, 0)}, QdiscType: "fq"}
		if err := netlink.QdiscAdd(q); err != nil {
			res = "absent (" + err.Error() + ")"
			return nil
		}
		_ = netlink.QdiscDel(q)
		res = "present"
		return nil
	})
	return res
}

// createNetNS makes a namespace at nsDir/name and tracks it for cleanup.
func (b *bench) createNetNS(name string) (ns.NetNS, error) {
	n, err := testenv.NewNetNS(filepath.Join(b.nsDir, name))
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	b.netnses[n.Path()] = n
	return n, nil
}

func (b *bench) removeNetNS(n ns.NetNS) error {
	delete(b.netnses, n.Path())
	return testenv.RemoveNetNS(n)
}

// newNode creates a node netns: lo up with the node address on it.
func (b *bench) newNode(key string) (ns.NetNS, error) {
	node, err := b.createNetNS("node-" + key)
	if err != nil {
		return nil, err
	}
	return node, testenv.SetupNode(node, nodeIP)
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
		"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
	}
}

func (b *bench) writeConfigs() error {
	ebpfNet := mustCIDR("10.250.0.0/16")
	chainNet := mustCIDR("10.252.0.0/16")
	b.configs = []*config{
		{
			key: "ebpf", label: "ebpf-cni", netName: "bwbench-ebpf-cni", subnet: ebpfNet,
			list: map[string]any{"plugins": []any{map[string]any{
				"type": "ebpf-cni", "capabilities": map[string]bool{"bandwidth": true},
				"pinDir": b.pinDir, "stateDir": b.state, "ipam": b.hostLocal(ebpfNet),
			}}},
		},
		{
			key: "chain", label: "ptp+bandwidth", netName: "bwbench-chain", subnet: chainNet,
			list: map[string]any{"plugins": []any{
				map[string]any{"type": "ptp", "ipMasq": false, "ipam": b.hostLocal(chainNet)},
				map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}},
			}},
		},
	}
	for _, c := range b.configs {
		c.list["cniVersion"] = cniVersion
		c.list["name"] = c.netName
		data, err := json.MarshalIndent(c.list, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(b.confDir, c.netName+".conflist"), data, 0o600); err != nil {
			return err
		}
		b.res.addConfig(c, string(data))
	}
	return nil
}

// capArgs is the runtime's bandwidth capability for a limit in both
// directions, with containerd's burst.
func capArgs(rateBps uint64) string {
	data, err := json.Marshal(map[string]any{"bandwidth": map[string]uint64{
		"ingressRate": rateBps, "ingressBurst": containerdBurst,
		"egressRate": rateBps, "egressBurst": containerdBurst,
	}})
	if err != nil {
		panic(err)
	}
	return string(data)
}

// cnitool runs `cnitool VERB NET NETNS` in the configuration's node netns.
func (b *bench) cnitool(c *config, verb string, p *pod, capArgs string) ([]byte, error) {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"NETCONFPATH=" + b.confDir,
		"CNI_PATH=" + b.binDir,
		"CNI_IFNAME=" + ifName,
	}
	if capArgs != "" {
		env = append(env, "CAP_ARGS="+capArgs)
	}
	var stdout, stderr bytes.Buffer
	var runErr error
	err := c.node.Do(func(ns.NetNS) error {
		// Forked from this goroutine's locked thread: born in the node netns.
		cmd := exec.Command(filepath.Join(b.binDir, "cnitool"), verb, c.netName, p.ns.Path())
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		runErr = cmd.Run()
		return nil
	})
	if err == nil && runErr != nil {
		err = fmt.Errorf("cnitool %s %s %s: %v\nstdout: %s\nstderr: %s", verb, c.netName, p.ns.Path(), runErr,
			strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), err
}

// addResult is the part of a CNI result the benchmark reads.
type addResult struct {
	Interfaces []struct {
		Name    string `json:"name"`
		Sandbox string `json:"sandbox"`
	} `json:"interfaces"`
	IPs []struct {
		Address string `json:"address"`
	} `json:"ips"`
}

// addPod creates a pod netns and ADDs it with the given CAP_ARGS.
func (b *bench) addPod(c *config, name, capArgs string) (*pod, error) {
	n, err := b.createNetNS(c.key + "-" + name)
	if err != nil {
		return nil, err
	}
	p := &pod{name: name, ns: n}
	out, err := b.cnitool(c, "add", p, capArgs)
	if err != nil {
		// ADD undoes itself on failure; the netns goes now.
		_ = b.removeNetNS(n)
		return nil, fmt.Errorf("%s ADD %s: %w", c.label, name, err)
	}
	p.added = true
	var r addResult
	if err := json.Unmarshal(out, &r); err != nil {
		return p, fmt.Errorf("%s ADD %s: result is not JSON: %v\n%s", c.label, name, err, out)
	}
	for _, ipc := range r.IPs {
		ip, _, err := net.ParseCIDR(ipc.Address)
		if err == nil && ip.To4() != nil && c.subnet.Contains(ip) {
			p.ip = ip.To4()
		}
	}
	for _, i := range r.Interfaces {
		if i.Sandbox == "" && i.Name != "" && !strings.HasPrefix(i.Name, "bwp") {
			p.hostIf = i.Name
		}
	}
	if p.ip == nil || p.hostIf == "" {
		return p, fmt.Errorf("%s ADD %s: no IPv4 address in %s or no host interface in the result:\n%s", c.label, name, c.subnet, out)
	}
	return p, nil
}

// delPod DELs a pod (with the CAP_ARGS it was added with) and removes its netns.
func (b *bench) delPod(c *config, p *pod, capArgs string) error {
	if p.added {
		if _, err := b.cnitool(c, "del", p, capArgs); err != nil {
			return fmt.Errorf("%s DEL %s: %w", c.label, p.name, err)
		}
		p.added = false
	}
	return b.removeNetNS(p.ns)
}

// limiterInfo describes what the configuration installed for the limited
// pod, and fails when the limit is not in place.
func (b *bench) limiterInfo(c *config, p *pod, rateBps uint64) (string, error) {
	var ifindex int
	var qdiscs []string
	err := c.node.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(p.hostIf)
		if err != nil {
			return fmt.Errorf("host interface %s: %w", p.hostIf, err)
		}
		ifindex = l.Attrs().Index
		if c.key != "chain" {
			return nil
		}
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			qs, err := netlink.QdiscList(l)
			if err != nil {
				return err
			}
			for _, q := range qs {
				if t, ok := q.(*netlink.Tbf); ok {
					qdiscs = append(qdiscs, fmt.Sprintf("tbf on %s (%s): rate %d bit/s, buffer %d bytes (%.1f ms at the rate), limit %d bytes",
						l.Attrs().Name, l.Type(), t.Rate*8, netlink.Xmitsize(t.Rate, t.Buffer),
						float64(netlink.Xmitsize(t.Rate, t.Buffer))*8/float64(t.Rate*8)*1000, t.Limit))
				}
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if c.key == "chain" {
		if len(qdiscs) != 2 {
			return "", fmt.Errorf("bandwidth: want a tbf on the host veth and one on an ifb, found: %v", qdiscs)
		}
		return strings.Join(qdiscs, "; "), nil
	}
	if _, err := os.Stat(datapath.PacingLinkPin(b.pinDir)); err != nil {
		return "", fmt.Errorf("ebpf-cni: TCP pacing hook not attached: %w", err)
	}
	if b.maps == nil {
		if b.maps, err = datapath.OpenMaps(b.pinDir); err != nil {
			return "", err
		}
	}
	var parts []string
	for _, d := range []maps.Dir{maps.DirEgress, maps.DirIngress} {
		l, ok, err := b.maps.Bandwidth().LookupLimit(ifindex, d)
		if err != nil {
			return "", err
		}
		if !ok || l.RateBps != rateBps {
			return "", fmt.Errorf("ebpf-cni: no %s limit of %d bit/s for %s (found %v, %+v)", d, rateBps, p.hostIf, ok, l)
		}
		part := fmt.Sprintf("%s bucket on %s: rate %d bit/s, burst %d bits (%.1f ms at the rate)",
			d, p.hostIf, l.RateBps, l.BurstBits, float64(l.BurstBits)/float64(l.RateBps)*1000)
		if l.QueueNs != 0 {
			part += fmt.Sprintf(", ingress queue %.1f ms, CE marks over %.1f ms", float64(l.QueueNs)/1e6, float64(l.MarkNs)/1e6)
		}
		parts = append(parts, part)
	}
	var queue []string
	err = c.node.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(p.hostIf)
		if err != nil {
			return err
		}
		qs, err := netlink.QdiscList(l)
		if err != nil {
			return err
		}
		for _, q := range qs {
			queue = append(queue, q.Type())
		}
		cs, err := netlink.ClassList(l, netlink.MakeHandle(1, 0))
		if err != nil {
			return err
		}
		for _, cl := range cs {
			if h, ok := cl.(*netlink.HtbClass); ok {
				queue = append(queue, fmt.Sprintf("htb class %s at %d bit/s", netlink.HandleStr(h.Handle), h.Rate*8))
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	parts = append(parts, "qdiscs on "+p.hostIf+": "+strings.Join(queue, ", "))
	return strings.Join(parts, "; ") + "; TCP pacing and receive-window hook attached", nil
}

// limiterDrops is the number of packets the configuration's limiters have
// dropped so far in its node: ebpf-cni's drop_bandwidth counters and the
// drops of its ingress queues (htb and its bfifo), or the drops of every tbf
// qdisc.
func (b *bench) limiterDrops(c *config) (uint64, error) {
	var n uint64
	kinds := map[string]bool{"tbf": true}
	if c.key == "ebpf" {
		kinds = map[string]bool{"htb": true, "bfifo": true}
		if b.maps != nil {
			all, err := b.maps.Stats().All()
			if err != nil {
				return 0, err
			}
			for _, cs := range all {
				for k, v := range cs {
					if k.Reason == maps.ReasonDropBandwidth {
						n += v.Packets
					}
				}
			}
		}
	}
	err := c.node.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			qs, err := netlink.QdiscList(l)
			if err != nil {
				return err
			}
			for _, q := range qs {
				if !kinds[q.Type()] {
					continue
				}
				st := q.Attrs().Statistics
				if st == nil || st.Queue == nil {
					return fmt.Errorf("%s on %s: the kernel returned no queue statistics", q.Type(), l.Attrs().Name)
				}
				n += uint64(st.Queue.Drops)
			}
		}
		return nil
	})
	return n, err
}

// leftovers lists what a configuration left in its node after all DELs.
func (b *bench) leftovers(c *config) ([]string, error) {
	var out []string
	err := c.node.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if n := l.Attrs().Name; n != "lo" && n != "uplink0" {
				out = append(out, fmt.Sprintf("link %s (%s)", n, l.Type()))
			}
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
	if c.key == "ebpf" {
		recs, _ := os.ReadDir(filepath.Join(b.state, c.netName))
		for _, r := range recs {
			out = append(out, "ebpf-cni state record "+r.Name())
		}
		if b.maps != nil {
			if ls, err := b.maps.Bandwidth().ListLimits(); err == nil && len(ls) > 0 {
				out = append(out, fmt.Sprintf("%d cni_bandwidth entries", len(ls)))
			}
		}
	}
	return out, nil
}

// cleanup removes everything the run created; it is safe on a partial setup.
func (b *bench) cleanup() {
	var errs []error
	if n := b.procs.KillAll(); n > 0 {
		logf("killed %d leftover iperf3/ping processes", n)
	}
	if b.maps != nil {
		b.maps.Close()
		b.maps = nil
	}
	for path, n := range b.netnses {
		if err := testenv.RemoveNetNS(n); err != nil {
			errs = append(errs, err)
		}
		delete(b.netnses, path)
	}
	if err := os.RemoveAll(b.pinDir); err != nil {
		errs = append(errs, fmt.Errorf("remove pin dir: %w", err))
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
	logf("cleaned up: processes, node and pod namespaces, %s, %s", b.pinDir, b.root)
}
