package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/cni"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
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
	*env
	remote ns.NetNS
}

func newHPEnv(t *testing.T) *hpEnv {
	t.Helper()
	e := newEnv(t)
	e.extra = map[string]any{"capabilities": map[string]bool{"portMappings": true}}
	h := &hpEnv{env: e}
	r, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create remote netns: %v", err)
	}
	h.remote = r
	t.Cleanup(func() {
		r.Close()
		testutils.UnmountNS(r)
	})
	addr := func(l netlink.Link, cidr string) error {
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			return err
		}
		a.Flags = unix.IFA_F_NODAD
		return netlink.AddrAdd(l, a)
	}
	err = e.inNode(func() error {
		veth := &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: "uplink0"},
			PeerName:  "eth0", PeerNamespace: netlink.NsFd(int(r.Fd())),
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
		t.Fatalf("node uplink: %v", err)
	}
	err = r.Do(func(ns.NetNS) error {
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
		t.Fatalf("remote netns: %v", err)
	}
	return h
}

// pm is one portMappings entry as a runtime passes it.
type pm struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

func (e *env) rtHP(pod ns.NetNS, containerID string, pms []pm) *libcni.RuntimeConf {
	rt := e.rt(pod, containerID, "eth0")
	if pms != nil {
		rt.CapabilityArgs = map[string]any{"portMappings": pms}
	}
	return rt
}

// addHP adds a pod with port mappings at CNI 1.0.0 (what containerd sends).
func (e *env) addHP(pod ns.NetNS, containerID string, pms ...pm) (*current.Result, error) {
	var res types.Result
	err := e.inNode(func() error {
		var err error
		res, err = e.cni.AddNetworkList(context.Background(), e.confList("1.0.0"), e.rtHP(pod, containerID, pms))
		return err
	})
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func (e *env) mustAddHP(pod ns.NetNS, containerID string, pms ...pm) *current.Result {
	e.t.Helper()
	e.cleanupDel(pod, containerID)
	r, err := e.addHP(pod, containerID, pms...)
	if err != nil {
		e.t.Fatalf("ADD %s with %+v: %v", containerID, pms, err)
	}
	return r
}

func (e *env) checkHP(pod ns.NetNS, containerID string, pms ...pm) error {
	return e.inNode(func() error {
		return e.cni.CheckNetworkList(context.Background(), e.confList("1.0.0"), e.rtHP(pod, containerID, pms))
	})
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

// hostPortLeftovers lists hostPort state of the env that DEL should remove.
func (e *env) hostPortLeftovers() []string {
	m, err := maps.Open(e.pinDir)
	if err != nil {
		return nil
	}
	defer m.Close()
	var out []string
	hps, _ := m.ListHostPorts()
	for _, h := range hps {
		out = append(out, "hostport "+h.Listen())
	}
	flows, _ := m.ListCT()
	for _, f := range flows {
		out = append(out, fmt.Sprintf("ct %s -> %s -> %s", f.Client, f.Dialled, f.Pod))
	}
	socks, _ := m.ListSockRNAT()
	for _, s := range socks {
		out = append(out, fmt.Sprintf("sock rnat %d %s -> %s", s.Cookie, s.Dialled, s.Pod))
	}
	return out
}

func (e *env) assertNoHostPorts() {
	e.t.Helper()
	if l := e.hostPortLeftovers(); len(l) > 0 {
		e.t.Fatalf("hostPort state left behind:\n  %s", strings.Join(l, "\n  "))
	}
}

var _ = bytes.Equal
var _ = json.Marshal
var _ sync.Mutex
var _ = agent.Endpoints
var _ = datapath.NodeHookDir

// ---- tests -----------------------------------------------------------------

// TestHostPortRemote: a remote host reaches a pod through every node address
// (uplink and lo) : hostPort, over TCP and UDP, IPv4 and IPv6, and sees the
// replies come from the address it dialled. The pod sees the client.
func TestHostPortRemote(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	p := e.newPod()
	e.mustAddHP(p, "web", pm{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, pm{HostPort: 8080, ContainerPort: 80, Protocol: "UDP"})
	serve(t, p, 80, "web")

	for _, proto := range []string{"tcp", "udp"} {
		for _, ip := range []net.IP{uplinkIP4, nodeIP4, uplinkIP6, nodeIP6} {
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

	e.mustDel(p, "web")
	e.assertClean()
	e.assertNoHostPorts()
}

// TestHostPortFromNode: processes in the node's netns reach a hostPort on a
// node address, 127.0.0.1 and ::1 (cgroup socket hooks, no route_localnet),
// see the address they dialled (getpeername, UDP reply source), and other
// namespaces of the machine are not affected by the root-cgroup hooks.
func TestHostPortFromNode(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	p := e.newPod()
	e.mustAddHP(p, "web", pm{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, pm{HostPort: 8080, ContainerPort: 80, Protocol: "udp"})
	serve(t, p, 80, "web")

	for _, proto := range []string{"tcp", "udp"} {
		for _, ip := range []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), nodeIP4, nodeIP6, uplinkIP4, uplinkIP6} {
			expectServer(t, e.node, proto, hp(ip, 8080), "web")
		}
	}
	// A connected UDP socket (connect + write/read) works too.
	err := e.node.Do(func(ns.NetNS) error {
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

	e.mustDel(p, "web")
	for _, proto := range []string{"tcp", "udp"} {
		expectNoServer(t, e.node, proto, "127.0.0.1:8080")
	}
	e.assertClean()
	e.assertNoHostPorts()
}

// TestHostPortHairpin: a pod reaches its own hostPort and another pod's
// through a node address, TCP and UDP, IPv4 and IPv6. Reaching itself, it
// is SNATed to the dialled address (it must not see its own address as the
// source); reaching another pod it is seen as itself.
func TestHostPortHairpin(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	a, b := e.newPod(), e.newPod()
	ra := e.mustAddHP(a, "pod-a", pm{HostPort: 7001, ContainerPort: 80, Protocol: "tcp"}, pm{HostPort: 7001, ContainerPort: 80, Protocol: "udp"})
	e.mustAddHP(b, "pod-b", pm{HostPort: 7002, ContainerPort: 80, Protocol: "tcp"}, pm{HostPort: 7002, ContainerPort: 80, Protocol: "udp"})
	serve(t, a, 80, "pod-a")
	serve(t, b, 80, "pod-b")
	a4, a6 := podIPs(t, ra)

	for _, proto := range []string{"tcp", "udp"} {
		for _, ip := range []net.IP{nodeIP4, uplinkIP4, nodeIP6, uplinkIP6} {
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
	m := e.maps()
	stats, err := m.HostPortStats()
	if err != nil {
		t.Fatal(err)
	}
	if stats["dnat_hairpin"] == 0 || stats["reply"] == 0 {
		t.Errorf("hostPort counters %v: want hairpin DNATs and translated replies", stats)
	}
	e.mustDel(a, "pod-a")
	e.mustDel(b, "pod-b")
	e.assertClean()
	e.assertNoHostPorts()
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
	add := func(name string, pms ...pm) {
		p := e.newPod()
		pods[name] = p
		e.mustAddHP(p, name, pms...)
		serve(t, p, 80, name)
	}
	// Conformance: 127.0.0.1/tcp, node IP/tcp, node IP/udp.
	add("local", pm{HostPort: 9000, ContainerPort: 80, Protocol: "tcp", HostIP: "127.0.0.1"})
	add("node-tcp", pm{HostPort: 9000, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP4.String()})
	add("node-udp", pm{HostPort: 9000, ContainerPort: 80, Protocol: "udp", HostIP: uplinkIP4.String()})
	// IPv6: the same port on two node addresses, two pods.
	add("v6-uplink", pm{HostPort: 9001, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP6.String()}, pm{HostPort: 9001, ContainerPort: 80, Protocol: "udp", HostIP: uplinkIP6.String()})
	add("v6-lo", pm{HostPort: 9001, ContainerPort: 80, Protocol: "tcp", HostIP: nodeIP6.String()}, pm{HostPort: 9001, ContainerPort: 80, Protocol: "udp", HostIP: nodeIP6.String()})
	// Wildcard and specific on one port: the specific one wins where it applies.
	add("any", pm{HostPort: 9002, ContainerPort: 80, Protocol: "tcp"})
	add("specific", pm{HostPort: 9002, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP4.String()})
	// 0.0.0.0 is the IPv4 wildcard only.
	add("any4", pm{HostPort: 9003, ContainerPort: 80, Protocol: "tcp", HostIP: "0.0.0.0"})

	expectServer(t, e.node, "tcp", "127.0.0.1:9000", "local")
	expectServer(t, e.node, "tcp", hp(uplinkIP4, 9000), "node-tcp")
	expectServer(t, e.node, "udp", hp(uplinkIP4, 9000), "node-udp")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 9000), "node-tcp")
	expectServer(t, e.remote, "udp", hp(uplinkIP4, 9000), "node-udp")
	expectNoServer(t, e.remote, "tcp", hp(nodeIP4, 9000))
	expectNoServer(t, e.node, "udp", "127.0.0.1:9000")
	for _, from := range []ns.NetNS{e.remote, e.node} {
		for _, proto := range []string{"tcp", "udp"} {
			expectServer(t, from, proto, hp(uplinkIP6, 9001), "v6-uplink")
			expectServer(t, from, proto, hp(nodeIP6, 9001), "v6-lo")
		}
	}
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 9002), "specific")
	expectServer(t, e.remote, "tcp", hp(nodeIP4, 9002), "any")
	expectServer(t, e.remote, "tcp", hp(uplinkIP6, 9002), "any")
	expectServer(t, e.node, "tcp", "127.0.0.1:9002", "any")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 9003), "any4")
	expectNoServer(t, e.remote, "tcp", hp(uplinkIP6, 9003))

	for name, p := range pods {
		e.mustDel(p, name)
	}
	e.assertClean()
	e.assertNoHostPorts()
}

// TestHostPortTCPAndUDP: TCP and UDP on the same port number lead to
// different pods at once, and each keeps working while the other is used.
func TestHostPortTCPAndUDP(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	tp, up := e.newPod(), e.newPod()
	e.mustAddHP(tp, "tcp-pod", pm{HostPort: 5353, ContainerPort: 80, Protocol: "tcp"})
	e.mustAddHP(up, "udp-pod", pm{HostPort: 5353, ContainerPort: 80, Protocol: "udp"})
	serve(t, tp, 80, "tcp-pod")
	serve(t, up, 80, "udp-pod")
	for _, from := range []ns.NetNS{e.remote, e.node} {
		for _, ip := range []net.IP{uplinkIP4, uplinkIP6} {
			expectServer(t, from, "tcp", hp(ip, 5353), "tcp-pod")
			expectServer(t, from, "udp", hp(ip, 5353), "udp-pod")
		}
	}
	e.mustDel(tp, "tcp-pod")
	expectNoServer(t, e.remote, "tcp", hp(uplinkIP4, 5353))
	expectServer(t, e.remote, "udp", hp(uplinkIP4, 5353), "udp-pod")
	e.mustDel(up, "udp-pod")
	e.assertClean()
	e.assertNoHostPorts()
}

// TestHostPortNoRules: ADD, traffic and DEL leave the iptables, ip6tables and
// nftables rulesets of the node and of the host exactly as they were.
func TestHostPortNoRules(t *testing.T) {
	e := newHPEnv(t) // not parallel: the host's ruleset is shared
	nodeBefore, hostBefore := rulesets(t, e.node), rulesets(t, nil)
	p := e.newPod()
	e.mustAddHP(p, "web", pm{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, pm{HostPort: 8080, ContainerPort: 80, Protocol: "udp"},
		pm{HostPort: 8443, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP6.String()})
	serve(t, p, 80, "web")
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "web")
	expectServer(t, e.remote, "udp", hp(uplinkIP6, 8080), "web")
	expectServer(t, e.remote, "tcp", hp(uplinkIP6, 8443), "web")
	expectServer(t, e.node, "tcp", "127.0.0.1:8080", "web")
	expectServer(t, p, "tcp", hp(nodeIP4, 8080), "web")
	if got := rulesets(t, e.node); got != nodeBefore {
		t.Errorf("ADD changed the node's ruleset:\nbefore:\n%s\nafter:\n%s", nodeBefore, got)
	}
	if got := rulesets(t, nil); got != hostBefore {
		t.Errorf("ADD changed the host's ruleset:\nbefore:\n%s\nafter:\n%s", hostBefore, got)
	}
	e.mustDel(p, "web")
	if got := rulesets(t, e.node); got != nodeBefore {
		t.Errorf("DEL changed the node's ruleset:\nbefore:\n%s\nafter:\n%s", nodeBefore, got)
	}
	if got := rulesets(t, nil); got != hostBefore {
		t.Errorf("DEL changed the host's ruleset:\nbefore:\n%s\nafter:\n%s", hostBefore, got)
	}
	e.assertClean()
	e.assertNoHostPorts()
}

// TestHostPortConflict: an ADD asking for a hostPort another pod holds fails
// with error 7 naming the entry, and leaves nothing: no veth, no IPAM
// reservation, no record, none of its other mappings. Of pods racing for one
// hostPort, exactly one wins.
func TestHostPortConflict(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	owner := e.newPod()
	e.mustAddHP(owner, "owner", pm{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	serve(t, owner, 80, "owner")

	p := e.newPod()
	e.cleanupDel(p, "late")
	_, err := e.addHP(p, "late", pm{HostPort: 9090, ContainerPort: 80, Protocol: "tcp"}, pm{HostPort: 8080, ContainerPort: 81, Protocol: "TCP"})
	if code := errCode(err); code != codeInvalidConfig {
		t.Fatalf("ADD of a taken hostPort: code %d (%v), want %d", code, err, codeInvalidConfig)
	}
	wantErrContains(t, "ADD of a taken hostPort", err, "runtimeConfig.portMappings[1]", "8080/tcp", "already mapped")
	late := &attachment{pod: p, id: "late", ifname: "eth0", hostIf: cni.HostIfName("late", "eth0")}
	e.assertGone(late)
	m := e.maps()
	hps, _ := m.ListHostPorts()
	for _, h := range hps {
		if h.HostPort == 9090 {
			t.Errorf("the failed ADD left its other mapping %s", h.Listen())
		}
	}
	// The owner is untouched.
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 8080), "owner")
	if err := e.checkHP(owner, "owner", pm{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}); err != nil {
		t.Errorf("CHECK of the owner after the failed ADD: %v", err)
	}
	// A wildcard mapping does not conflict with a specific one (the more
	// specific wins, as with sockets), but two on the same hostIP do.
	s := e.newPod()
	e.mustAddHP(s, "specific", pm{HostPort: 8080, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP4.String()})
	s2 := e.newPod()
	e.cleanupDel(s2, "specific-2")
	_, err = e.addHP(s2, "specific-2", pm{HostPort: 8080, ContainerPort: 80, Protocol: "tcp", HostIP: uplinkIP4.String()})
	if code := errCode(err); code != codeInvalidConfig {
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
		rp := e.newPod()
		e.cleanupDel(rp, id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.addHP(rp, id, pm{HostPort: 7777, ContainerPort: 80, Protocol: "udp"}); err == nil {
				mu.Lock()
				wins = append(wins, id)
				mu.Unlock()
			} else if errCode(err) != codeInvalidConfig {
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
