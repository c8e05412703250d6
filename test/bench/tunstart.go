package main

// Pod start with the tunnel on against the tunnel off (issue 24: "pod
// start unaffected"). Three more ebpf-cni configurations of the latency
// rounds, each on a node of its own whose agent runs with --peers and a
// tunnel mode: off (host-gw routes to two nodes of its subnet), vxlan
// (both other nodes, one of them on another subnet, through ebpf-tun)
// and vxlan hybrid (the same-subnet node direct, the other tunnelled).
// The agent renders each node's conflist from a template without "mtu",
// so the pods get the mode's MTU (uplink 1500 less VXLAN's 50), as a node
// would have them; checkAdd proves it on every pod.

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
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// The tunnel nodes' underlay: this node 10.77.1.1 on a /24 whose gateway
// (.254) is a router namespace that also answers for the other nodes of
// the subnet (.2, and with the tunnel off .3), so the agent's next hops
// resolve; the node on another subnet (10.77.2.1) is behind the gateway.
var (
	tunSelf   = net.ParseIP("10.77.1.1").To4()
	tunGW     = net.ParseIP("10.77.1.254").To4()
	tunMTU    = 1500
	tunPodNet = mustCIDR("10.79.1.0/24")
)

// tunStartMode is one node configuration of the pod start comparison.
type tunStartMode struct {
	key, label string
	args       []string
	// peers: the other nodes (address, pod CIDR); direct: how many of
	// their routes are host-gw (the rest go into ebpf-tun).
	peers  [][2]string
	direct int
	podMTU int
}

const tunStartRef = "ebpf-tunoff"

// tunStart is the node of a tunnel pod start configuration: its mode, the
// conflist template its agent renders into b.confDir (the bench writes no
// conflist there itself), and the agent's flags beyond startAgent's.
type tunStart struct {
	mode      tunStartMode
	tmpl      string
	agentArgs []string
}

// tunnelled: the node's agent runs the tunnel (ebpf-tun is the node's).
func (t *tunStart) tunnelled() bool { return t != nil && t.mode.key != tunStartRef }

// agentFlags are the agent's extra flags (none for other configurations).
func (t *tunStart) agentFlags() []string {
	if t == nil {
		return nil
	}
	return t.agentArgs
}

var tunStartModes = []tunStartMode{
	{key: tunStartRef, label: "ebpf-cni, agent --tunnel off", args: []string{"--tunnel", "off"},
		// host-gw reaches only nodes of its own subnet.
		peers: [][2]string{{"10.77.1.2", "10.79.2.0/24"}, {"10.77.1.3", "10.79.3.0/24"}}, direct: 2, podMTU: tunMTU},
	{key: "ebpf-vxlan", label: "ebpf-cni, agent --tunnel vxlan", args: []string{"--tunnel", "vxlan"},
		peers: [][2]string{{"10.77.1.2", "10.79.2.0/24"}, {"10.77.2.1", "10.79.3.0/24"}}, direct: 0, podMTU: tunMTU - 50},
	{key: "ebpf-hybrid", label: "ebpf-cni, agent --tunnel vxlan --tunnel-hybrid", args: []string{"--tunnel", "vxlan", "--tunnel-hybrid"},
		peers: [][2]string{{"10.77.1.2", "10.79.2.0/24"}, {"10.77.2.1", "10.79.3.0/24"}}, direct: 1, podMTU: tunMTU - 50},
}

// tunStartConfigs creates the three nodes (with their routers and peers
// files) and their configurations.
func (b *bench) tunStartConfigs() ([]*config, error) {
	var out []*config
	for _, m := range tunStartModes {
		c, err := b.tunStartConfig(m)
		if err != nil {
			return nil, fmt.Errorf("tunnel pod start, %s: %w", m.label, err)
		}
		out = append(out, c)
	}
	return out, nil
}

func (b *bench) tunStartConfig(m tunStartMode) (*config, error) {
	node, err := b.newNode("node-" + m.key)
	if err != nil {
		return nil, err
	}
	router, err := b.newNetNS("router-" + m.key)
	if err != nil {
		return nil, err
	}
	if err := testenv.VethBetween(node, "uplink0", tunSelf, router, "eth0", tunGW); err != nil {
		return nil, err
	}
	err = router.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, p := range m.peers {
			if ip := net.ParseIP(p[0]); ip != nil && (&net.IPNet{IP: tunSelf.Mask(net.CIDRMask(24, 32)), Mask: net.CIDRMask(24, 32)}).Contains(ip) {
				a, _ := netlink.ParseAddr(p[0] + "/24")
				if err := netlink.AddrAdd(l, a); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := testenv.RouteVia(node, "uplink0", tunGW); err != nil {
		return nil, err
	}
	peers := []agent.Peer{{NodeIP: tunSelf.String(), PodCIDRs: []string{tunPodNet.String()}}}
	for _, p := range m.peers {
		peers = append(peers, agent.Peer{NodeIP: p[0], PodCIDRs: []string{p[1]}})
	}
	pj, _ := json.Marshal(peers)
	pf := filepath.Join(b.root, "peers-"+m.key+".json")
	if err := os.WriteFile(pf, pj, 0o600); err != nil {
		return nil, err
	}
	netName := "bench-" + m.key
	tmplDir := filepath.Join(b.root, "tmpl-"+m.key)
	if err := os.MkdirAll(tmplDir, 0o700); err != nil {
		return nil, err
	}
	tmpl := filepath.Join(tmplDir, netName+".conflist")
	pin := b.newPinDir(strings.TrimPrefix(m.key, "ebpf-"))
	c := &config{key: m.key, label: fmt.Sprintf("%s (pod MTU %d)", m.label, m.podMTU), netName: netName, subnet: tunPodNet,
		node: node, pinDir: pin,
		tun: &tunStart{mode: m, tmpl: tmpl, agentArgs: append([]string{"--peers", pf, "--cni-conf-template", tmpl}, m.args...)}}
	c.list = map[string]any{"plugins": []any{b.ebpfPlugin(tunPodNet, pin, b.stateFor(pin))}}
	return c, nil
}

// tunStartReady waits until the agent of a tunnel configuration's node has
// written its conflist (with the pods' MTU) and its routes to the other
// nodes (into ebpf-tun or host-gw, as the mode wants), and logs them.
func (b *bench) tunStartReady(ctx context.Context, c *config) error {
	m := c.tun.mode
	conf := filepath.Join(b.confDir, filepath.Base(c.tun.tmpl))
	wantMTU := fmt.Sprintf(`"mtu": %d`, m.podMTU)
	var last string
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		if err := ctx.Err(); err != nil {
			return err
		}
		raw, _ := os.ReadFile(conf)
		tunneled, direct, err := b.peerRoutes(c)
		if err != nil {
			return err
		}
		last = fmt.Sprintf("conflist %s has %s: %v; %d routes into %s, %d direct", conf, wantMTU, strings.Contains(string(raw), wantMTU),
			tunneled, datapath.TunnelDevice, direct)
		if strings.Contains(string(raw), wantMTU) && direct == m.direct && tunneled == len(m.peers)-m.direct {
			var out []byte
			c.node.Do(func(ns.NetNS) error {
				out, _ = exec.Command("ip", "-d", "route", "show", "proto", fmt.Sprint(agent.RouteProtocol)).CombinedOutput()
				return nil
			})
			logf("%s: agent ready; %s:\n%s", c.label, last, strings.TrimRight(string(out), "\n"))
			return nil
		}
		if time.Since(start) > 30*time.Second {
			return fmt.Errorf("%s: the agent has not set the node up after 30 s: %s\n%s", c.label, last, testenv.Tail(b.agents[c.pinDir].Stderr.String()))
		}
	}
}

// peerRoutes counts the agent's routes to other nodes' pod CIDRs in c's
// node: those into the tunnel device, and the host-gw ones.
func (b *bench) peerRoutes(c *config) (tunneled, direct int, err error) {
	err = c.node.Do(func(ns.NetNS) error {
		tun := 0
		if l, err := netlink.LinkByName(datapath.TunnelDevice); err == nil {
			tun = l.Attrs().Index
		}
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: agent.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if tun != 0 && r.LinkIndex == tun {
				tunneled++
			} else if r.Gw != nil {
				direct++
			}
		}
		return nil
	})
	return tunneled, direct, err
}

// checkMTU proves a pod of a tunnel configuration got its mode's MTU.
func checkMTU(c *config, pod ns.NetNS) error {
	if c.tun == nil {
		return nil
	}
	return pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifName)
		if err != nil {
			return err
		}
		if got := l.Attrs().MTU; got != c.tun.mode.podMTU {
			return fmt.Errorf("%s in the pod has MTU %d, want %d (the agent's conflist)", ifName, got, c.tun.mode.podMTU)
		}
		return nil
	})
}

// agentTicks is every agent's CPU time so far (utime+stime, clock ticks),
// by pin directory.
func (b *bench) agentTicks() map[string]float64 {
	out := map[string]float64{}
	for pin, p := range b.agents {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
		if err != nil {
			continue
		}
		f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
		u, _ := strconv.ParseFloat(f[11], 64)
		s, _ := strconv.ParseFloat(f[12], 64)
		out[pin] = u + s
	}
	return out
}

// logAgentCPU says how much CPU each agent took during the rounds: the
// tunnel nodes' agents run beside every configuration's verbs, so what
// they take is load the other rows share.
func (b *bench) logAgentCPU(before map[string]float64, d time.Duration) {
	after, said := b.agentTicks(), map[string]bool{}
	for _, c := range b.configs {
		if t, ok := after[b.pinOf(c)]; ok && c.isEBPF() && !said[b.pinOf(c)] {
			said[b.pinOf(c)] = true
			ms := (t - before[b.pinOf(c)]) * 10 // USER_HZ 100
			logf("  agent of %s: %.0f ms CPU in the %s of rounds (%.1f%% of one CPU; its pods' background work included)", c.label, ms, d.Round(time.Second), ms/float64(d.Milliseconds())*100)
		}
	}
}
