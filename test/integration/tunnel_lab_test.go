// The tunnel lab: three nodes on two subnets behind a router that has no
// route to any pod CIDR (docs/tunnel.md), and the tools of its tests: the
// tunnel device's figures, forged VXLAN datagrams, a pod's UDP listener.

package integration

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
	"github.com/vishvananda/netlink"
)

// The tunnel lab: subnet A (tunGWA/24: nodes 1 and 2, and a host that is
// no node) and subnet B (tunGWB/24: node 3) on the router's two bridges.
// Subnet B's link is 1400 bytes (the router's port and node 3's uplink),
// A's 1500. Each node's pods have a /24 and a /64 of the cluster ranges.
var (
	tunGWA    = net.ParseIP("10.77.1.254").To4()
	tunGWB    = net.ParseIP("10.77.2.254").To4()
	tunNode   = []net.IP{net.ParseIP("10.77.1.1").To4(), net.ParseIP("10.77.1.2").To4(), net.ParseIP("10.77.2.1").To4()}
	tunStrang = net.ParseIP("10.77.1.66").To4() // on subnet A, no node
)

const (
	tunCluster = "10.78.0.0/16"
	// A /32: the pods' /64s are fd00:78:N:: (N in the third group), and
	// the /48 this was held none of them, so their IPv6 traffic to other
	// nodes' pods over direct routes was masqueraded
	// (TestTunnelLabHostGWPodsNotMasqueraded).
	tunCluster6 = "fd00:78::/32"
	tunPMTU     = 1400
)

func tunPods(i int) (string, string) {
	return fmt.Sprintf("10.78.%d.0/24", i+1), fmt.Sprintf("fd00:78:%d::/64", i+1)
}

type tunLab struct {
	nodes  []*testenv.Env
	router ns.NetNS
	strang ns.NetNS
	peers  string
}

// tunSysctl sets a sysctl in the current netns.
func tunSysctl(key, val string) error {
	return os.WriteFile(filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/")), []byte(val), 0o644)
}

// tunUplink links the current netns to a bridge of the router: name here,
// peer there, with addr/24, mtu and a default route via gw.
func tunUplink(router ns.NetNS, name, peer, bridge string, addr, gw net.IP, mtu int) error {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu}, PeerName: peer, PeerNamespace: netlink.NsFd(int(router.Fd()))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add %s: %w", name, err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if err := labAddr(l, addr.String()+"/24"); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return err
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw}); err != nil {
		return err
	}
	return router.Do(func(ns.NetNS) error {
		p, err := netlink.LinkByName(peer)
		if err != nil {
			return err
		}
		br, err := netlink.LinkByName(bridge)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMTU(p, mtu); err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(p, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(p)
	})
}

func newTunLab(t *testing.T) *tunLab {
	t.Helper()
	lab := &tunLab{router: testenv.NewNS(t), strang: testenv.NewNS(t)}
	err := lab.router.Do(func(ns.NetNS) error {
		for _, b := range []struct {
			name string
			gw   net.IP
			mtu  int
		}{{"brA", tunGWA, 1500}, {"brB", tunGWB, tunPMTU}} {
			br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: b.name, MTU: b.mtu}}
			if err := netlink.LinkAdd(br); err != nil {
				return err
			}
			if err := labAddr(br, b.gw.String()+"/24"); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(br); err != nil {
				return err
			}
		}
		// A router: forwards between its subnets, knows no pod CIDR.
		return tunSysctl("net.ipv4.ip_forward", "1")
	})
	if err != nil {
		t.Fatalf("router netns: %v", err)
	}
	var peers []agent.Peer
	for i := range tunNode {
		e := testenv.New(t)
		p4, p6 := tunPods(i)
		e.IPAM = map[string]any{
			"type": "host-local", "dataDir": e.DataDir,
			"ranges": [][]map[string]string{{{"subnet": p4}}, {{"subnet": p6}}},
		}
		e.Extra = map[string]any{
			"ipMasq":       true,
			"clusterCIDRs": []string{tunCluster, tunCluster6},
			"capabilities": map[string]bool{"portMappings": true},
		}
		br, gw, mtu := "brA", tunGWA, 1500
		if i == 2 {
			br, gw, mtu = "brB", tunGWB, tunPMTU
		}
		err := e.InNode(func() error {
			for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
				if err := tunSysctl(k, "1"); err != nil {
					return err
				}
			}
			return tunUplink(lab.router, "uplink0", fmt.Sprintf("n%d", i+1), br, tunNode[i], gw, mtu)
		})
		if err != nil {
			t.Fatalf("node %d: %v", i+1, err)
		}
		lab.nodes = append(lab.nodes, e)
		peers = append(peers, agent.Peer{NodeIP: tunNode[i].String(), PodCIDRs: []string{p4, p6}})
	}
	if err := lab.strang.Do(func(ns.NetNS) error {
		return tunUplink(lab.router, "uplink0", "s1", "brA", tunStrang, tunGWA, 1500)
	}); err != nil {
		t.Fatalf("stranger: %v", err)
	}
	lab.peers = filepath.Join(t.TempDir(), "peers.json")
	pj, _ := json.Marshal(peers)
	if err := os.WriteFile(lab.peers, pj, 0o600); err != nil {
		t.Fatal(err)
	}
	return lab
}

// clusterFlag is the agent's --cluster-cidrs on a lab node: the cluster
// CIDRs its conflist gives. Without it an agent run with --peers holds
// every listed node's pod CIDRs and addresses (follower.peers), as one
// following Nodes does; the lab's tests choose whether node addresses
// are cluster CIDRs (nodesInCluster), so its agents hold the conflist's.
func clusterFlag(e *testenv.Env) []string {
	cs, _ := e.Extra["clusterCIDRs"].([]string)
	return []string{"--cluster-cidrs", strings.Join(cs, ",")}
}

// agentArgs are the flags of an agent on a lab node: the peers file and
// the node's cluster CIDRs (clusterFlag).
func (lab *tunLab) agentArgs(e *testenv.Env) []string {
	return append([]string{"--peers", lab.peers}, clusterFlag(e)...)
}

// nodesInCluster makes the nodes' addresses cluster CIDRs on every node,
// as the agent following Nodes does (nodeClusterCIDRs): the IPv4 ones, and
// with six the IPv6 underlay's too (newTunLab6).
func (lab *tunLab) nodesInCluster(six bool) {
	cluster := []string{tunCluster, tunCluster6}
	for i := range tunNode {
		cluster = append(cluster, tunNode[i].String()+"/32")
		if six {
			cluster = append(cluster, tunNode6[i].String()+"/128")
		}
	}
	for _, e := range lab.nodes {
		e.Extra["clusterCIDRs"] = cluster
	}
}

// podPerNode runs a pod named prefix<N> on node N (1 to 3) and waits until
// their and the stranger's IPv6 addresses are usable; it returns the pods
// and their IPv4 and IPv6 addresses, in node order.
func (lab *tunLab) podPerNode(t *testing.T, prefix string) (pods []ns.NetNS, a4, a6 []net.IP) {
	t.Helper()
	for i, e := range lab.nodes {
		p, r := e.RunPod(fmt.Sprintf("%s%d", prefix, i+1))
		v4, v6 := testenv.PodIPs(t, r)
		pods, a4, a6 = append(pods, p), append(a4, v4), append(a6, v6)
	}
	for _, p := range append(pods, lab.strang) {
		testenv.WaitIPv6Ready(t, p)
	}
	return pods, a4, a6
}

// hostPortPod adds a pod named name on node e whose port 8080 is e's
// hostPort port, TCP and UDP.
func hostPortPod(e *testenv.Env, name string, port int) ns.NetNS {
	p := e.NewPod()
	e.MustAddHP(p, name, testenv.PM{HostPort: port, ContainerPort: 8080, Protocol: "tcp"},
		testenv.PM{HostPort: port, ContainerPort: 8080, Protocol: "udp"})
	return p
}

// looseRPFilter sets node e's IPv4 reverse-path filter loose (2): a source
// routable by any link passes, as a pod CIDR of a tunnelled node does.
func looseRPFilter(t *testing.T, e *testenv.Env) {
	t.Helper()
	must(t, e.InNode(func() error {
		for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.uplink0.rp_filter"} {
			if err := tunSysctl(k, "2"); err != nil {
				return err
			}
		}
		return nil
	}))
}

// ipCmds runs `ip` with each argument list in the current netns.
func ipCmds(cmds ...[]string) error {
	for _, c := range cmds {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	return nil
}

// tunIfindex is the tunnel device of a node, with its MTU.
func tunDevice(t *testing.T, e *testenv.Env) (idx, mtu int, tx uint64) {
	t.Helper()
	err := e.InNode(func() error {
		l, err := netlink.LinkByName(datapath.TunnelDevice)
		if err != nil {
			return err
		}
		idx, mtu = l.Attrs().Index, l.Attrs().MTU
		if s := l.Attrs().Statistics; s != nil {
			tx = s.TxPackets
		}
		return nil
	})
	if err != nil {
		t.Fatalf("tunnel device: %v", err)
	}
	return idx, mtu, tx
}

// vxlanFrame is a VXLAN datagram (VNI 1) carrying an IPv4 UDP packet from
// src to dst:dport.
func vxlanFrame(src, dst net.IP, dport int, payload []byte) []byte {
	b := []byte{0x08, 0, 0, 0, 0, 0, 1, 0}                        // VXLAN: I flag, VNI 1
	b = append(b, 2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00) // Ethernet
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	copy(ip[12:], src.To4())
	copy(ip[16:], dst.To4())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], 5555)
	binary.BigEndian.PutUint16(udp[2:], uint16(dport))
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	b = append(b, ip...)
	b = append(b, udp...)
	return append(b, payload...)
}

// sendVXLAN sends one frame from netns to node:4789.
func sendVXLAN(t *testing.T, from ns.NetNS, node net.IP, frame []byte) {
	t.Helper()
	err := from.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: node, Port: datapath.VXLANPort})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(frame)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// missing is what of want no arrival (a listener's "<payload> from <addr>")
// starts with.
func missing(arrived, want []string) []string {
	var out []string
	for _, w := range want {
		found := false
		for _, a := range arrived {
			found = found || strings.HasPrefix(a, w)
		}
		if !found {
			out = append(out, w)
		}
	}
	return out
}

// listenUDP4 listens in a pod; got returns what arrived within wait.
func listenUDP4(t *testing.T, pod ns.NetNS, port int) func(wait time.Duration) []string {
	t.Helper()
	var pc net.PacketConn
	err := pod.Do(func(ns.NetNS) error {
		var err error
		pc, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return func(wait time.Duration) []string {
		var out []string
		buf := make([]byte, 2048)
		deadline := time.Now().Add(wait)
		for {
			pc.SetReadDeadline(deadline)
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return out
			}
			out = append(out, fmt.Sprintf("%s from %s", buf[:n], from))
		}
	}
}
