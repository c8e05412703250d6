package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// ---- helpers of this file --------------------------------------------------

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
	r, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create remote netns: %v", err)
	}
	h.remote = r
	t.Cleanup(func() {
		r.Close()
		testutils.UnmountNS(r)
	})
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

// serve runs TCP and UDP servers on port in netns (IPv4 and IPv6) until the
// test ends. Each answers "<name> <peer address it saw>".
func serve(t *testing.T, netns ns.NetNS, port int, name string) {
	t.Helper()
	var (
		lns []net.Listener
		pcs []net.PacketConn
	)
	err := netns.Do(func(ns.NetNS) error {
		// Explicit families: Go's dual-stack probe may have run in a netns
		// without ::1 and would then listen on IPv4 only.
		for _, fam := range []string{"4", "6"} {
			ln, err := net.Listen("tcp"+fam, fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			lns = append(lns, ln)
			pc, err := net.ListenPacket("udp"+fam, fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			pcs = append(pcs, pc)
		}
		return nil
	})
	t.Cleanup(func() {
		for _, l := range lns {
			l.Close()
		}
		for _, p := range pcs {
			p.Close()
		}
	})
	if err != nil {
		t.Fatalf("serve %s on port %d: %v", name, port, err)
	}
	for _, ln := range lns {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(10 * time.Second))
					fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
					// Stay until the client is done, so its reads see our close.
					buf := make([]byte, 64)
					c.Read(buf)
				}()
			}
		}()
	}
	for _, pc := range pcs {
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				msg := fmt.Sprintf("%s %s %s", name, from, buf[:n])
				pc.WriteTo([]byte(msg), from)
			}
		}()
	}
}

// answer is what a server said: its name and the peer it saw.
type answer struct {
	server string
	peer   string // host:port the server saw
	from   string // UDP: the reply's source, as the client saw it
}

func parseAnswer(s string) (answer, error) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return answer{}, fmt.Errorf("malformed answer %q", s)
	}
	return answer{server: f[0], peer: f[1]}, nil
}

// askTCP connects from netns to addr and returns the server's answer; the
// connection's remote address must be what was dialled.
func askTCP(netns ns.NetNS, addr string) (answer, error) {
	var a answer
	err := netns.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if got := c.RemoteAddr().String(); got != addr {
			return fmt.Errorf("getpeername says %s, dialled %s", got, addr)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return fmt.Errorf("read answer: %w", err)
		}
		a, err = parseAnswer(line)
		return err
	})
	if err != nil {
		return a, fmt.Errorf("TCP to %s: %w", addr, err)
	}
	return a, nil
}

// askUDP sends from an unconnected socket in netns to addr and returns the
// answer with the source address the reply came from.
func askUDP(netns ns.NetNS, addr string) (answer, error) {
	var a answer
	err := netns.Do(func(ns.NetNS) error {
		raddr, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return err
		}
		network := "udp4"
		if raddr.IP.To4() == nil {
			network = "udp6"
		}
		c, err := net.ListenUDP(network, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 2048)
		for try := 0; try < 3; try++ {
			if _, err := c.WriteToUDP([]byte("ping"), raddr); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			n, from, err := c.ReadFromUDP(buf)
			if err != nil {
				continue
			}
			if a, err = parseAnswer(string(buf[:n])); err != nil {
				return err
			}
			a.from = from.String()
			return nil
		}
		return fmt.Errorf("no answer")
	})
	if err != nil {
		return a, fmt.Errorf("UDP to %s: %w", addr, err)
	}
	return a, nil
}

func hp(ip net.IP, port int) string { return net.JoinHostPort(ip.String(), fmt.Sprint(port)) }

// expectServer asks addr over proto and wants server's answer, with the
// reply coming from addr itself.
func expectServer(t *testing.T, from ns.NetNS, proto, addr, server string) answer {
	t.Helper()
	var (
		a   answer
		err error
	)
	if proto == "tcp" {
		a, err = askTCP(from, addr)
	} else {
		a, err = askUDP(from, addr)
	}
	if err != nil {
		t.Errorf("%s %s: %v", proto, addr, err)
		return a
	}
	if a.server != server {
		t.Errorf("%s %s answered by %q, want %q", proto, addr, a.server, server)
	}
	if proto == "udp" && a.from != addr {
		t.Errorf("UDP %s: the reply came from %s, not the address dialled", addr, a.from)
	}
	return a
}

// expectNoServer wants addr over proto not to reach any server.
func expectNoServer(t *testing.T, from ns.NetNS, proto, addr string) {
	t.Helper()
	var err error
	var a answer
	if proto == "tcp" {
		a, err = askTCP(from, addr)
	} else {
		a, err = askUDP(from, addr)
	}
	if err == nil {
		t.Errorf("%s %s reached %q, want nothing there", proto, addr, a.server)
	}
}

// rulesets returns the iptables, ip6tables and nftables rules of netns
// (nil: the test process's own), counters and comments left out.
var counterRE = regexp.MustCompile(`\[\d+:\d+\]|counter packets \d+ bytes \d+`)

func rulesets(t *testing.T, netns ns.NetNS) string {
	t.Helper()
	var out strings.Builder
	run := func() error {
		for _, c := range [][]string{{"iptables-save"}, {"ip6tables-save"}, {"nft", "list", "ruleset"}} {
			b, err := exec.Command(c[0], c[1:]...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %v: %s", strings.Join(c, " "), err, b)
			}
			fmt.Fprintf(&out, "== %s\n", strings.Join(c, " "))
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, "#") {
					continue
				}
				out.WriteString(counterRE.ReplaceAllString(l, "") + "\n")
			}
		}
		return nil
	}
	var err error
	if netns == nil {
		err = run()
	} else {
		err = netns.Do(func(ns.NetNS) error { return run() })
	}
	if err != nil {
		t.Fatalf("read rulesets: %v", err)
	}
	return out.String()
}

// ctOf returns the cni_ct entries made for the pod behind ifindex.
func ctOf(t *testing.T, m *maps.Maps, ifindex int) []maps.Flow {
	t.Helper()
	all, err := m.ListCT()
	if err != nil {
		t.Fatalf("read cni_ct: %v", err)
	}
	var out []maps.Flow
	for _, f := range all {
		if f.Ifindex == ifindex {
			out = append(out, f)
		}
	}
	return out
}

func removeFile(p string) error { return os.Remove(p) }

// ---- tests -----------------------------------------------------------------

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
	stats, err := m.HostPortStats()
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
	hps, _ := m.ListHostPorts()
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
	hps, _ = m.ListHostPorts()
	for _, h := range hps {
		if h.HostPort == 7777 {
			n++
		}
	}
	if n != 2 { // IPv4 and IPv6 of the winner
		t.Errorf("%d entries for 7777/udp after the race, want 2", n)
	}
}

// udpFlood sends a datagram every 20 ms from a fixed source in netns to addr
// until stopped, and counts the answers by server.
type udpFlood struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	answers map[string]int
}

func startUDPFlood(t *testing.T, netns ns.NetNS, src *net.UDPAddr, addr string) *udpFlood {
	t.Helper()
	f := &udpFlood{stop: make(chan struct{}), done: make(chan struct{}), answers: map[string]int{}}
	var c *net.UDPConn
	err := netns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.ListenUDP("udp", src)
		return err
	})
	if err != nil {
		t.Fatalf("UDP flood socket: %v", err)
	}
	raddr, _ := net.ResolveUDPAddr("udp", addr)
	go func() {
		buf := make([]byte, 512)
		for {
			n, _, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if a, err := parseAnswer(string(buf[:n])); err == nil {
				f.mu.Lock()
				f.answers[a.server]++
				f.mu.Unlock()
			}
		}
	}()
	go func() {
		defer close(f.done)
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-f.stop:
				c.Close()
				return
			case <-tk.C:
				c.WriteToUDP([]byte("flood"), raddr)
			}
		}
	}()
	stop := func() {
		select {
		case <-f.stop:
		default:
			close(f.stop)
			<-f.done
		}
	}
	t.Cleanup(stop)
	return f
}

func (f *udpFlood) count(server string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.answers[server]
}

// countUDP counts datagrams arriving on port in netns during d.
func countUDP(t *testing.T, netns ns.NetNS, port int, d time.Duration) int {
	t.Helper()
	var c net.PacketConn
	err := netns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatalf("listen UDP %d: %v", port, err)
	}
	defer c.Close()
	n := 0
	end := time.Now().Add(d)
	buf := make([]byte, 512)
	for time.Now().Before(end) {
		c.SetReadDeadline(end)
		if _, _, err := c.ReadFrom(buf); err == nil {
			n++
		}
	}
	return n
}

// TestHostPortDelPurgesFlows: DEL removes the pod's mappings, every cni_ct
// and socket entry made for it, and aborts node UDP sockets the hook had
// connected to it. A new pod given the same IP receives none of the old
// UDP flows: neither a remote client still sending to the hostPort nor a
// node socket that had connected through it (the portmap failure where
// stale conntrack entries keep delivering to the IP).
func TestHostPortDelPurgesFlows(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	// One address only, so the next pod gets the same one.
	e.IPAM = map[string]any{
		"type": "host-local", "dataDir": e.DataDir,
		"ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4, "rangeStart": "10.250.0.50", "rangeEnd": "10.250.0.50"}}},
	}
	old := e.NewPod()
	r := e.MustAddHP(old, "old", testenv.PM{HostPort: 6000, ContainerPort: 80, Protocol: "udp"}, testenv.PM{HostPort: 6001, ContainerPort: 81, Protocol: "tcp"})
	podIP, _ := resultIPs(r)
	serve(t, old, 80, "old")
	serve(t, old, 81, "old")
	_, oldIdx := e.HostVeth("old")

	flood := startUDPFlood(t, e.remote, &net.UDPAddr{IP: remoteIP4, Port: 40000}, hp(uplinkIP4, 6000))
	// A node process with a connected UDP socket through the hostPort.
	var nodeSock net.Conn
	err := e.Node.Do(func(ns.NetNS) error {
		var err error
		nodeSock, err = net.Dial("udp", "127.0.0.1:6000")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeSock.Close()
	nodeSock.Write([]byte("hello"))
	nodeSock.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := nodeSock.Read(make([]byte, 256)); err != nil || n == 0 {
		t.Fatalf("node's connected UDP socket got no answer: %v", err)
	}
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 6001), "old")
	deadline := time.Now().Add(3 * time.Second)
	for flood.count("old") < 5 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if flood.count("old") < 5 {
		t.Fatalf("the remote UDP flow got %d answers from the old pod, want some", flood.count("old"))
	}

	m := e.Maps()
	flows := ctOf(t, m, oldIdx)
	found := false
	for _, f := range flows {
		if f.Client.String() == hp(remoteIP4, 40000) && f.Dialled.String() == hp(uplinkIP4, 6000) && f.Pod.String() == hp(podIP, 80) {
			found = true
		}
	}
	if !found {
		t.Fatalf("cni_ct lacks the remote UDP flow %s -> %s -> %s: %+v", hp(remoteIP4, 40000), hp(uplinkIP4, 6000), hp(podIP, 80), flows)
	}
	socks, _ := m.ListSockRNAT()
	if len(socks) == 0 {
		t.Fatalf("cni_sock_rnat has no entry for the node's socket")
	}

	e.MustDel(old, "old")
	if l := ctOf(t, m, oldIdx); len(l) != 0 {
		t.Errorf("DEL left %d cni_ct entries of the pod: %+v", len(l), l)
	}
	e.AssertNoHostPorts()
	// The node socket was aborted.
	nodeSock.SetDeadline(time.Now().Add(time.Second))
	_, werr := nodeSock.Write([]byte("still there?"))
	_, rerr := nodeSock.Read(make([]byte, 64))
	if werr == nil && rerr == nil {
		t.Errorf("the node's UDP socket connected through the hostPort still works after DEL")
	}

	// A new pod with the same IP, no mappings, listening on the same ports.
	fresh := e.NewPod()
	e.CleanupDel(fresh, "fresh")
	rf, err := e.AddHP(fresh, "fresh")
	if err != nil {
		t.Fatal(err)
	}
	if ip, _ := resultIPs(rf); !ip.Equal(podIP) {
		t.Fatalf("new pod got %s, want the old pod's %s", ip, podIP)
	}
	stopNode := make(chan struct{})
	go func() { // the old node socket keeps trying
		for {
			select {
			case <-stopNode:
				return
			case <-time.After(20 * time.Millisecond):
				nodeSock.Write([]byte("stale"))
			}
		}
	}()
	n := countUDP(t, fresh, 80, 1500*time.Millisecond)
	close(stopNode)
	if n != 0 {
		t.Errorf("the new pod with the old pod's IP received %d datagrams of the old flows", n)
	}
	e.MustDel(fresh, "fresh")
	e.AssertClean()
	e.AssertNoHostPorts()
}

// TestHostPortBadInput: malformed entries are error 7 naming the entry and
// field, and nothing is kept; DEL accepts anything.
func TestHostPortBadInput(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		pms  []testenv.PM
		want []string
	}{
		{"hostPort 0", []testenv.PM{{HostPort: 0, ContainerPort: 80, Protocol: "tcp"}}, []string{"runtimeConfig.portMappings[0].hostPort", "0 is out of range"}},
		{"hostPort too big", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 70000, ContainerPort: 80, Protocol: "tcp"}},
			[]string{"runtimeConfig.portMappings[1].hostPort", "70000 is out of range"}},
		{"containerPort negative", []testenv.PM{{HostPort: 80, ContainerPort: -1, Protocol: "udp"}}, []string{"runtimeConfig.portMappings[0].containerPort", "-1"}},
		{"unknown protocol", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "icmp"}}, []string{"runtimeConfig.portMappings[0].protocol", "icmp"}},
		{"sctp", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "SCTP"}}, []string{"runtimeConfig.portMappings[0].protocol", "sctp", "not supported"}},
		{"bad hostIP", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "tcp", HostIP: "300.1.1.1"}}, []string{"runtimeConfig.portMappings[0].hostIP", "300.1.1.1"}},
		{"multicast hostIP", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "tcp", HostIP: "224.0.0.1"}}, []string{"runtimeConfig.portMappings[0].hostIP"}},
		{"same hostPort twice", []testenv.PM{{HostPort: 80, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 80, ContainerPort: 81, Protocol: "tcp"}},
			[]string{"runtimeConfig.portMappings[1].hostPort", "portMappings[0]"}},
	}
	e := newHPEnv(t)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.T = t
			p := e.NewPod()
			id := fmt.Sprintf("bad-%d", i)
			e.CleanupDel(p, id)
			_, err := e.AddHP(p, id, c.pms...)
			if code := testenv.ErrCode(err); code != codeInvalidConfig {
				t.Fatalf("ADD: code %d (%v), want %d", code, err, codeInvalidConfig)
			}
			wantErrContains(t, "ADD", err, c.want...)
			e.AssertClean()
			e.AssertNoHostPorts()
			// DEL with the same bad entries still succeeds.
			err = e.InNode(func() error {
				return e.CNI.DelNetworkList(context.Background(), e.ConfList("1.0.0"), e.RuntimeConfHP(p, id, c.pms))
			})
			if err != nil {
				t.Errorf("DEL with bad portMappings: %v", err)
			}
		})
	}
}

// TestHostPortSingleStack: a wildcard mapping of an IPv4-only pod exists for
// IPv4 only; a hostIP of a family the pod lacks is error 7 found after IPAM,
// and the failed ADD undoes everything, the IPAM reservation included.
func TestHostPortSingleStack(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}}
	p := e.NewPod()
	e.MustAddHP(p, "v4", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	serve(t, p, 80, "v4")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "v4")
	expectNoServer(t, e.remote, "tcp", hp(uplinkIP6, 8080))
	hps, _ := e.Maps().ListHostPorts()
	if len(hps) != 1 || hps[0].IPv6 {
		t.Errorf("mappings of an IPv4-only pod: %+v, want one IPv4 entry", hps)
	}

	q := e.NewPod()
	e.CleanupDel(q, "v6-hostip")
	_, err := e.AddHP(q, "v6-hostip", testenv.PM{HostPort: 8081, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP6.String()})
	if code := testenv.ErrCode(err); code != codeInvalidConfig {
		t.Fatalf("IPv6 hostIP for an IPv4-only pod: code %d (%v), want %d", code, err, codeInvalidConfig)
	}
	wantErrContains(t, "IPv6 hostIP for an IPv4-only pod", err, "runtimeConfig.portMappings[0].hostIP", "no IPv6 address")
	e.AssertGone(&testenv.Attachment{Pod: q, ID: "v6-hostip", IfName: "eth0", HostIf: state.HostIfName("v6-hostip", "eth0")})

	e.MustDel(p, "v4")
	e.AssertClean()
	e.AssertNoHostPorts()
}

// TestHostPortCheckAndGC: CHECK verifies the mappings and the node hooks
// and names what is missing; GC removes the mappings and flows of a pod
// whose veth is gone without a DEL, even with its state record lost.
func TestHostPortCheckAndGC(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	p := e.NewPod()
	pms := []testenv.PM{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 8080, ContainerPort: 80, Protocol: "udp", HostIP: uplinkIP4.String()}}
	e.MustAddHP(p, "web", pms...)
	if err := e.CheckHP(p, "web", pms...); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	m := e.Maps()
	if err := e.CheckHP(p, "web", testenv.PM{HostPort: 8080, ContainerPort: 99, Protocol: "tcp"}); err == nil {
		t.Errorf("CHECK with another containerPort passed")
	}
	// Remove the IPv6 wildcard entry by hand.
	hps, _ := m.ListHostPorts()
	for _, h := range hps {
		if h.IPv6 {
			h2 := h
			if err := m.DeleteHostPort(h2); err != nil {
				t.Fatal(err)
			}
		}
	}
	err := e.CheckHP(p, "web", pms...)
	wantErrContains(t, "CHECK with a mapping removed", err, "cni_hostports", "[*]:8080/tcp")

	// A second pod whose netns disappears without DEL, record lost too.
	q := e.NewPod()
	e.MustAddHP(q, "gone", testenv.PM{HostPort: 9000, ContainerPort: 80, Protocol: "udp"})
	// No server (its sockets would keep the netns alive): a datagram is
	// enough for a flow entry.
	askUDP(e.remote, hp(uplinkIP4, 9000))
	hostIf, goneIdx := e.HostVeth("gone")
	if len(ctOf(t, m, goneIdx)) == 0 {
		t.Fatalf("no flow entry for the datagram to %s", hp(uplinkIP4, 9000))
	}
	destroyPod(t, q)
	e.WaitLinkGone(hostIf)
	if err := removeFile(e.RecordPath("gone", "eth0")); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(types.GCAttachment{ContainerID: "web", IfName: "eth0"}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	hps, _ = m.ListHostPorts()
	for _, h := range hps {
		if h.HostPort == 9000 {
			t.Errorf("GC left the mapping %s of a pod whose veth is gone", h.Listen())
		}
	}
	flows, _ := m.ListCT()
	for _, f := range flows {
		if f.Dialled.Port() == 9000 {
			t.Errorf("GC left the flow %+v of a pod whose veth is gone", f)
		}
	}
	// The live pod's remaining mapping is still there.
	if err := e.CheckHP(p, "web", pms[1]); err != nil {
		t.Errorf("CHECK of the live pod after GC: %v", err)
	}
	e.MustDel(p, "web")
	e.AssertNoHostPorts()
}

// TestHostPortAgentDump: `ebpf-agent dump hostports` and `dump ct` show the
// mappings and flows, as an aligned table and as JSON.
func TestHostPortAgentDump(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	p := e.NewPod()
	e.CleanupDel(p, "web")
	rt := e.RuntimeConfHP(p, "web", []testenv.PM{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 5353, ContainerPort: 53, Protocol: "udp", HostIP: uplinkIP4.String()}})
	rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", "web-0"}}
	var res types.Result
	err := e.InNode(func() error {
		var err error
		res, err = e.CNI.AddNetworkList(context.Background(), e.ConfList("1.0.0"), rt)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := current.NewResultFromResult(res)
	p4, _ := testenv.PodIPs(t, r)
	serve(t, p, 80, "web")
	serve(t, p, 53, "web")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "web")
	expectServer(t, e.remote, "udp", hp(uplinkIP4, 5353), "web")
	expectServer(t, e.Node, "tcp", "127.0.0.1:8080", "web")

	dump := func(what string, args ...string) []byte {
		t.Helper()
		var out []byte
		err := e.InNode(func() error {
			cmd := exec.Command(testenv.BinDir+"/ebpf-agent", append([]string{"dump", what, "--pin-dir", e.PinDir, "--state-dir", e.StateDir}, args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			var err error
			if out, err = cmd.Output(); err != nil {
				return fmt.Errorf("ebpf-agent dump %s %v: %v\n%s", what, args, err, stderr.Bytes())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	var rows []inspect.HostPortRow
	js := dump("hostports", "-o", "json")
	if err := json.Unmarshal(js, &rows); err != nil {
		t.Fatalf("decode: %v\n%s", err, js)
	}
	if len(rows) != 3 { // tcp *:8080 v4+v6, udp hostIP:5353
		t.Errorf("%d hostport rows, want 3:\n%s", len(rows), js)
	}
	hostIf, idx := e.HostVeth("web")
	for _, row := range rows {
		if row.Pod != "default/web-0" || row.Interface != hostIf || row.Ifindex != idx {
			t.Errorf("row %+v: want pod default/web-0 on %s (%d)", row, hostIf, idx)
		}
		if row.HostPort == 5353 && (row.HostIP != uplinkIP4.String() || row.Protocol != "udp" || row.PodIP != p4.String() || row.ContainerPort != 53) {
			t.Errorf("row %+v: want %s:5353/udp -> %s:53", row, uplinkIP4, p4)
		}
	}
	table := string(dump("hostports"))
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "HOST IP") || !strings.Contains(table, "default/web-0") {
		t.Errorf("hostports table:\n%s", table)
	}

	var ct inspect.CTDump
	js = dump("ct", "-o", "json")
	if err := json.Unmarshal(js, &ct); err != nil {
		t.Fatalf("decode: %v\n%s", err, js)
	}
	var nat, sock int
	for _, f := range ct.Flows {
		switch f.Kind {
		case "nat":
			nat++
			if !strings.HasPrefix(f.Client, remoteIP4.String()+":") || f.Interface != hostIf {
				t.Errorf("nat flow %+v: want a client at %s and interface %s", f, remoteIP4, hostIf)
			}
		case "socket":
			sock++
			if f.Dialled != "127.0.0.1:8080" || f.Pod != hp(p4, 80) {
				t.Errorf("socket entry %+v: want 127.0.0.1:8080 -> %s", f, hp(p4, 80))
			}
		}
	}
	if nat < 2 || sock < 1 {
		t.Errorf("ct dump has %d nat flows and %d sockets, want >= 2 and >= 1:\n%s", nat, sock, js)
	}
	if ct.Counters["dnat_uplink"] == 0 || ct.Counters["sock_rewrite"] == 0 {
		t.Errorf("counters %v", ct.Counters)
	}
	table = string(dump("ct"))
	if !strings.HasPrefix(table, "KIND") || !strings.Contains(table, hp(uplinkIP4, 5353)) || !strings.Contains(table, "counters:") {
		t.Errorf("ct table:\n%s", table)
	}
	e.MustDel(p, "web")
	e.AssertNoHostPorts()
}

// TestHostPortNodeFlowsKept: the node's own connections whose local port
// happens to be a hostPort number keep their return traffic (TCP: only a
// SYN opens a translated flow; UDP: a connected node socket owns its flow),
// while new clients on that port still reach the pod.
func TestHostPortNodeFlowsKept(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	p := e.NewPod()
	e.MustAddHP(p, "web", testenv.PM{HostPort: 7100, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 7100, ContainerPort: 80, Protocol: "udp"})
	serve(t, p, 80, "web")
	serve(t, e.remote, 5000, "remote")

	// TCP from the node's port 7100 to the remote server.
	err := e.Node.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: uplinkIP4, Port: 7100}}
		c, err := d.Dial("tcp", hp(remoteIP4, 5000))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "remote ") {
			return fmt.Errorf("answer %q, %v", line, err)
		}
		return nil
	})
	if err != nil {
		t.Errorf("node TCP connection from local port 7100 (a hostPort): %v", err)
	}
	// UDP, connected, from the node's port 7100.
	err = e.Node.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: uplinkIP4, Port: 7100}, &net.UDPAddr{IP: remoteIP4, Port: 5000})
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 256)
		for try := 0; try < 3; try++ {
			c.Write([]byte("q"))
			c.SetReadDeadline(time.Now().Add(time.Second))
			n, err := c.Read(buf)
			if err == nil && strings.HasPrefix(string(buf[:n]), "remote ") {
				return nil
			}
		}
		return fmt.Errorf("no answer")
	})
	if err != nil {
		t.Errorf("node connected UDP socket on local port 7100 (a hostPort): %v", err)
	}
	// Everyone else still reaches the pod.
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 7100), "web")
	expectServer(t, e.remote, "udp", hp(uplinkIP4, 7100), "web")
	e.MustDel(p, "web")
	e.AssertNoHostPorts()
}

// TestHostPortAgent: `ebpf-agent run` sets up the node-level hooks before any
// ADD (the plugin then finds them in place), and follows the node's
// addresses: one added later is a hostPort address within moments.
func TestHostPortAgent(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	var (
		cmd  *exec.Cmd
		logs bytes.Buffer
		mu   sync.Mutex
	)
	err := e.InNode(func() error {
		cmd = exec.Command(testenv.BinDir+"/ebpf-agent", "run", "--pin-dir", e.PinDir)
		w := &lockedWriter{mu: &mu, w: &logs}
		cmd.Stdout, cmd.Stderr = w, w
		return cmd.Start()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(unix.SIGTERM)
		cmd.Wait()
	})
	agentLog := func() string { mu.Lock(); defer mu.Unlock(); return logs.String() }
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s; agent log:\n%s", what, agentLog())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("agent sets up the hostPort hooks", func() bool { return strings.Contains(agentLog(), "node hooks (start): cgroup") })
	// status shows the node hooks the agent pinned: socket hooks on the
	// cgroup root, the uplink programs on uplink0.
	out, err := e.AgentCmd("status", "-o", "json", "--pin-dir", e.PinDir)
	var st inspect.StatusReport
	if jerr := json.Unmarshal([]byte(out), &st); jerr != nil {
		t.Fatalf("status: %v, %v\n%s", err, jerr, out)
	}
	for _, n := range []string{"cgroup_connect4", "cgroup_getpeername6", "uplink_uplink0", "uplink-egress_uplink0"} {
		if !slices.Contains(st.Attachments.NodeHooks, n) {
			t.Errorf("status does not show the node hook %s the agent pinned: %v", n, st.Attachments.NodeHooks)
		}
	}

	p := e.NewPod()
	e.MustAddHP(p, "web", testenv.PM{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	serve(t, p, 80, "web")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "web")
	expectServer(t, e.Node, "tcp", "127.0.0.1:8080", "web")

	extra := net.ParseIP("198.51.100.9").To4()
	err = e.InNode(func() error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr(extra.String() + "/24")
		return netlink.AddrAdd(l, a)
	})
	if err != nil {
		t.Fatal(err)
	}
	m := e.Maps()
	waitFor("agent adds the new address to cni_node_ips", func() bool {
		ips, _ := m.NodeIPs()
		_, ok := ips[extra.String()]
		return ok
	})
	expectServer(t, e.remote, "tcp", hp(extra, 8080), "web")
	e.MustDel(p, "web")
	e.AssertNoHostPorts()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
