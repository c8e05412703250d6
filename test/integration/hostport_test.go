// hostPort (portMappings): remote clients, the node itself, hairpin, hostIP,
// TCP and UDP, no iptables rule, conflicts between pods.

package integration

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// The "remote" host: a netns routed to the node over a veth. The node's end
// (its uplink) holds uplinkIP4/6 besides the node addresses on lo.
var (
	uplinkIP4 = net.ParseIP("198.51.100.1").To4()
	uplinkIP6 = net.ParseIP("fd00:51::1")
	remoteIP4 = net.ParseIP("198.51.100.2").To4()
	remoteIP6 = net.ParseIP("fd00:51::2")
)

// hpEnv is a node with hostPorts enabled in its conflist and a remote host.
type hpEnv struct {
	*testenv.Env
	remote ns.NetNS
}

func newHPEnv(t *testing.T) *hpEnv {
	t.Helper()
	e := testenv.New(t)
	e.Extra = map[string]any{"capabilities": map[string]bool{"portMappings": true}}
	h := &hpEnv{Env: e}
	h.remote = testenv.NewNS(t)
	if err := h.plugUplink(); err != nil {
		t.Fatal(err)
	}
	return h
}

// plugUplink connects the node and the remote host with a veth, uplink0 on
// the node (uplinkIP4/6) and eth0 on the remote host (remoteIP4/6, default
// routes via the node).
func (h *hpEnv) plugUplink() error {
	addr := func(l netlink.Link, cidr string) error {
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			return err
		}
		a.Flags = unix.IFA_F_NODAD
		return netlink.AddrAdd(l, a)
	}
	err := h.InNode(func() error {
		veth := &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: "uplink0"},
			PeerName:  "eth0", PeerNamespace: netlink.NsFd(int(h.remote.Fd())),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add uplink veth: %w", err)
		}
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		for _, c := range []string{uplinkIP4.String() + "/24", uplinkIP6.String() + "/64"} {
			if err := addr(l, c); err != nil {
				return fmt.Errorf("add %s to uplink0: %w", c, err)
			}
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		return fmt.Errorf("node uplink: %w", err)
	}
	err = h.remote.Do(func(ns.NetNS) error {
		for _, n := range []string{"lo", "eth0"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		l, _ := netlink.LinkByName("eth0")
		for _, c := range []string{remoteIP4.String() + "/24", remoteIP6.String() + "/64"} {
			if err := addr(l, c); err != nil {
				return fmt.Errorf("add %s to remote eth0: %w", c, err)
			}
		}
		for _, gw := range []net.IP{uplinkIP4, uplinkIP6} {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw}); err != nil {
				return fmt.Errorf("default route via %s: %w", gw, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("remote netns: %w", err)
	}
	return nil
}

// TestHostPortRemote: a remote host reaches a pod through every node address
// (uplink and lo) : hostPort, over TCP and UDP, IPv4 and IPv6, and sees the
// replies come from the address it dialled. The pod sees the client.
func TestHostPortRemote(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	p := e.NewPod()
	e.MustAddHP(p, "web", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "UDP"})
	serve(t, p, 80, "web")

	for _, proto := range []string{"tcp", "udp"} {
		for _, ip := range []net.IP{uplinkIP4, testenv.NodeIP4, uplinkIP6, testenv.NodeIP6} {
			a := expectServer(t, e.remote, proto, hp(ip, 8080), "web")
			want := remoteIP4
			if ip.To4() == nil {
				want = remoteIP6
			}
			if host, _, _ := net.SplitHostPort(a.peer); host != want.String() {
				t.Errorf("%s %s: the pod saw %s, want the client %s", proto, hp(ip, 8080), a.peer, want)
			}
		}
	}
	// No other port is mapped.
	expectNoServer(t, e.remote, "tcp", hp(uplinkIP4, 8081))

	e.MustDel(p, "web")
	e.AssertClean()
	e.AssertNoHostPorts()
}

// TestHostPortFromNode: processes in the node's netns reach a hostPort on a
// node address, 127.0.0.1 and ::1 (cgroup socket hooks, no route_localnet),
// see the address they dialled (getpeername, UDP reply source), and other
// namespaces of the machine are not affected by the root-cgroup hooks.
func TestHostPortFromNode(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	p := e.NewPod()
	e.MustAddHP(p, "web", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "udp"})
	serve(t, p, 80, "web")

	for _, proto := range []string{"tcp", "udp"} {
		for _, ip := range []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), testenv.NodeIP4, testenv.NodeIP6, uplinkIP4, uplinkIP6} {
			expectServer(t, e.Node, proto, hp(ip, 8080), "web")
		}
	}
	// A connected UDP socket (connect + write/read) works too.
	err := e.Node.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp", "127.0.0.1:8080")
		if err != nil {
			return err
		}
		defer c.Close()
		if c.RemoteAddr().String() != "127.0.0.1:8080" {
			return fmt.Errorf("connected UDP: peer %s", c.RemoteAddr())
		}
		c.Write([]byte("x"))
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 256)
		n, err := c.Read(buf)
		if err != nil || !strings.HasPrefix(string(buf[:n]), "web ") {
			return fmt.Errorf("connected UDP: %q %v", buf[:n], err)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	// The hooks sit on the machine's cgroup root: another netns with the same
	// addresses and no hostPorts (here, the remote's loopback) is untouched.
	expectNoServer(t, e.remote, "tcp", "127.0.0.1:8080")
	expectNoServer(t, e.remote, "udp", "127.0.0.1:8080")

	e.MustDel(p, "web")
	for _, proto := range []string{"tcp", "udp"} {
		expectNoServer(t, e.Node, proto, "127.0.0.1:8080")
	}
	e.AssertClean()
	e.AssertNoHostPorts()
}

// TestHostPortHairpin: a pod reaches its own hostPort and another pod's
// through a node address, TCP and UDP, IPv4 and IPv6. Reaching itself, it
// is SNATed to the dialled address (it must not see its own address as the
// source); reaching another pod it is seen as itself.
func TestHostPortHairpin(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	a, b := e.NewPod(), e.NewPod()
	ra := e.MustAddHP(a, "pod-a", testenv.PM{HostPort: 7001, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 7001, ContainerPort: 80, Protocol: "udp"})
	e.MustAddHP(b, "pod-b", testenv.PM{HostPort: 7002, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 7002, ContainerPort: 80, Protocol: "udp"})
	serve(t, a, 80, "pod-a")
	serve(t, b, 80, "pod-b")
	a4, a6 := testenv.PodIPs(t, ra)

	for _, proto := range []string{"tcp", "udp"} {
		for _, ip := range []net.IP{testenv.NodeIP4, uplinkIP4, testenv.NodeIP6, uplinkIP6} {
			self := expectServer(t, a, proto, hp(ip, 7001), "pod-a")
			if host, _, _ := net.SplitHostPort(self.peer); host != ip.String() {
				t.Errorf("%s hairpin to itself via %s: the pod saw %s as the client, want the dialled %s", proto, ip, self.peer, ip)
			}
			other := expectServer(t, a, proto, hp(ip, 7002), "pod-b")
			want := a4
			if ip.To4() == nil {
				want = a6
			}
			if host, _, _ := net.SplitHostPort(other.peer); host != want.String() {
				t.Errorf("%s hairpin to pod-b via %s: pod-b saw %s, want pod-a %s", proto, ip, other.peer, want)
			}
		}
	}
	m := e.Maps()
	stats, err := m.HostPorts().Stats()
	if err != nil {
		t.Fatal(err)
	}
	if stats["dnat_hairpin"] == 0 || stats["reply"] == 0 {
		t.Errorf("hostPort counters %v: want hairpin DNATs and translated replies", stats)
	}
	e.MustDel(a, "pod-a")
	e.MustDel(b, "pod-b")
	e.AssertClean()
	e.AssertNoHostPorts()
}

// TestHostPortHostIP: the same hostPort on different hostIPs and protocols
// leads to different pods (the Kubernetes conformance case "no conflict
// between pods with same hostPort but different hostIP and protocol",
// 127.0.0.1 included), a hostIP mapping is not reachable on the node's other
// addresses, and a specific hostIP wins over a wildcard on the same port.
func TestHostPortHostIP(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	pods := map[string]ns.NetNS{}
	add := func(name string, pms ...testenv.PM) {
		p := e.NewPod()
		pods[name] = p
		e.MustAddHP(p, name, pms...)
		serve(t, p, 80, name)
	}
	// Conformance: 127.0.0.1/tcp, node IP/tcp, node IP/udp.
	add("local", testenv.PM{HostPort: 9000, ContainerPort: 80, Protocol: "tcp", HostIP: "127.0.0.1"})
	add("node-tcp", testenv.PM{HostPort: 9000, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP4.String()})
	add("node-udp", testenv.PM{HostPort: 9000, ContainerPort: 80, Protocol: "udp", HostIP: uplinkIP4.String()})
	// IPv6: the same port on two node addresses, two pods.
	add("v6-uplink", testenv.PM{HostPort: 9001, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP6.String()}, testenv.PM{HostPort: 9001, ContainerPort: 80, Protocol: "udp", HostIP: uplinkIP6.String()})
	add("v6-lo", testenv.PM{HostPort: 9001, ContainerPort: 80, Protocol: "tcp", HostIP: testenv.NodeIP6.String()}, testenv.PM{HostPort: 9001, ContainerPort: 80, Protocol: "udp", HostIP: testenv.NodeIP6.String()})
	// Wildcard and specific on one port: the specific one wins where it applies.
	add("any", testenv.PM{HostPort: 9002, ContainerPort: 80, Protocol: "tcp"})
	add("specific", testenv.PM{HostPort: 9002, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP4.String()})
	// 0.0.0.0 is the IPv4 wildcard only.
	add("any4", testenv.PM{HostPort: 9003, ContainerPort: 80, Protocol: "tcp", HostIP: "0.0.0.0"})

	expectServer(t, e.Node, "tcp", "127.0.0.1:9000", "local")
	expectServer(t, e.Node, "tcp", hp(uplinkIP4, 9000), "node-tcp")
	expectServer(t, e.Node, "udp", hp(uplinkIP4, 9000), "node-udp")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 9000), "node-tcp")
	expectServer(t, e.remote, "udp", hp(uplinkIP4, 9000), "node-udp")
	expectNoServer(t, e.remote, "tcp", hp(testenv.NodeIP4, 9000))
	expectNoServer(t, e.Node, "udp", "127.0.0.1:9000")
	for _, from := range []ns.NetNS{e.remote, e.Node} {
		for _, proto := range []string{"tcp", "udp"} {
			expectServer(t, from, proto, hp(uplinkIP6, 9001), "v6-uplink")
			expectServer(t, from, proto, hp(testenv.NodeIP6, 9001), "v6-lo")
		}
	}
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 9002), "specific")
	expectServer(t, e.remote, "tcp", hp(testenv.NodeIP4, 9002), "any")
	expectServer(t, e.remote, "tcp", hp(uplinkIP6, 9002), "any")
	expectServer(t, e.Node, "tcp", "127.0.0.1:9002", "any")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 9003), "any4")
	expectNoServer(t, e.remote, "tcp", hp(uplinkIP6, 9003))

	for name, p := range pods {
		e.MustDel(p, name)
	}
	e.AssertClean()
	e.AssertNoHostPorts()
}

// TestHostPortTCPAndUDP: TCP and UDP on the same port number lead to
// different pods at once, and each keeps working while the other is used.
func TestHostPortTCPAndUDP(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	tp, up := e.NewPod(), e.NewPod()
	e.MustAddHP(tp, "tcp-pod", testenv.PM{HostPort: 5353, ContainerPort: 80, Protocol: "tcp"})
	e.MustAddHP(up, "udp-pod", testenv.PM{HostPort: 5353, ContainerPort: 80, Protocol: "udp"})
	serve(t, tp, 80, "tcp-pod")
	serve(t, up, 80, "udp-pod")
	for _, from := range []ns.NetNS{e.remote, e.Node} {
		for _, ip := range []net.IP{uplinkIP4, uplinkIP6} {
			expectServer(t, from, "tcp", hp(ip, 5353), "tcp-pod")
			expectServer(t, from, "udp", hp(ip, 5353), "udp-pod")
		}
	}
	e.MustDel(tp, "tcp-pod")
	expectNoServer(t, e.remote, "tcp", hp(uplinkIP4, 5353))
	expectServer(t, e.remote, "udp", hp(uplinkIP4, 5353), "udp-pod")
	e.MustDel(up, "udp-pod")
	e.AssertClean()
	e.AssertNoHostPorts()
}

// TestHostPortNoRules: ADD, traffic and DEL leave the iptables, ip6tables and
// nftables rulesets of the node and of the host exactly as they were.
func TestHostPortNoRules(t *testing.T) {
	e := newHPEnv(t) // not parallel: the host's ruleset is shared
	nodeBefore, hostBefore := rulesets(t, e.Node), rulesets(t, nil)
	p := e.NewPod()
	e.MustAddHP(p, "web", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "udp"},
		testenv.PM{HostPort: 8443, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP6.String()})
	serve(t, p, 80, "web")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "web")
	expectServer(t, e.remote, "udp", hp(uplinkIP6, 8080), "web")
	expectServer(t, e.remote, "tcp", hp(uplinkIP6, 8443), "web")
	expectServer(t, e.Node, "tcp", "127.0.0.1:8080", "web")
	expectServer(t, p, "tcp", hp(testenv.NodeIP4, 8080), "web")
	if got := rulesets(t, e.Node); got != nodeBefore {
		t.Errorf("ADD changed the node's ruleset:\nbefore:\n%s\nafter:\n%s", nodeBefore, got)
	}
	if got := rulesets(t, nil); got != hostBefore {
		t.Errorf("ADD changed the host's ruleset:\nbefore:\n%s\nafter:\n%s", hostBefore, got)
	}
	e.MustDel(p, "web")
	if got := rulesets(t, e.Node); got != nodeBefore {
		t.Errorf("DEL changed the node's ruleset:\nbefore:\n%s\nafter:\n%s", nodeBefore, got)
	}
	if got := rulesets(t, nil); got != hostBefore {
		t.Errorf("DEL changed the host's ruleset:\nbefore:\n%s\nafter:\n%s", hostBefore, got)
	}
	e.AssertClean()
	e.AssertNoHostPorts()
}

// TestHostPortConflict: an ADD asking for a hostPort another pod holds fails
// with error 7 naming the entry, and leaves nothing: no veth, no IPAM
// reservation, no record, none of its other mappings. Of pods racing for one
// hostPort, exactly one wins.
func TestHostPortConflict(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	owner := e.NewPod()
	e.MustAddHP(owner, "owner", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	serve(t, owner, 80, "owner")

	p := e.NewPod()
	e.CleanupDel(p, "late")
	_, err := e.AddHP(p, "late", testenv.PM{HostPort: 9090, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 8080, ContainerPort: 81, Protocol: "TCP"})
	if code := testenv.ErrCode(err); code != codeInvalidConfig {
		t.Fatalf("ADD of a taken hostPort: code %d (%v), want %d", code, err, codeInvalidConfig)
	}
	wantErrContains(t, "ADD of a taken hostPort", err, "runtimeConfig.portMappings[1]", "*:8080/tcp", "already mapped", "container owner")
	late := &testenv.Attachment{Pod: p, ID: "late", IfName: "eth0", HostIf: state.HostIfName("late", "eth0")}
	e.AssertGone(late)
	m := e.Maps()
	hps, _ := m.HostPorts().List()
	for _, h := range hps {
		if h.HostPort == 9090 {
			t.Errorf("the failed ADD left its other mapping %s", h.Listen())
		}
	}
	// The owner is untouched.
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "owner")
	if err := e.CheckHP(owner, "owner", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}); err != nil {
		t.Errorf("CHECK of the owner after the failed ADD: %v", err)
	}
	// A wildcard mapping does not conflict with a specific one (the more
	// specific wins, as with sockets), but two on the same hostIP do.
	s := e.NewPod()
	e.MustAddHP(s, "specific", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP4.String()})
	s2 := e.NewPod()
	e.CleanupDel(s2, "specific-2")
	_, err = e.AddHP(s2, "specific-2", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP4.String()})
	if code := testenv.ErrCode(err); code != codeInvalidConfig {
		t.Errorf("second ADD of %s:8080/tcp: code %d (%v), want %d", uplinkIP4, code, err, codeInvalidConfig)
	}

	// Racing: N pods ADD the same hostPort at once.
	const racers = 4
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins []string
	)
	for i := 0; i < racers; i++ {
		id := fmt.Sprintf("racer-%d", i)
		rp := e.NewPod()
		e.CleanupDel(rp, id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.AddHP(rp, id, testenv.PM{HostPort: 7777, ContainerPort: 80, Protocol: "udp"}); err == nil {
				mu.Lock()
				wins = append(wins, id)
				mu.Unlock()
			} else if testenv.ErrCode(err) != codeInvalidConfig {
				t.Errorf("%s lost the race with %v, want error %d", id, err, codeInvalidConfig)
			}
		}()
	}
	wg.Wait()
	if len(wins) != 1 {
		t.Fatalf("%d of %d racing ADDs won hostPort 7777/udp (%v), want exactly 1", len(wins), racers, wins)
	}
	n := 0
	hps, _ = m.HostPorts().List()
	for _, h := range hps {
		if h.HostPort == 7777 {
			n++
		}
	}
	if n != 2 { // IPv4 and IPv6 of the winner
		t.Errorf("%d entries for 7777/udp after the race, want 2", n)
	}
}
