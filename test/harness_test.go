// Package test drives the built ebpf-cni binary exactly as a runtime does
// (libcni: env + stdin JSON) inside network namespaces each test creates, and
// proves the datapath with real packets.
package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// binDir holds the freshly built plugin and the IPAM plugin it delegates to.
var binDir string

// Node addresses every test node namespace gets on lo.
var (
	nodeIP4 = net.ParseIP("192.0.2.1")
	nodeIP6 = net.ParseIP("fd00:1::1")
)

const (
	podSubnet4 = "10.250.0.0/24"
	podSubnet6 = "fd00:250::/64"
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "integration tests need root; CI must run them as root")
			os.Exit(1)
		}
		fmt.Println("skipping integration tests: they need root (network namespaces, BPF)")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "ebpf-cni-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	if err := buildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	if err := datapath.EnsureBPFFS(datapath.BPFFSRoot); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildBinaries builds the plugin from this tree, and the reference plugins
// the tests chain or combine it with (host-local and static IPAM, ptp,
// tuning) at the version go.mod pins, as a runtime would find them in CNI_PATH.
func buildBinaries(dir string) error {
	for _, pkg := range []string{
		"github.com/ebpf-cni/ebpf-cni/cmd/ebpf-cni",
		"github.com/ebpf-cni/ebpf-cni/cmd/ebpf-agent",
		"github.com/containernetworking/plugins/plugins/ipam/host-local",
		"github.com/containernetworking/plugins/plugins/ipam/static",
		"github.com/containernetworking/plugins/plugins/main/ptp",
		"github.com/containernetworking/plugins/plugins/meta/tuning",
	} {
		cmd := exec.Command("go", "build", "-o", dir+"/", pkg)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return nil
}

func randName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// env is one simulated node: its own netns, bpffs pin dir, state and IPAM dirs.
type env struct {
	t        *testing.T
	name     string // network name
	node     ns.NetNS
	pinDir   string
	stateDir string
	dataDir  string
	cacheDir string
	cni      *libcni.CNIConfig
	// extra fields merged into the plugin config
	extra map[string]any
	// ipam block; nil means the dual-stack default
	ipam map[string]any
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, name: randName("net")}
	node, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create node netns: %v", err)
	}
	e.node = node
	t.Cleanup(func() {
		node.Close()
		testutils.UnmountNS(node)
	})
	err = node.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		for _, a := range []string{nodeIP4.String() + "/32", nodeIP6.String() + "/128"} {
			addr, _ := netlink.ParseAddr(a)
			if err := netlink.AddrAdd(lo, addr); err != nil {
				return fmt.Errorf("add %s: %w", a, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("set up node netns: %v", err)
	}
	e.pinDir = filepath.Join(datapath.BPFFSRoot, randName("ebpf-cni-test-"))
	t.Cleanup(func() { os.RemoveAll(e.pinDir) })
	e.stateDir = t.TempDir()
	e.dataDir = t.TempDir()
	e.cacheDir = t.TempDir()
	e.cni = libcni.NewCNIConfigWithCacheDir([]string{binDir}, e.cacheDir, nil)
	return e
}

// newPod creates a pod network namespace removed at the end of the test.
func (e *env) newPod() ns.NetNS {
	e.t.Helper()
	p, err := testutils.NewNS()
	if err != nil {
		e.t.Fatalf("create pod netns: %v", err)
	}
	e.t.Cleanup(func() {
		p.Close()
		testutils.UnmountNS(p)
	})
	return p
}

// pluginConf is the ebpf-cni entry of the conflist.
func (e *env) pluginConf() map[string]any {
	ipam := e.ipam
	if ipam == nil {
		ipam = map[string]any{
			"type":    "host-local",
			"dataDir": e.dataDir,
			"ranges": [][]map[string]string{
				{{"subnet": podSubnet4}},
				{{"subnet": podSubnet6}},
			},
		}
	}
	c := map[string]any{
		"type":     "ebpf-cni",
		"pinDir":   e.pinDir,
		"stateDir": e.stateDir,
		"ipam":     ipam,
	}
	for k, v := range e.extra {
		c[k] = v
	}
	return c
}

// confList builds the conflist a runtime would read from /etc/cni/net.d.
func (e *env) confList(version string) *libcni.NetworkConfigList {
	e.t.Helper()
	b, err := json.Marshal(map[string]any{
		"cniVersion": version,
		"name":       e.name,
		"plugins":    []any{e.pluginConf()},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		e.t.Fatalf("parse conflist: %v", err)
	}
	return l
}

func (e *env) rt(pod ns.NetNS, containerID, ifname string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: containerID, NetNS: pod.Path(), IfName: ifname}
}

// inNode runs f with the calling thread in the node netns; processes started
// from f (libcni's plugin exec) are born there.
func (e *env) inNode(f func() error) error {
	return e.node.Do(func(ns.NetNS) error { return f() })
}

// addV adds a pod with the given CNI version and returns the raw result.
func (e *env) addV(version string, pod ns.NetNS, containerID, ifname string) (types.Result, error) {
	var res types.Result
	err := e.inNode(func() error {
		var err error
		res, err = e.cni.AddNetworkList(context.Background(), e.confList(version), e.rt(pod, containerID, ifname))
		return err
	})
	return res, err
}

// add adds a pod at CNI 1.1.0 and fails the test on error.
func (e *env) add(pod ns.NetNS, containerID string) *current.Result {
	e.t.Helper()
	res, err := e.addV("1.1.0", pod, containerID, "eth0")
	if err != nil {
		e.t.Fatalf("ADD %s: %v", containerID, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		e.t.Fatalf("ADD %s result: %v", containerID, err)
	}
	return r
}

func (e *env) del(pod ns.NetNS, containerID, ifname string) error {
	return e.inNode(func() error {
		rt := &libcni.RuntimeConf{ContainerID: containerID, IfName: ifname}
		if pod != nil {
			rt.NetNS = pod.Path()
		}
		return e.cni.DelNetworkList(context.Background(), e.confList("1.1.0"), rt)
	})
}

func (e *env) check(pod ns.NetNS, containerID, ifname string) error {
	return e.inNode(func() error {
		return e.cni.CheckNetworkList(context.Background(), e.confList("1.1.0"), e.rt(pod, containerID, ifname))
	})
}

func (e *env) gc(valid ...types.GCAttachment) error {
	return e.inNode(func() error {
		return e.cni.GCNetworkList(context.Background(), e.confList("1.1.0"), &libcni.GCArgs{ValidAttachments: valid})
	})
}

func (e *env) status() error {
	return e.inNode(func() error {
		return e.cni.GetStatusNetworkList(context.Background(), e.confList("1.1.0"))
	})
}

// execPlugin runs the plugin binary in the node netns with an explicit
// environment and stdin, for the cases libcni would refuse to produce.
func (e *env) execPlugin(envv map[string]string, stdin []byte) (stdout []byte, err error) {
	err = e.inNode(func() error {
		cmd := exec.Command(filepath.Join(binDir, "ebpf-cni"))
		cmd.Env = []string{}
		for k, v := range envv {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stdin = bytes.NewReader(stdin)
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = io.Discard
		runErr := cmd.Run()
		stdout = out.Bytes()
		return runErr
	})
	return stdout, err
}

// pluginError decodes the CNI error a failed plugin printed.
func pluginError(t *testing.T, stdout []byte) *types.Error {
	t.Helper()
	var te types.Error
	if err := json.Unmarshal(stdout, &te); err != nil {
		t.Fatalf("plugin output is not a CNI error: %v: %s", err, stdout)
	}
	return &te
}

// errCode extracts the CNI error code of an error returned by libcni.
func errCode(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

// maps opens the env's pinned maps.
func (e *env) maps() *maps.Maps {
	e.t.Helper()
	m, err := maps.Open(e.pinDir)
	if err != nil {
		e.t.Fatalf("open pinned maps: %v", err)
	}
	e.t.Cleanup(m.Close)
	return m
}

// hostIfindex returns the ifindex of a link in the node netns.
func (e *env) hostIfindex(name string) int {
	e.t.Helper()
	idx := 0
	err := e.inNode(func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		idx = l.Attrs().Index
		return nil
	})
	if err != nil {
		e.t.Fatalf("find %s in node: %v", name, err)
	}
	return idx
}

// podIPs returns the IPv4 and IPv6 address of a result.
func podIPs(t *testing.T, r *current.Result) (v4, v6 net.IP) {
	t.Helper()
	for _, ipc := range r.IPs {
		if ipc.Address.IP.To4() != nil {
			v4 = ipc.Address.IP
		} else {
			v6 = ipc.Address.IP
		}
	}
	if v4 == nil || v6 == nil {
		t.Fatalf("result lacks a dual-stack address: %+v", r.IPs)
	}
	return v4, v6
}

// ping sends count ICMP echoes from netns to ip with the system ping.
func ping(netns ns.NetNS, ip net.IP, count int) error {
	return netns.Do(func(ns.NetNS) error {
		args := []string{"-c", fmt.Sprint(count), "-i", "0.2", "-W", "2", ip.String()}
		if ip.To4() == nil {
			args = append([]string{"-6"}, args...)
		}
		out, err := exec.Command("ping", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping %s: %v\n%s", ip, err, out)
		}
		return nil
	})
}

// tcpTransfer sends n random bytes from src to a listener in dst on ip and
// checks that the same bytes arrive.
func tcpTransfer(src, dst ns.NetNS, ip net.IP, n int) error {
	return tcpTransferPort(src, dst, ip, 0, n)
}

// tcpTransferPort is tcpTransfer to a listener on port (0: any).
func tcpTransferPort(src, dst ns.NetNS, ip net.IP, lport, n int) error {
	var ln net.Listener
	err := dst.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(ip.String(), fmt.Sprint(lport)))
		return err
	})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", ip, err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	payload := make([]byte, n)
	rand.Read(payload)
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		b, _ := io.ReadAll(c)
		got <- b
	}()
	err = src.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", net.JoinHostPort(ip.String(), fmt.Sprint(port)))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		_, err = c.Write(payload)
		return err
	})
	if err != nil {
		return fmt.Errorf("send to %s: %w", ip, err)
	}
	b := <-got
	if !bytes.Equal(b, payload) {
		return fmt.Errorf("received %d bytes, want the %d sent", len(b), n)
	}
	return nil
}

// leftovers lists every trace of ebpf-cni in the env: veths, routes to pods,
// IPAM reservations, map entries, link pins and state records.
func (e *env) leftovers() []string {
	e.t.Helper()
	var out []string
	e.inNode(func() error {
		links, _ := netlink.LinkList()
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "ebpf") {
				out = append(out, "link "+l.Attrs().Name)
			}
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			routes, _ := netlink.RouteList(nil, fam)
			for _, r := range routes {
				if r.Dst == nil {
					continue
				}
				for _, s := range []string{podSubnet4, podSubnet6} {
					_, sn, _ := net.ParseCIDR(s)
					if sn.Contains(r.Dst.IP) {
						out = append(out, "route "+r.Dst.String())
					}
				}
			}
		}
		return nil
	})
	ents, _ := os.ReadDir(filepath.Join(e.dataDir, e.name))
	for _, en := range ents {
		if net.ParseIP(en.Name()) != nil {
			out = append(out, "ipam reservation "+en.Name())
		}
	}
	if m, err := maps.Open(e.pinDir); err == nil {
		eps, _ := m.ListEndpoints()
		for _, ep := range eps {
			out = append(out, "endpoint map entry "+ep.IP.String())
		}
		var k uint32
		var v maps.LinkInfo
		it := m.Links.Iterate()
		for it.Next(&k, &v) {
			out = append(out, fmt.Sprintf("links map entry %d", k))
		}
		all, _ := m.AllCounters()
		for idx := range all {
			out = append(out, fmt.Sprintf("counters of ifindex %d", idx))
		}
		lims, _ := m.ListLimits()
		for _, l := range lims {
			out = append(out, fmt.Sprintf("%s limit of ifindex %d", l.Dir, l.Ifindex))
		}
		nss, _ := m.ListNetns()
		for cookie, v := range nss {
			if v.Flags&maps.FlagNetnsNode == 0 { // the node's own entry stays with the node
				out = append(out, fmt.Sprintf("netns entry %d", cookie))
			}
		}
		m.Close()
	}
	pins, _ := os.ReadDir(filepath.Join(e.pinDir, "links"))
	for _, p := range pins {
		if strings.HasPrefix(p.Name(), "node_") { // node-wide hooks outlive pods
			continue
		}
		out = append(out, "link pin "+p.Name())
	}
	recs, _ := os.ReadDir(filepath.Join(e.stateDir, e.name))
	for _, r := range recs {
		out = append(out, "state record "+r.Name())
	}
	return out
}

// assertClean fails the test if anything of ebpf-cni is left.
func (e *env) assertClean() {
	e.t.Helper()
	if l := e.leftovers(); len(l) > 0 {
		e.t.Fatalf("state left behind:\n  %s", strings.Join(l, "\n  "))
	}
}
