// Package testenv is the harness every test of ebpf-cni drives the datapath
// with: a node network namespace with its own bpffs pin directory, state and
// IPAM directories (Env), pods, the built plugin driven exactly as a runtime
// drives it (libcni: env + stdin JSON), traffic, the agent, the attachment
// records (pkg/state), and the leak checks every test ends with. The bench
// kit (re-executing in a private mount namespace, processes in namespaces,
// iperf3, results tables) is here too, for the benchmark commands.
package testenv

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
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Main runs a test binary's tests with the harness: as root only (a run
// without root is an error under CI=1, a skip of the whole package
// otherwise), with the plugin, the agent and the reference plugins built
// into BinDir first and bpffs mounted. It returns the exit code.
func Main(m *testing.M) int {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "integration tests need root; CI must run them as root")
			return 1
		}
		fmt.Println("skipping integration tests: they need root (network namespaces, BPF)")
		return 0
	}
	dir, err := os.MkdirTemp("", "ebpf-cni-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	BinDir = dir
	if err := buildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := datapath.EnsureBPFFS(datapath.BPFFSRoot); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// BinDir holds the freshly built plugin and the IPAM plugin it delegates to.
var BinDir string

// buildBinaries builds the plugin from this tree, and the reference plugins
// the tests chain or combine it with (host-local and static IPAM, ptp,
// tuning, and the meta plugins users chain after a main plugin: bandwidth,
// portmap, firewall) at the version go.mod pins, as a runtime would find
// them in CNI_PATH.
func buildBinaries(dir string) error {
	for _, pkg := range []string{
		"github.com/ebpf-cni/ebpf-cni/cmd/ebpf-cni",
		"github.com/ebpf-cni/ebpf-cni/cmd/ebpf-agent",
		"github.com/containernetworking/plugins/plugins/ipam/host-local",
		"github.com/containernetworking/plugins/plugins/ipam/static",
		"github.com/containernetworking/plugins/plugins/main/ptp",
		"github.com/containernetworking/plugins/plugins/meta/tuning",
		"github.com/containernetworking/plugins/plugins/meta/bandwidth",
		"github.com/containernetworking/plugins/plugins/meta/portmap",
		"github.com/containernetworking/plugins/plugins/meta/firewall",
	} {
		cmd := exec.Command("go", "build", "-o", dir+"/", pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return nil
}

func RandName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Node addresses every test node namespace gets on lo.
var (
	NodeIP4 = net.ParseIP("192.0.2.1")
	NodeIP6 = net.ParseIP("fd00:1::1")
)

const (
	PodSubnet4 = "10.250.0.0/24"
	PodSubnet6 = "fd00:250::/64"
)

// Env is one simulated node: its own netns, bpffs pin dir, state and IPAM dirs.
type Env struct {
	T        *testing.T
	Name     string // network name
	Node     ns.NetNS
	PinDir   string
	StateDir string
	DataDir  string
	CacheDir string
	CNI      *libcni.CNIConfig
	// Extra fields merged into the plugin config
	Extra map[string]any
	// IPAM block; nil means the dual-stack default
	IPAM map[string]any
}

func New(t *testing.T) *Env {
	t.Helper()
	e := &Env{T: t, Name: RandName("net")}
	node := NewNS(t)
	e.Node = node
	err := node.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		for _, a := range []string{NodeIP4.String() + "/32", NodeIP6.String() + "/128"} {
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
	e.PinDir = filepath.Join(datapath.BPFFSRoot, RandName("ebpf-cni-test-"))
	t.Cleanup(func() { os.RemoveAll(e.PinDir) })
	e.StateDir = t.TempDir()
	e.DataDir = t.TempDir()
	e.CacheDir = t.TempDir()
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{BinDir}, e.CacheDir, nil)
	return e
}

// NewPod creates a pod network namespace removed at the end of the test.
func (e *Env) NewPod() ns.NetNS {
	e.T.Helper()
	return NewNS(e.T)
}

// PluginConf is the ebpf-cni entry of the conflist.
func (e *Env) PluginConf() map[string]any {
	ipam := e.IPAM
	if ipam == nil {
		ipam = map[string]any{
			"type":    "host-local",
			"dataDir": e.DataDir,
			"ranges": [][]map[string]string{
				{{"subnet": PodSubnet4}},
				{{"subnet": PodSubnet6}},
			},
		}
	}
	c := map[string]any{
		"type":     "ebpf-cni",
		"pinDir":   e.PinDir,
		"stateDir": e.StateDir,
		"ipam":     ipam,
	}
	for k, v := range e.Extra {
		c[k] = v
	}
	return c
}

// ConfList builds the conflist a runtime would read from /etc/cni/net.d.
func (e *Env) ConfList(version string) *libcni.NetworkConfigList {
	e.T.Helper()
	b, err := json.Marshal(map[string]any{
		"cniVersion": version,
		"name":       e.Name,
		"plugins":    []any{e.PluginConf()},
	})
	if err != nil {
		e.T.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		e.T.Fatalf("parse conflist: %v", err)
	}
	return l
}

func (e *Env) RuntimeConf(pod ns.NetNS, containerID, ifname string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: containerID, NetNS: pod.Path(), IfName: ifname}
}

// InNode runs f with the calling thread in the node netns; processes started
// from f (libcni's plugin exec) are born there.
func (e *Env) InNode(f func() error) error {
	return e.Node.Do(func(ns.NetNS) error { return f() })
}

// AddV adds a pod with the given CNI version and returns the raw result.
func (e *Env) AddV(version string, pod ns.NetNS, containerID, ifname string) (types.Result, error) {
	var res types.Result
	err := e.InNode(func() error {
		var err error
		res, err = e.CNI.AddNetworkList(context.Background(), e.ConfList(version), e.RuntimeConf(pod, containerID, ifname))
		return err
	})
	return res, err
}

// Add adds a pod at CNI 1.1.0 and fails the test on error.
func (e *Env) Add(pod ns.NetNS, containerID string) *current.Result {
	e.T.Helper()
	res, err := e.AddV("1.1.0", pod, containerID, "eth0")
	if err != nil {
		e.T.Fatalf("ADD %s: %v", containerID, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		e.T.Fatalf("ADD %s result: %v", containerID, err)
	}
	return r
}

func (e *Env) Del(pod ns.NetNS, containerID, ifname string) error {
	return e.InNode(func() error {
		rt := &libcni.RuntimeConf{ContainerID: containerID, IfName: ifname}
		if pod != nil {
			rt.NetNS = pod.Path()
		}
		return e.CNI.DelNetworkList(context.Background(), e.ConfList("1.1.0"), rt)
	})
}

func (e *Env) Check(pod ns.NetNS, containerID, ifname string) error {
	return e.InNode(func() error {
		return e.CNI.CheckNetworkList(context.Background(), e.ConfList("1.1.0"), e.RuntimeConf(pod, containerID, ifname))
	})
}

func (e *Env) GC(valid ...types.GCAttachment) error {
	return e.InNode(func() error {
		return e.CNI.GCNetworkList(context.Background(), e.ConfList("1.1.0"), &libcni.GCArgs{ValidAttachments: valid})
	})
}

func (e *Env) Status() error {
	return e.InNode(func() error {
		return e.CNI.GetStatusNetworkList(context.Background(), e.ConfList("1.1.0"))
	})
}

// ExecPlugin runs the plugin binary in the node netns with an explicit
// environment and stdin, for the cases libcni would refuse to produce.
func (e *Env) ExecPlugin(envv map[string]string, stdin []byte) (stdout []byte, err error) {
	err = e.InNode(func() error {
		cmd := exec.Command(filepath.Join(BinDir, "ebpf-cni"))
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

// PluginError decodes the CNI error a failed plugin printed.
func PluginError(t *testing.T, stdout []byte) *types.Error {
	t.Helper()
	var te types.Error
	if err := json.Unmarshal(stdout, &te); err != nil {
		t.Fatalf("plugin output is not a CNI error: %v: %s", err, stdout)
	}
	return &te
}

// ErrCode extracts the CNI error code of an error returned by libcni.
func ErrCode(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

// Store is the env's network's attachment records, as the plugin keeps them.
func (e *Env) Store() state.Store { return state.Store{Root: e.StateDir, Network: e.Name} }

// Maps opens the env's pinned Maps.
func (e *Env) Maps() *maps.Maps {
	e.T.Helper()
	m, err := datapath.OpenMaps(e.PinDir)
	if err != nil {
		e.T.Fatalf("open pinned maps: %v", err)
	}
	e.T.Cleanup(m.Close)
	return m
}

// HostIfindex returns the ifindex of a link in the node netns.
func (e *Env) HostIfindex(name string) int {
	e.T.Helper()
	idx := 0
	err := e.InNode(func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		idx = l.Attrs().Index
		return nil
	})
	if err != nil {
		e.T.Fatalf("find %s in node: %v", name, err)
	}
	return idx
}

// PodIPs returns the IPv4 and IPv6 address of a result.
func PodIPs(t *testing.T, r *current.Result) (v4, v6 net.IP) {
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
