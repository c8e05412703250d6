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
