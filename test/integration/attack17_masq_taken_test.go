// Attack (round 14 hostile review, attack17) on masquerade ports already
// in use on the node when a flow starts (docs/masquerade.md, "Port
// allocation": "ports of the node's hostPorts and ports a node socket holds
// are skipped"): a hostPort bound to the node's address, one bound to
// another address of the node, a node socket bound explicitly, and a
// kube-proxy-like iptables DNAT of a node port.

package integration

import (
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

func TestAttack17MasqPortsTakenBefore4(t *testing.T) { a17PortsTakenBefore(t, false) }
func TestAttack17MasqPortsTakenBefore6(t *testing.T) { a17PortsTakenBefore(t, true) }

// a17PortsTakenBefore: an 8-port masquerade range A..A+7. Before pod x's
// flows: pod y holds hostPort A (udp and tcp) on the node's address
// (hostIP), and hostPort A+3/udp on a second address of the node's uplink;
// a node process binds node:A+1 (udp and tcp listener); an iptables DNAT
// in the node's PREROUTING sends udp to port A+2 to y:91. Then x opens UDP
// flows from source ports A..A+3 and TCP from A and A+1 (its own port is its
// first candidate) to a server outside. Each of x's flows must leave from a
// distinct node address and port that no hostPort or node socket holds (the
// source is the FIB's: the node's address, the second one deprecated), and every
// reply must reach x. After
// them, y's hostPorts and the node socket must still get their own
// clients.
func a17PortsTakenBefore(t *testing.T, v6 bool) {
	t.Parallel()
	lab := newMasqLab(t)
	node, srvIP, fam, tcpFam, ipt, plen := labNodeA, outsideIP, "udp4", "tcp4", "iptables", "/24"
	second := net.ParseIP("203.0.113.11").To4()
	A, sp := 63000, 7520
	if v6 {
		node, srvIP, fam, tcpFam, ipt, plen = labNodeA6, outsideIP6, "udp6", "tcp6", "ip6tables", "/64"
		second = net.ParseIP("fd00:203::11")
		A, sp = 63010, 7530
	}
	lab.a.Extra["ipMasqPortRange"] = fmt.Sprintf("%d-%d", A, A+7)
	lab.a.Extra["ipMasqPodPortLimit"] = 8
	must(t, lab.a.InNode(func() error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		// Deprecated, so the node's own address stays the FIB's source
		// (IPv6 would prefer the newer) and the ports held on it matter.
		a, err := netlink.ParseAddr(second.String() + plen)
		if err != nil {
			return err
		}
		a.Flags, a.PreferedLft, a.ValidLft = unix.IFA_F_NODAD, 0, 86400
		return netlink.AddrAdd(l, a)
	}))
	udpPeerEcho(t, lab.out, srvIP, sp)
	a16Server(t, lab.out, srvIP, sp)
	x, _ := lab.a.RunPod("a17tx" + fam[3:])
	y := lab.a.NewPod()
	ry := lab.a.MustAddHP(y, "a17ty"+fam[3:],
		testenv.PM{HostPort: A, ContainerPort: 90, Protocol: "udp", HostIP: node.String()},
		testenv.PM{HostPort: A, ContainerPort: 90, Protocol: "tcp", HostIP: node.String()},
		testenv.PM{HostPort: A + 3, ContainerPort: 93, Protocol: "udp", HostIP: second.String()})
	y4, y6 := testenv.PodIPs(t, ry)
	yIP := y4
	if v6 {
		yIP = y6
	}
	a17Echo(t, y, fam, 90)
	a17Echo(t, y, fam, 93)
	var nodeU *net.UDPConn
	var nodeT net.Listener
	must(t, lab.a.Node.Do(func(ns.NetNS) error {
		var err error
		if nodeU, err = net.ListenUDP(fam, &net.UDPAddr{IP: node, Port: A + 1}); err != nil {
			return err
		}
		nodeT, err = net.Listen(tcpFam, hp(node, A+1))
		return err
	}))
	t.Cleanup(func() { nodeU.Close(); nodeT.Close() })
	must(t, lab.a.Node.Do(func(ns.NetNS) error {
		var out bytes.Buffer
		c := exec.Command(ipt, "-w", "-t", "nat", "-A", "PREROUTING", "-p", "udp", "--dport", fmt.Sprint(A+2),
			"-j", "DNAT", "--to-destination", hp(yIP, 91))
		c.Stdout, c.Stderr = &out, &out
		if err := c.Run(); err != nil {
			return fmt.Errorf("%s: %v: %s", ipt, err, out.String())
		}
		return nil
	}))
	srv := hp(srvIP, sp)
	// What holds a port of the range on which address, before x's flows.
	taken := map[string]string{
		"udp" + hp(node, A): "y's hostPort on that address", "tcp" + hp(node, A): "y's hostPort on that address",
		"udp" + hp(second, A+3): "y's hostPort on that address",
		"udp" + hp(node, A+1):   "a node socket's", "tcp" + hp(node, A+1): "a node listener's",
	}
	check := func(proto string, lport int) {
		f, err := a14Dial(x, proto, lport, srv)
		if err != nil {
			t.Errorf("%s from x's port %d: %v", proto, lport, err)
			return
		}
		t.Cleanup(func() { f.c.Close() })
		peer, echoed, err := f.ask(fmt.Sprint("q", lport))
		t.Logf("%s %s from x's port %d: the server saw %s, answered %q (%v)", fam, proto, lport, peer, echoed, err)
		if err != nil || echoed != fmt.Sprint("q", lport) {
			t.Errorf("%s %s from x's port %d: no answer reached x (server saw %s, got %q, %v)", fam, proto, lport, peer, echoed, err)
			return
		}
		h, _, _ := net.SplitHostPort(peer)
		if ip := net.ParseIP(h); !ip.Equal(node) && !ip.Equal(second) {
			t.Errorf("%s %s from x's port %d left as %s, want a node address", fam, proto, lport, peer)
		}
		if what, ok := taken[proto+peer]; ok {
			t.Errorf("%s %s from x's port %d left as %s, which is %s", fam, proto, lport, peer, what)
		}
		taken[proto+peer] = "another of x's flows"
	}
	check("udp", A)
	check("udp", A+1)
	check("udp", A+2)
	check("udp", A+3)
	check("tcp", A)
	check("tcp", A+1)
	// The ports' owners keep their own clients.
	cli := a17Listen(t, lab.out, srvIP, sp+1)
	cli.c.WriteToUDP([]byte("to-y"), &net.UDPAddr{IP: node, Port: A})
	if got := cli.got(time.Second); len(got) != 1 || !strings.HasSuffix(got[0], " to-y") {
		t.Errorf("a client to y's hostPort %s:%d/udp got %q", node, A, got)
	}
	cli.c.WriteToUDP([]byte("to-y-2nd"), &net.UDPAddr{IP: second, Port: A + 3})
	if got := cli.got(time.Second); len(got) != 1 || !strings.HasSuffix(got[0], " to-y-2nd") {
		t.Errorf("a client to y's hostPort %s:%d/udp got %q", second, A+3, got)
	}
	cli.c.WriteToUDP([]byte("to-node"), &net.UDPAddr{IP: node, Port: A + 1})
	nodeU.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 64)
	if n, _, err := nodeU.ReadFromUDP(buf); err != nil || string(buf[:n]) != "to-node" {
		t.Errorf("the node socket on %s:%d/udp got %q (%v) from a client", node, A+1, buf[:n], err)
	}
	must(t, lab.out.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout(tcpFam, hp(node, A+1), 2*time.Second)
		if err != nil {
			t.Errorf("a client to the node's listener %s:%d/tcp: %v", node, A+1, err)
			return nil
		}
		return c.Close()
	}))
}
