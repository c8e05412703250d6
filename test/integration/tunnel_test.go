// Pods across subnets: three nodes on two subnets behind a router that has
// no route to any pod CIDR, joined by the VXLAN tunnel in hybrid mode
// (docs/tunnel.md).

package integration

import (
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
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestTunnel: pod to pod across subnets through the VXLAN tunnel (TCP,
// UDP, ICMP, IPv4 and IPv6), hybrid mode routing the same-subnet pair
// directly (the tunnel device sends nothing for it), forged encapsulated
// packets (from a host that is no node; from a node claiming another
// node's pods and this node's own) dropped and counted while the genuine
// one is delivered, PMTU through a 1400-byte router link, a hostPort and
// ipMasq across (pod-to-pod never masqueraded).
func TestTunnel(t *testing.T) {
	lab := newTunLab(t)
	n1, n2, n3 := lab.nodes[0], lab.nodes[1], lab.nodes[2]

	// The agent on every node: the tunnel device, the routes and maps
	// from the peers file, the path MTU.
	// The node's conflist is the agent's rendering of a template without
	// "mtu": the agent writes the pods' MTU into it.
	confDirs := make([]string, len(lab.nodes))
	agents := make([]*testenv.AgentProc, len(lab.nodes))
	for i, e := range lab.nodes {
		confDirs[i] = e.WriteConfDir()
		tmpl := filepath.Join(t.TempDir(), "10-test.conflist")
		raw, err := os.ReadFile(filepath.Join(confDirs[i], "10-test.conflist"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(tmpl, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		agents[i] = e.StartAgent(confDirs[i], append(lab.agentArgs(e), "--tunnel", "vxlan", "--tunnel-hybrid", "--metrics-addr", "",
			"--cni-conf-template", tmpl)...)
		var out string
		deadline := time.Now().Add(30 * time.Second)
		for {
			e.InNode(func() error {
				b, _ := exec.Command("ip", "-d", "route", "show", "proto", "199").CombinedOutput()
				b6, _ := exec.Command("ip", "-6", "-d", "route", "show", "proto", "199").CombinedOutput()
				out = string(b) + string(b6)
				return nil
			})
			if strings.Count(out, "\n") == 4 || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Logf("node %d routes:\n%s", i+1, out)
		if n := strings.Count(out, "\n"); n != 4 {
			t.Fatalf("node %d: %d routes, want 4 (two nodes, two families)", i+1, n)
		}
	}
	// The pods' MTU, in the conflist the agent wrote, is the tunnel
	// device's, both sized from the uplink: 1500 and 1400 less VXLAN's 50
	// bytes.
	for i, e := range lab.nodes {
		_, mtu, _ := tunDevice(t, e)
		want := 1450
		if i == 2 {
			want = tunPMTU - 50
		}
		if mtu != want {
			t.Fatalf("node %d: %s MTU %d, want %d", i+1, datapath.TunnelDevice, mtu, want)
		}
		var conf struct {
			Plugins []map[string]any `json:"plugins"`
		}
		var raw []byte
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			raw, _ = os.ReadFile(filepath.Join(confDirs[i], "10-test.conflist"))
			if strings.Contains(string(raw), `"mtu"`) {
				break
			}
		}
		if err := json.Unmarshal(raw, &conf); err != nil || len(conf.Plugins) != 1 || conf.Plugins[0]["mtu"] != float64(want) {
			t.Fatalf("node %d: the agent's conflist has mtu %v, want %d (%v):\n%s", i+1, conf.Plugins, want, err, raw)
		}
		e.Extra["mtu"] = mtu
	}

	p1, p2, p3 := n1.NewPod(), n2.NewPod(), n3.NewPod()
	n1.CleanupDel(p1, "t1")
	r1 := n1.MustAddHP(p1, "t1", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	n2.CleanupDel(p2, "t2")
	r2 := n2.Add(p2, "t2")
	n3.CleanupDel(p3, "t3")
	r3 := n3.Add(p3, "t3")
	a1, a16 := testenv.PodIPs(t, r1)
	a2, a26 := testenv.PodIPs(t, r2)
	a3, a36 := testenv.PodIPs(t, r3)
	serve(t, p1, 80, "t1")
	serve(t, p2, 7001, "t2")
	serve(t, p3, 7001, "t3")

	t.Run("routes", func(t *testing.T) {
		// Node 1: node 2 (same subnet) directly for IPv4; node 3, and
		// IPv6 (no node has an IPv6 address to route via), into the tunnel.
		for _, c := range []struct {
			ip     net.IP
			tunnel bool
		}{{a2, false}, {a3, true}, {a26, true}, {a36, true}} {
			var rs []netlink.Route
			n1.InNode(func() error {
				var err error
				rs, err = netlink.RouteGet(c.ip)
				return err
			})
			idx, _, _ := tunDevice(t, n1)
			if len(rs) != 1 || (rs[0].LinkIndex == idx) != c.tunnel {
				t.Errorf("node 1's route to %s: %+v, want tunnel %v", c.ip, rs, c.tunnel)
			}
		}
	})

	t.Run("across", func(t *testing.T) {
		for _, c := range []struct {
			from ns.NetNS
			to   net.IP
			name string
			src  net.IP
		}{{p1, a3, "t3", a1}, {p3, a2, "t2", a3}, {p1, a36, "t3", a16}, {p3, a26, "t2", a36}} {
			for _, proto := range []string{"tcp", "udp"} {
				// The server sees the pod's own address: never masqueraded.
				mustAsk(t, c.from, proto, hp(c.to, 7001), 0, c.name, c.src)
			}
			if err := testenv.Ping(c.from, c.to, 2); err != nil {
				t.Fatal(err)
			}
		}
		if err := testenv.TCPTransfer(p3, p1, a1, 1<<20); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("hybrid-direct", func(t *testing.T) {
		_, _, before := tunDevice(t, n1)
		_, _, before2 := tunDevice(t, n2)
		for _, proto := range []string{"tcp", "udp"} {
			mustAsk(t, p1, proto, hp(a2, 7001), 0, "t2", a1)
		}
		if err := testenv.Ping(p1, a2, 3); err != nil {
			t.Fatal(err)
		}
		if err := testenv.TCPTransfer(p1, p2, a2, 256<<10); err != nil {
			t.Fatal(err)
		}
		_, _, after := tunDevice(t, n1)
		_, _, after2 := tunDevice(t, n2)
		if after != before || after2 != before2 {
			t.Errorf("same-subnet traffic went through the tunnel: node 1 sent %d, node 2 %d packets into it", after-before, after2-before2)
		}
		// And across subnets it does.
		if err := testenv.Ping(p1, a3, 2); err != nil {
			t.Fatal(err)
		}
		if _, _, tx := tunDevice(t, n1); tx < after+2 {
			t.Errorf("node 1's tunnel device sent %d packets for 2 pings to node 3's pod", tx-after)
		}
	})

	t.Run("forged", func(t *testing.T) {
		idx, _, _ := tunDevice(t, n1)
		m := n1.Maps()
		got := listenUDP4(t, p1, 9999)
		notNode0 := counter(t, m, idx, maps.DirIngress, maps.ReasonDropTunNode).Packets
		badSrc0 := counter(t, m, idx, maps.DirIngress, maps.ReasonDropTunSrc).Packets
		var seq0 uint64
		if recs := observeJSON(t, n1, "--last", "1000"); len(recs) > 0 {
			seq0 = recs[len(recs)-1].Seq
		}

		// A host that is no node, claiming node 3's pod.
		sendVXLAN(t, lab.strang, tunNode[0], vxlanFrame(a3, a1, 9999, []byte("stranger")))
		// Node 3 claiming node 2's pod, and node 1's own pod.
		sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(a2, a1, 9999, []byte("other-node")))
		other1 := append(net.IP{}, a1...)
		other1[3]++
		sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(other1, a1, 9999, []byte("local-pod")))
		// Node 3 for its own pod: the rule lets it in.
		sendVXLAN(t, n3.Node, tunNode[0], vxlanFrame(a3, a1, 9999, []byte("genuine")))

		arrived := got(2 * time.Second)
		if len(arrived) != 1 || !strings.HasPrefix(arrived[0], "genuine from "+a3.String()) {
			t.Errorf("pod 1 received %q, want only the genuine datagram from %s", arrived, a3)
		}
		if d := counter(t, m, idx, maps.DirIngress, maps.ReasonDropTunNode).Packets - notNode0; d != 1 {
			t.Errorf("drop_tunnel_not_node counted %d, want 1", d)
		}
		if d := counter(t, m, idx, maps.DirIngress, maps.ReasonDropTunSrc).Packets - badSrc0; d != 2 {
			t.Errorf("drop_tunnel_source counted %d, want 2", d)
		}
		// Each drop is one event of its reason on the tunnel device (issue 25).
		for _, c := range []struct {
			r      maps.Reason
			before uint64
		}{{maps.ReasonDropTunNode, notNode0}, {maps.ReasonDropTunSrc, badSrc0}} {
			drops, n, got := settledDrops(t, n1, m, idx, maps.DirIngress, c.r, c.before, seq0, func(ev events.Record) bool {
				return ev.Type == "drop" && ev.Reason == c.r.String() && ev.Ifindex == uint32(idx)
			})
			if uint64(n) != drops || drops == 0 {
				t.Errorf("%s: %d drops counted, %d events of them: %+v", c.r, drops, n, got)
			}
		}
	})

	t.Run("pod-tunnels", func(t *testing.T) {
		// A pod of node 3 sending VXLAN to node 1 itself, claiming a
		// neighbour's address: masqueraded it would leave as node 3 and
		// pass node 1's rule. Its host veth drops it.
		_, hidx := n3.HostVeth("t3")
		m := n3.Maps()
		before := counter(t, m, hidx, maps.DirEgress, maps.ReasonDropTunSrc).Packets
		got := listenUDP4(t, p1, 9998)
		other3 := append(net.IP{}, a3...)
		other3[3]++
		sendVXLAN(t, p3, tunNode[0], vxlanFrame(other3, a1, 9998, []byte("from-a-pod")))
		if arrived := got(2 * time.Second); len(arrived) != 0 {
			t.Errorf("pod 1 received %q from a pod's own VXLAN datagram", arrived)
		}
		if d := counter(t, m, hidx, maps.DirEgress, maps.ReasonDropTunSrc).Packets - before; d != 1 {
			t.Errorf("pod 3's drop_tunnel_source counted %d, want 1", d)
		}
	})

	t.Run("pmtu", func(t *testing.T) {
		// Pod 1's 1450-byte packets become 1500-byte ones on the wire,
		// which the router's 1400-byte link to node 3 refuses: its
		// "fragmentation needed" gives node 1 the path MTU to node 3, which
		// the agent sets on the routes into the tunnel (1350), and the pod
		// is told in turn. The transfers complete, both families.
		if err := testenv.TCPTransfer(p1, p3, a3, 4<<20); err != nil {
			t.Fatal(err)
		}
		if err := testenv.TCPTransfer(p1, p3, a36, 4<<20); err != nil {
			t.Fatal(err)
		}
		// Datagrams that fit the pod's MTU but not the path: the pod is told.
		for _, c := range []struct {
			ip   net.IP
			args []string
			want string
		}{
			{a3, []string{"-s", "1422"}, "mtu = 1350"},
			{a36, []string{"-6", "-s", "1402"}, "mtu=1350"},
		} {
			var out []byte
			deadline := time.Now().Add(15 * time.Second)
			for {
				p1.Do(func(ns.NetNS) error {
					args := append([]string{"-c", "2", "-i", "0.5", "-W", "1", "-M", "do"}, c.args...)
					out, _ = exec.Command("ping", append(args, c.ip.String())...).CombinedOutput()
					return nil
				})
				if strings.Contains(string(out), c.want) || time.Now().After(deadline) {
					break
				}
			}
			if !strings.Contains(string(out), c.want) {
				t.Errorf("ping -M do %v %s: no %q from the path:\n%s", c.args, c.ip, c.want, out)
			}
		}
		// Once told, the pod's datagrams of the path's size go through.
		if err := p1.Do(func(ns.NetNS) error {
			out, err := exec.Command("ping", "-c", "2", "-i", "0.3", "-W", "2", "-M", "do", "-s", "1322", a3.String()).CombinedOutput()
			if err != nil {
				return fmt.Errorf("ping -s 1322 %s: %v\n%s", a3, err, out)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	})

	t.Run("agent-killed", func(t *testing.T) {
		// The device, its programs and routes outlive the agent; the next
		// one keeps them (same device).
		idx, _, _ := tunDevice(t, n1)
		agents[0].Cmd.Process.Kill()
		agents[0].Exited(5 * time.Second)
		if err := testenv.Ping(p1, a3, 2); err != nil {
			t.Fatalf("with node 1's agent killed: %v", err)
		}
		n1.StartAgent(confDirs[0], append(lab.agentArgs(n1), "--tunnel", "vxlan", "--tunnel-hybrid", "--metrics-addr", "")...)
		if err := testenv.Ping(p1, a3, 2); err != nil {
			t.Fatalf("after the agent restarted: %v", err)
		}
		if now, _, _ := tunDevice(t, n1); now != idx {
			t.Errorf("the restarted agent re-created %s (ifindex %d, was %d)", datapath.TunnelDevice, now, idx)
		}
		mustAsk(t, p3, "tcp", hp(a1, 80), 0, "t1", a3)
	})

	t.Run("status", func(t *testing.T) {
		// The tunnel device's pinned link is the node's, not a stray.
		out, err := n1.AgentCmd("status", "--pin-dir", n1.PinDir, "--state-dir", n1.StateDir)
		if err != nil {
			t.Errorf("ebpf-agent status on a tunnel node: %v\n%s", err, out)
		}
	})

	t.Run("hostport", func(t *testing.T) {
		// Node 3's pod reaches node 1's hostPort (via the router, node 3
		// masquerading: node 1's address is outside the cluster CIDRs).
		mustAsk(t, p3, "tcp", hp(tunNode[0], 8080), 0, "t1", tunNode[2])
	})
}

// TestTunnelGeneve: geneve where the kernel has it; where it does not (the
// module missing), `peers --tunnel geneve` fails naming it and leaves no
// device behind.
func TestTunnelGeneve(t *testing.T) {
	e := testenv.New(t)
	peers := filepath.Join(t.TempDir(), "peers.json")
	pj, _ := json.Marshal([]agent.Peer{{NodeIP: "10.77.9.9", PodCIDRs: []string{"10.79.9.0/24"}}})
	if err := os.WriteFile(peers, pj, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := e.MasqAgent("peers", "--peers", peers, "--tunnel", "geneve", "--cni-conf-dir", t.TempDir())
	var kind string
	e.InNode(func() error {
		if l, lerr := netlink.LinkByName(datapath.TunnelDevice); lerr == nil {
			kind = l.Type()
		}
		return nil
	})
	if err != nil {
		if !strings.Contains(err.Error(), "geneve") {
			t.Fatalf("peers --tunnel geneve failed without naming geneve: %v", err)
		}
		if kind != "" {
			t.Errorf("a failed geneve setup left %s (%s)", datapath.TunnelDevice, kind)
		}
		t.Logf("no geneve on this kernel, as reported: %v", err)
		return
	}
	if kind != "geneve" {
		t.Errorf("peers --tunnel geneve made a %q device:\n%s", kind, out)
	}
}
