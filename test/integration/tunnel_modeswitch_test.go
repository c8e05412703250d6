package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// tunModeState tells how far node e (the first or second node of the
// tunnel lab, peer the other's index) is from mode: "off" (host-gw: no
// tunnel device, flag, map entry, table 199 rule or route, managed next
// hop; the peer's pod CIDRs routed via its node addresses), "vxlan" (the
// device, the flag, the peer in the tunnel maps, its CIDRs routed into the
// device) or "hybrid" (the same but routed directly: same subnet). nil when
// e is in that mode.
func tunModeState(e *testenv.Env, mode string, peer int) error {
	var errs []string
	bad := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
	p4, p6 := tunPods(peer)
	err := e.InNode(func() error {
		idx := datapath.TunnelIfindex()
		if (idx != 0) != (mode != "off") {
			bad("tunnel device ifindex %d", idx)
		}
		rules, _ := exec.Command("ip", "rule").CombinedOutput()
		rules6, _ := exec.Command("ip", "-6", "rule").CombinedOutput()
		if on := strings.Contains(string(rules)+string(rules6), "lookup 199"); on != (mode != "off") {
			bad("table 199 rules %v:\n%s%s", on, rules, rules6)
		}
		if mode == "off" {
			for _, c := range [][]string{{"ip", "route", "show", "table", "all"}, {"ip", "-6", "route", "show", "table", "all"}, {"ip", "neigh"}, {"ip", "-6", "neigh"}} {
				out, _ := exec.Command(c[0], c[1:]...).CombinedOutput()
				for _, l := range strings.Split(string(out), "\n") {
					if strings.Contains(l, "table 199") || strings.Contains(l, datapath.TunnelDevice) || strings.Contains(c[len(c)-1], "neigh") && strings.Contains(l, "proto 199") {
						bad("left of the tunnel: %s", l)
					}
				}
			}
		}
		for _, c := range []struct {
			cidr string
			via  net.IP
		}{{p4, tunNode[peer]}, {p6, tunNode6[peer]}} {
			_, dst, _ := net.ParseCIDR(c.cidr)
			rs, err := netlink.RouteGet(dst.IP)
			if err != nil || len(rs) != 1 {
				bad("route to %s: %v %v", dst.IP, rs, err)
				continue
			}
			if mode == "vxlan" {
				if rs[0].LinkIndex != idx || idx == 0 {
					bad("route to %s: %+v, want into the tunnel device", dst.IP, rs[0])
				}
			} else if !rs[0].Gw.Equal(c.via) {
				bad("route to %s: %+v, want via %s", dst.IP, rs[0], c.via)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	m, err := datapath.OpenMaps(e.PinDir)
	if err != nil {
		return err
	}
	defer m.Close()
	c, err := m.Node().Config()
	if err != nil {
		return err
	}
	if on, _, _ := c.Tunnel(); on != (mode != "off") {
		bad("HP_CFG_TUNNEL %v", on)
	}
	rs, err := m.Tunnel().Routes()
	if err != nil {
		return err
	}
	nodes, err := m.Tunnel().Nodes()
	if err != nil {
		return err
	}
	if mode == "off" && (len(rs) != 0 || len(nodes) != 0) {
		bad("tunnel maps: cidrs %+v, nodes %v", rs, nodes)
	}
	if mode != "off" {
		if len(rs) != 2 || len(nodes) != 2 {
			bad("tunnel maps: cidrs %+v, nodes %v; want the peer's 2 CIDRs and 2 addresses", rs, nodes)
		}
		for _, r := range rs {
			if r.Direct != (mode == "hybrid") {
				bad("tunnel map %s: direct %v in %s", r.PodCIDR, r.Direct, mode)
			}
		}
	}
	if errs != nil {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// TestTunnelModeSwitchKeepsTraffic (issue 24, make bench's tunnel part):
// two nodes of one subnet switched vxlan -> off (host-gw) -> vxlan ->
// hybrid -> off with `ebpf-agent peers`, then by restarting `run` with
// another --tunnel (the DaemonSet's way): in every mode TCP, UDP and ping
// pass between their pods both ways, IPv4 and IPv6 (an IPv6 underlay
// beside the IPv4 one), and nothing of the previous mode is left. `peers
// --tunnel off` used to change the routes alone: the device, the tunnel
// flag and the peers marked encapsulated stayed, and the uplink dropped
// the peer's pods' packets arriving in the clear (drop_tunnel_source).
func TestTunnelModeSwitchKeepsTraffic(t *testing.T) {
	lab := newTunLab6(t)
	n1, n2 := lab.nodes[0], lab.nodes[1]
	// Two nodes only: host-gw cannot reach node 3 (another subnet).
	var peers []agent.Peer
	for i := range []*testenv.Env{n1, n2} {
		p4, p6 := tunPods(i)
		peers = append(peers, agent.Peer{NodeIP: tunNode[i].String(), NodeIPs: []string{tunNode6[i].String()}, PodCIDRs: []string{p4, p6}})
	}
	pf := filepath.Join(t.TempDir(), "peers.json")
	pj, _ := json.Marshal(peers)
	if err := os.WriteFile(pf, pj, 0o600); err != nil {
		t.Fatal(err)
	}
	modeArgs := func(mode string) []string {
		switch mode {
		case "hybrid":
			return []string{"--tunnel", "vxlan", "--tunnel-hybrid"}
		default:
			return []string{"--tunnel", mode}
		}
	}
	nodes := []*testenv.Env{n1, n2}
	wantState := func(mode string, wait time.Duration) {
		t.Helper()
		for i, e := range nodes {
			err := tunModeState(e, mode, 1-i)
			for end := time.Now().Add(wait); err != nil && time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
				err = tunModeState(e, mode, 1-i)
			}
			if err != nil {
				t.Fatalf("%s: node %d: %v", mode, i+1, err)
			}
		}
	}

	for _, e := range nodes {
		if _, err := e.MasqAgent(append([]string{"peers", "--peers", pf, "--cni-conf-dir", t.TempDir()}, modeArgs("vxlan")...)...); err != nil {
			t.Fatal(err)
		}
		e.Extra["mtu"] = 1450 // the tunnel's: the pods keep it in every mode
	}
	p1, a1, a16 := servedPod(t, n1, "w1", 7001)
	p2, a2, a26 := servedPod(t, n2, "w2", 7001)
	traffic := func(mode string) {
		t.Helper()
		t.Logf("traffic in mode %s", mode)
		var tx0 uint64
		if mode != "off" {
			_, _, tx0 = tunDevice(t, n1)
		}
		for _, c := range []struct {
			from    ns.NetNS
			to, src net.IP
			name    string
		}{{p1, a2, a1, "w2"}, {p2, a1, a2, "w1"}, {p1, a26, a16, "w2"}, {p2, a16, a26, "w1"}} {
			if err := testenv.Ping(c.from, c.to, 2); err != nil {
				t.Fatalf("%s: %v\nnode 1 uplink: %s\nnode 2 uplink: %s", mode, err,
					dumpCounters(n1.Maps(), n1.HostIfindex("uplink0")), dumpCounters(n2.Maps(), n2.HostIfindex("uplink0")))
			}
			for _, proto := range []string{"tcp", "udp"} {
				mustAsk(t, c.from, proto, hp(c.to, 7001), 0, c.name, c.src)
			}
		}
		if err := testenv.TCPTransfer(p1, p2, a2, 256<<10); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		// Through the device in vxlan mode, never in hybrid (one subnet).
		if mode != "off" {
			_, _, tx := tunDevice(t, n1)
			if (tx > tx0) != (mode == "vxlan") {
				t.Fatalf("%s: node 1's tunnel device sent %d packets", mode, tx-tx0)
			}
		}
	}

	// `ebpf-agent peers`, as make bench switches; each twice (a retry
	// changes nothing).
	for _, mode := range []string{"vxlan", "off", "vxlan", "hybrid", "off"} {
		for _, e := range append(nodes, nodes...) {
			if _, err := e.MasqAgent(append([]string{"peers", "--peers", pf, "--cni-conf-dir", t.TempDir()}, modeArgs(mode)...)...); err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
		}
		traffic(mode)
		wantState(mode, 0)
	}

	// The DaemonSet: the agent restarted with another mode.
	var agents []*testenv.AgentProc
	for _, mode := range []string{"vxlan", "off", "hybrid", "off"} {
		for _, a := range agents {
			a.Stop()
		}
		agents = agents[:0]
		for _, e := range nodes {
			agents = append(agents, e.StartAgent(e.WriteConfDir(), append(append([]string{"--peers", pf, "--metrics-addr", ""}, clusterFlag(e)...), modeArgs(mode)...)...))
		}
		wantState(mode, 20*time.Second)
		traffic(mode)
	}
}
