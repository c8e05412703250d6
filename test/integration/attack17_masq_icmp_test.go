// Attack (round 14 hostile review, attack17) on masquerade replies and ICMP
// errors arriving on the uplink next to hostPorts (docs/masquerade.md, "With
// hostPorts", "ICMP errors"; docs/hostport.md, "ICMP errors"): one node port
// that is both a masqueraded flow's and a hostPort's.

package integration

import (
	"encoding/binary"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a17Srv is a UDP socket on ip:port in netns recording, by payload, where
// each datagram came from.
type a17Srv struct {
	c    *net.UDPConn
	seen chan [2]string
}

func a17Listen(t *testing.T, netns ns.NetNS, ip net.IP, port int) *a17Srv {
	t.Helper()
	s := &a17Srv{seen: make(chan [2]string, 64)}
	must(t, netns.Do(func(ns.NetNS) error {
		var err error
		s.c, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
		return err
	}))
	t.Cleanup(func() { s.c.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := s.c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			s.seen <- [2]string{string(buf[:n]), from.String()}
		}
	}()
	return s
}

// got returns every payload that came within d.
func (s *a17Srv) got(d time.Duration) []string {
	var out []string
	end := time.After(d)
	for {
		select {
		case x := <-s.seen:
			out = append(out, x[0])
		case <-end:
			return out
		}
	}
}

// from waits up to d for payload and returns its source as a UDP address.
func (s *a17Srv) from(payload string, d time.Duration) *net.UDPAddr {
	end := time.After(d)
	for {
		select {
		case x := <-s.seen:
			if x[0] == payload {
				ua, _ := net.ResolveUDPAddr("udp", x[1])
				return ua
			}
		case <-end:
			return nil
		}
	}
}

// a17Echo answers each datagram to port (family fam) in netns with "<peer> <payload>".
func a17Echo(t *testing.T, netns ns.NetNS, fam string, port int) {
	t.Helper()
	var pc *net.UDPConn
	must(t, netns.Do(func(ns.NetNS) error {
		var err error
		pc, err = net.ListenUDP(fam, &net.UDPAddr{Port: port})
		return err
	}))
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFromUDP(buf)
			if err != nil {
				return
			}
			pc.WriteToUDP([]byte(from.String()+" "+string(buf[:n])), from)
		}
	}()
}

// a17ICMPErr is an ICMP(v6) error quoting a UDP datagram src:sport ->
// dst:dport: "unreach" (port unreachable) or "big" (fragmentation needed /
// packet too big, MTU 1280). The ICMPv6 checksum is the kernel's.
func a17ICMPErr(kind string, src net.IP, sport int, dst net.IP, dport int) []byte {
	q := quotedPacket(src, dst, syscall.IPPROTO_UDP, 8)
	udp := q[len(q)-8:]
	binary.BigEndian.PutUint16(udp[0:], uint16(sport))
	binary.BigEndian.PutUint16(udp[2:], uint16(dport))
	binary.BigEndian.PutUint16(udp[4:], 8)
	var h []byte
	switch {
	case src.To4() != nil && kind == "unreach":
		h = []byte{3, 3, 0, 0, 0, 0, 0, 0}
	case src.To4() != nil:
		h = []byte{3, 4, 0, 0, 0, 0, 0x05, 0x00}
	case kind == "unreach":
		h = []byte{1, 4, 0, 0, 0, 0, 0, 0}
	default:
		h = []byte{2, 0, 0, 0, 0, 0, 0x05, 0x00}
	}
	m := append(h, q...)
	if src.To4() != nil {
		binary.BigEndian.PutUint16(m[2:], csum16(m))
	}
	return m
}

// a17ICMPIn is the number of ICMP errors of kind the stack of netns took in.
func a17ICMPIn(t *testing.T, netns ns.NetNS, v6 bool, kind string) int {
	switch {
	case !v6:
		return a16Snmp(t, netns, "snmp", "Icmp:InDestUnreachs")
	case kind == "unreach":
		return a16Snmp(t, netns, "snmp6", "Icmp6InDestUnreachs")
	}
	return a16Snmp(t, netns, "snmp6", "Icmp6InPktTooBigs")
}

func TestAttack17MasqICMPBesideHostPort4(t *testing.T) { a17ICMPBesideHostPort(t, false) }
func TestAttack17MasqICMPBesideHostPort6(t *testing.T) { a17ICMPBesideHostPort(t, true) }

// a17ICMPBesideHostPort: pod x's UDP flow to the outside server S leaves
// from node port P. Forged datagrams to node:P from other sources (another
// port of S's address, the gateway's address, S's port from another
// address) must not reach x. Then pod y takes hostPort P/udp, and a client
// C talks to y through it: node:P now carries x's flow (to S) and y's (to
// C). ICMP errors (port unreachable, frag needed / packet too big) quoting
// node:P -> S must reach x only; quoting node:P -> C, y only; quoting node:P
// -> an address and port of no flow, neither x (no flow of its) nor y.
// Finally both flows still work.
func a17ICMPBesideHostPort(t *testing.T, v6 bool) {
	t.Parallel()
	lab := newMasqLab(t)
	node, srvIP, gw, fam := labNodeA, outsideIP, labGW, "udp4"
	rng, sp, cp := "62900-62931", 7500, 7501
	if v6 {
		node, srvIP, gw, fam = labNodeA6, outsideIP6, labGW6, "udp6"
		rng, sp, cp = "62940-62971", 7510, 7511
	}
	lab.a.Extra["ipMasqPortRange"] = rng
	srv := a17Listen(t, lab.out, srvIP, sp)
	cli := a17Listen(t, lab.out, srvIP, cp)
	x, _ := lab.a.RunPod("a17ix" + fam[3:])
	var xc *net.UDPConn // unconnected: it would take a datagram from anyone
	must(t, x.Do(func(ns.NetNS) error {
		var err error
		xc, err = net.ListenUDP(fam, &net.UDPAddr{Port: 45010})
		return err
	}))
	t.Cleanup(func() { xc.Close() })
	toX := func(d time.Duration) []string {
		var out []string
		buf := make([]byte, 512)
		xc.SetReadDeadline(time.Now().Add(d))
		for {
			n, from, err := xc.ReadFromUDP(buf)
			if err != nil {
				return out
			}
			out = append(out, string(buf[:n])+" from "+from.String())
		}
	}
	xc.WriteToUDP([]byte("open"), &net.UDPAddr{IP: srvIP, Port: sp})
	ua := srv.from("open", 2*time.Second)
	if ua == nil || !ua.IP.Equal(node) {
		t.Fatalf("the server saw x's flow from %v, want the node %v", ua, node)
	}
	P := ua.Port
	srv.c.WriteToUDP([]byte("control"), ua)
	if got := toX(time.Second); len(got) != 1 || !strings.HasPrefix(got[0], "control") {
		t.Fatalf("control: the server's reply to node:%d reached x as %q", P, got)
	}
	// Forged replies: not x's flow, whatever the source.
	gwSock := a17Listen(t, lab.out, srvIP, sp+100)
	for _, f := range []struct {
		from *a17Srv
		ip   net.IP
		tag  string
	}{{cli, srvIP, "S's address, another port"}, {gwSock, srvIP, "S's address, port+100"}} {
		f.from.c.WriteToUDP([]byte("forged "+f.tag), &net.UDPAddr{IP: node, Port: P})
	}
	must(t, lab.out.Do(func(ns.NetNS) error {
		c, err := net.DialUDP(fam, &net.UDPAddr{IP: gw, Port: sp}, &net.UDPAddr{IP: node, Port: P})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("forged from the gateway's address, S's port"))
		return err
	}))
	if got := toX(time.Second); len(got) > 0 {
		t.Errorf("datagrams to node:%d from sources of no flow reached pod x: %q", P, got)
	}
	y := lab.a.NewPod()
	lab.a.MustAddHP(y, "a17iy"+fam[3:], testenv.PM{HostPort: P, ContainerPort: 90, Protocol: "udp"})
	a17Echo(t, y, fam, 90)
	cli.c.WriteToUDP([]byte("hello y"), &net.UDPAddr{IP: node, Port: P})
	if got := cli.got(time.Second); len(got) != 1 || !strings.HasSuffix(got[0], " hello y") {
		t.Fatalf("control: client C through hostPort %d to y got %q (y's stack took in %d datagrams, sent %d; x took in %q)", P, got, a16Snmp(t, y, "snmp6", "Udp6InDatagrams")+a16Snmp(t, y, "snmp", "Udp:InDatagrams"), a16Snmp(t, y, "snmp6", "Udp6OutDatagrams")+a16Snmp(t, y, "snmp", "Udp:OutDatagrams"), toX(200*time.Millisecond))
	}
	for _, kind := range []string{"unreach", "big"} {
		cases := []struct {
			to     net.IP
			port   int
			wantX  bool
			wantY  bool
			what   string
			strict bool
		}{
			{srvIP, sp, true, false, "x's masqueraded flow (node:P -> S)", true},
			{srvIP, cp, false, true, "y's hostPort flow (node:P -> C)", true},
			{gw, 7777, false, false, "no flow (node:P -> gateway:7777)", false},
		}
		for _, c := range cases {
			x0, y0 := a17ICMPIn(t, x, v6, kind), a17ICMPIn(t, y, v6, kind)
			sendICMP(t, lab.out, node, a17ICMPErr(kind, node, P, c.to, c.port), 1)
			time.Sleep(300 * time.Millisecond)
			dx, dy := a17ICMPIn(t, x, v6, kind)-x0, a17ICMPIn(t, y, v6, kind)-y0
			t.Logf("%s ICMP %s quoting %s: x took in %d, y %d", fam, kind, c.what, dx, dy)
			if (dx > 0) != c.wantX || (c.strict && (dy > 0) != c.wantY) {
				t.Errorf("%s ICMP %s quoting %s (node port %d, x's flow and y's hostPort): x took in %d, y %d; want x %v, y %v", fam, kind, c.what, P, dx, dy, c.wantX, c.wantY)
			}
		}
	}
	srv.c.WriteToUDP([]byte("after"), ua)
	if got := toX(time.Second); len(got) != 1 || !strings.HasPrefix(got[0], "after") {
		t.Errorf("after the ICMP errors the server's reply to node:%d reached x as %q", P, got)
	}
	cli.c.WriteToUDP([]byte("again y"), &net.UDPAddr{IP: node, Port: P})
	if got := cli.got(time.Second); len(got) != 1 || !strings.HasSuffix(got[0], " again y") {
		t.Errorf("after the ICMP errors client C through hostPort %d got %q", P, got)
	}
}
