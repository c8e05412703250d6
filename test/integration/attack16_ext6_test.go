// Attack (round 13 hostile review, attack16) on the uplink's receive path
// walking an inbound IPv6 packet's extension headers once for masquerade
// replies and hostPorts (docs/masquerade.md, docs/hostport.md).

package integration

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a16Read reads from c until payload comes or d passes.
func a16Read(c net.Conn, payload string, d time.Duration) bool {
	buf := make([]byte, 2048)
	for end := time.Now().Add(d); time.Now().Before(end); {
		c.SetReadDeadline(end)
		n, err := c.Read(buf)
		if err != nil {
			return false
		}
		if string(buf[:n]) == payload {
			return true
		}
	}
	return false
}

var a16Chains = [][]string{nil, {"dst"}, {"hbh", "dst"}, {"rt"}, {"hbh", "dst", "rt", "dst"}}

// TestAttack16MasqReplyOnHostPort6: pod x's UDP flow to the outside
// (IPv6) leaves from node port P; then pod y is added with hostPort P/udp.
// The server's replies to node:P (plain and behind extension header chains)
// are both a masquerade reply and hostPort traffic: they belong to x's flow
// and must reach x, never y. A new client (another peer port) to node:P
// must reach y. Nothing may reach y translated wrongly (its stack's UDP
// checksum errors).
func TestAttack16MasqReplyOnHostPort6(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	lab.a.Extra["ipMasqPortRange"] = "62800-62831"
	rec := a15Record(t, lab.out, 7490)
	x, _ := lab.a.RunPod("a16bx")
	f, err := a14Dial(x, "udp", 45000, hp(outsideIP6, 7490))
	if err != nil {
		t.Fatal(err)
	}
	c := f.c
	t.Cleanup(func() { c.Close() })
	c.Write([]byte("open"))
	ua, err := net.ResolveUDPAddr("udp6", rec.from("open", 2*time.Second))
	if err != nil || !ua.IP.Equal(labNodeA6) {
		t.Fatalf("the outside saw x's flow from %v, want the node", ua)
	}
	must(t, a15SendRaw6(lab.out, labNodeA6, a15UDP6(outsideIP6, 7490, labNodeA6, ua.Port, []string{"dst"}, []byte("control")), 2))
	if !a16Read(c, "control", time.Second) {
		t.Fatalf("control: the server's reply behind a destination options header, before any hostPort, did not reach x")
	}
	y := lab.a.NewPod()
	if _, err := lab.a.AddHP(y, "a16by", testenv.PM{HostPort: ua.Port, ContainerPort: 90, Protocol: "udp"}); err != nil {
		lab.a.CleanupDel(y, "a16by")
		t.Fatalf("hostPort %d/udp on the node port of x's masqueraded flow refused: %v", ua.Port, err)
	}
	lab.a.CleanupDel(y, "a16by")
	toY := listenUDP6(t, y, 90)
	for i, kinds := range a16Chains {
		payload := fmt.Sprintf("a16-both-%d", i)
		must(t, a15SendRaw6(lab.out, labNodeA6, a15UDP6(outsideIP6, 7490, labNodeA6, ua.Port, kinds, []byte(payload)), 2))
		gotX := a16Read(c, payload, time.Second)
		gotY := toY(300 * time.Millisecond)
		t.Logf("server's reply to node:%d behind %v: x got it %v, y got %q", ua.Port, kinds, gotX, gotY)
		if !gotX || len(gotY) > 0 {
			t.Errorf("the server's reply to x's flow (node:%d, also hostPort of y) behind %v: x got it %v, y got %q; want x only", ua.Port, kinds, gotX, gotY)
		}
	}
	if n := a16Snmp(t, y, "snmp6", "Udp6InCsumErrors"); n > 0 {
		t.Errorf("pod y's stack dropped %d datagrams with bad UDP checksums: x's replies reached y translated twice (masquerade, then hostPort)", n)
	}
	for i, kinds := range a16Chains[:3] {
		payload := fmt.Sprintf("a16-new-%d", i)
		must(t, a15SendRaw6(lab.out, labNodeA6, a15UDP6(outsideIP6, 7491, labNodeA6, ua.Port, kinds, []byte(payload)), 1))
		gotY := toY(time.Second)
		want := payload + " from " + hp(outsideIP6, 7491)
		if len(gotY) != 1 || gotY[0] != want {
			t.Errorf("a new client to hostPort %d behind %v: y got %q, want %q", ua.Port, kinds, gotY, want)
		}
	}

}

// TestAttack16MasqReplyOnHostPort4: TestAttack16MasqReplyOnHostPort6's
// plain case over IPv4, the server answering from its socket.
func TestAttack16MasqReplyOnHostPort4(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	lab.a.Extra["ipMasqPortRange"] = "62840-62871"
	var srv *net.UDPConn
	must(t, lab.out.Do(func(ns.NetNS) error {
		var err error
		srv, err = net.ListenUDP("udp4", &net.UDPAddr{IP: outsideIP, Port: 7493})
		return err
	}))
	t.Cleanup(func() { srv.Close() })
	x, _ := lab.a.RunPod("a16b4x")
	f, err := a14Dial(x, "udp", 45002, hp(outsideIP, 7493))
	if err != nil {
		t.Fatal(err)
	}
	c := f.c
	t.Cleanup(func() { c.Close() })
	c.Write([]byte("open"))
	srv.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, ua, err := srv.ReadFromUDP(make([]byte, 64))
	if err != nil || !ua.IP.Equal(labNodeA) {
		t.Fatalf("the outside saw x's flow from %v, want the node", ua)
	}
	srv.WriteTo([]byte("control"), ua)
	if !a16Read(c, "control", time.Second) {
		t.Fatalf("control: the server's reply, before any hostPort, did not reach x")
	}
	y := lab.a.NewPod()
	lab.a.MustAddHP(y, "a16b4y", testenv.PM{HostPort: ua.Port, ContainerPort: 90, Protocol: "udp"})
	toY := listenUDP(t, y, "udp4", 90)
	srv.WriteTo([]byte("a16-both4"), ua)
	gotX := a16Read(c, "a16-both4", time.Second)
	gotY := toY(300 * time.Millisecond)
	csum := a16Snmp(t, y, "snmp", "Udp:InCsumErrors") + a16Snmp(t, y, "snmp", "Udp:NoPorts")
	t.Logf("IPv4: the server's reply to node:%d: x got it %v, y got %q, y's UDP checksum errors and datagrams to no socket %d; x's %d", ua.Port, gotX, gotY, csum, a16Snmp(t, x, "snmp", "Udp:InCsumErrors")+a16Snmp(t, x, "snmp", "Udp:NoPorts"))
	if !gotX || len(gotY) > 0 || csum > 0 {
		t.Errorf("the server's reply to x's flow (node:%d, also hostPort of y): x got it %v, y got %q and %d bad checksums; want x only", ua.Port, gotX, gotY, csum)
	}
}

// TestAttack16MasqTCPOnHostPort6: pod x's TCP connection to the outside
// (IPv6) leaves from node port P; then pod z is added with hostPort P/tcp.
// x's connection must keep working (its segments are replies of its flow),
// and a new client from the same server address (another port) must reach
// z's hostPort.
func TestAttack16MasqTCPOnHostPort6(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	lab.a.Extra["ipMasqPortRange"] = "62900-62931"
	x, _ := lab.a.RunPod("a16kx")
	a14Echo(t, lab.out, 7492)
	f, err := a14Dial(x, "tcp", 45001, hp(outsideIP6, 7492))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.c.Close() })
	peer, _, err := f.ask("one")
	pa, _ := net.ResolveTCPAddr("tcp6", peer)
	if err != nil || pa == nil || !pa.IP.Equal(labNodeA6) {
		t.Fatalf("x's TCP connection seen from %q (%v)", peer, err)
	}
	z := lab.a.NewPod()
	if _, err := lab.a.AddHP(z, "a16bz", testenv.PM{HostPort: pa.Port, ContainerPort: 91, Protocol: "tcp"}); err != nil {
		lab.a.CleanupDel(z, "a16bz")
		t.Fatalf("hostPort %d/tcp on the node port of x's connection refused: %v", pa.Port, err)
	}
	lab.a.CleanupDel(z, "a16bz")
	serveTCP6Opts(t, z, 91, func(int) error { return nil }, "z91")
	time.Sleep(200 * time.Millisecond)
	if p2, e, err := f.ask("two"); err != nil || e != "two" || p2 != peer {
		t.Errorf("x's TCP connection on node port %d after it became z's hostPort: %q %q %v", pa.Port, p2, e, err)
	}
	if line, err := readLineTCP6Opts(lab.out, hp(labNodeA6, pa.Port), func(int) error { return nil }); err != nil || strings.TrimSpace(line) != "z91" {
		t.Errorf("a new client from the server's address to hostPort %d/tcp (also the node port of x's connection to that server's port 7492): %q, %v; want z's answer", pa.Port, line, err)
	}
	if n := a16Snmp(t, z, "snmp", "Tcp:InCsumErrors"); n > 0 {
		t.Errorf("pod z's stack dropped %d TCP segments with bad checksums", n)
	}
}

// a16Snmp reads counter key ("Udp6InCsumErrors" from snmp6, "Tcp:InCsumErrors"
// from snmp) of netns.
func a16Snmp(t *testing.T, netns ns.NetNS, file, key string) int {
	t.Helper()
	n := -1
	must(t, netns.Do(func(ns.NetNS) error {
		b, err := os.ReadFile("/proc/thread-self/net/" + file)
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			f := strings.Fields(l)
			if len(f) == 2 && f[0] == key {
				n, _ = strconv.Atoi(f[1])
			}
			// snmp: a header line "Tcp: names..." then "Tcp: values..."
			if pfx, name, ok := strings.Cut(key, ":"); ok && len(f) > 1 && f[0] == pfx+":" && i+1 < len(lines) {
				v := strings.Fields(lines[i+1])
				for j := range f {
					if f[j] == name && j < len(v) && n < 0 {
						n, _ = strconv.Atoi(v[j])
					}
				}
			}
		}
		return nil
	}))
	return n
}

// TestAttack16HostPortTCP6ExtHeaders: a TCP hostPort over IPv6, the
// client's segments carrying a hop-by-hop header, a destination options
// header, or both (socket options, so every segment of the connection has
// them), and a pod whose own segments carry both. docs/hostport.md: "Not
// translated: ... TCP behind IPv6 extension headers": those connections
// fail (logged); the plain one must work, and nothing may reach the pods
// translated wrongly (their stacks' TCP checksum errors).
func TestAttack16HostPortTCP6ExtHeaders(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	y, z := lab.a.NewPod(), lab.a.NewPod()
	lab.a.MustAddHP(y, "a16ty", testenv.PM{HostPort: 8093, ContainerPort: 93, Protocol: "tcp"})
	lab.a.MustAddHP(z, "a16tz", testenv.PM{HostPort: 8094, ContainerPort: 94, Protocol: "tcp"})
	serveTCP6Opts(t, y, 93, func(int) error { return nil }, "y93")
	serveTCP6Opts(t, z, 94, ip6OptsSock(true, true), "z94")
	if line, err := readLineTCP6Opts(lab.out, hp(labNodeA6, 8093), func(int) error { return nil }); err != nil || strings.TrimSpace(line) != "y93" {
		t.Errorf("plain TCP over IPv6 to hostPort 8093: %q, %v", line, err)
	}
	for _, c := range []struct {
		what  string
		port  int
		setup func(int) error
		want  string
	}{
		{"hop-by-hop", 8093, ip6OptsSock(true, false), "y93"},
		{"destination options", 8093, ip6OptsSock(false, true), "y93"},
		{"both", 8093, ip6OptsSock(true, true), "y93"},
		{"the pod's segments with both", 8094, func(int) error { return nil }, "z94"},
		{"both ways both", 8094, ip6OptsSock(true, true), "z94"},
	} {
		line, err := readLineTCP6Opts(lab.out, hp(labNodeA6, c.port), c.setup)
		t.Logf("%s to hostPort %d (documented untranslated): %q %v", c.what, c.port, line, err)
		if err == nil && strings.TrimSpace(line) != c.want {
			t.Errorf("TCP over IPv6 to hostPort %d, %s: got %q, want %q or nothing", c.port, c.what, line, c.want)
		}
	}
	for n, p := range map[string]ns.NetNS{"y": y, "z": z} {
		if k := a16Snmp(t, p, "snmp", "Tcp:InCsumErrors"); k != 0 {
			t.Errorf("pod %s's stack counted %d TCP checksum errors: segments reached it translated wrongly", n, k)
		}
	}
}

// TestAttack16HostPortNodeSocketExt6: hostPort 8095/udp to pod w. A node
// socket connected from the node's [addr]:8095 to the outside's 7495 owns
// that exact flow ("a connected node socket owning the exact flow keeps
// it"): the outside's replies, plain and behind extension header chains
// (five headers too, past the walk's four), must reach the node's socket,
// never w. A new client behind five headers may reach w only intact.
func TestAttack16HostPortNodeSocketExt6(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	w := lab.a.NewPod()
	lab.a.MustAddHP(w, "a16nw", testenv.PM{HostPort: 8095, ContainerPort: 95, Protocol: "udp"})
	toW := listenUDP6(t, w, 95)
	rec := a15Record(t, lab.out, 7495)
	var c *net.UDPConn
	must(t, lab.a.InNode(func() error {
		cc, err := net.DialUDP("udp6", &net.UDPAddr{IP: labNodeA6, Port: 8095}, &net.UDPAddr{IP: outsideIP6, Port: 7495})
		c = cc
		return err
	}))
	t.Cleanup(func() { c.Close() })
	c.Write([]byte("node"))
	if from := rec.from("node", 2*time.Second); from != hp(labNodeA6, 8095) {
		t.Fatalf("the node socket's datagram seen from %q", from)
	}
	chains := append(append([][]string{}, a16Chains...), []string{"dst", "dst", "dst", "dst", "dst"})
	for i, kinds := range chains {
		payload := fmt.Sprintf("a16-node-%d", i)
		must(t, a15SendRaw6(lab.out, labNodeA6, a15UDP6(outsideIP6, 7495, labNodeA6, 8095, kinds, []byte(payload)), 2))
		gotNode := a16Read(c, payload, time.Second)
		gotW := toW(300 * time.Millisecond)
		t.Logf("reply to the node socket behind %v: node got it %v, w got %q", kinds, gotNode, gotW)
		if !gotNode || len(gotW) > 0 {
			t.Errorf("the outside's reply to the node's connected socket [%s]:8095 behind %v: node got it %v, pod w got %q; want the node only", labNodeA6, kinds, gotNode, gotW)
		}
	}
	payload := "a16-five"
	must(t, a15SendRaw6(lab.out, labNodeA6, a15UDP6(outsideIP6, 7496, labNodeA6, 8095, chains[len(chains)-1], []byte(payload)), 1))
	gotW := toW(time.Second)
	t.Logf("a new client behind five headers: w got %q", gotW)
	for _, g := range gotW {
		if g != payload+" from "+hp(outsideIP6, 7496) {
			t.Errorf("a new client behind five headers to hostPort 8095: w got %q", g)
		}
	}
}

// TestAttack16MasqReplyRoutingSegmentsLeft: pod x's UDP flow to the outside
// (IPv6) on node port P. The outside sends to node:P, from the server's
// address and port, a datagram behind a type 0 routing header with
// segments left 1: the node is a waypoint, not the destination (RFC 8200
// 4.4; Linux answers a parameter problem), so it is no reply of x's flow.
// As for a hostPort (TestHostPortUDP6RoutingHeaderSegmentsLeft), x must not
// get it and the outside's parameter problem must come from the node, not
// from x's address.
func TestAttack16MasqReplyRoutingSegmentsLeft(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	rec := a15Record(t, lab.out, 7497)
	x, _ := lab.a.RunPod("a16rhx")
	f, err := a14Dial(x, "udp", 0, hp(outsideIP6, 7497))
	if err != nil {
		t.Fatal(err)
	}
	c := f.c
	t.Cleanup(func() { c.Close() })
	c.Write([]byte("open"))
	ua, err := net.ResolveUDPAddr("udp6", rec.from("open", 2*time.Second))
	if err != nil || !ua.IP.Equal(labNodeA6) {
		t.Fatalf("the outside saw x's flow from %v, want the node", ua)
	}
	pp := paramProblems(t, lab.out)
	via := net.ParseIP("fd00:99::9")
	rh := make([]byte, 24)
	rh[0], rh[1], rh[2], rh[3] = 17, 2, 0, 1
	copy(rh[8:], via.To16())
	d := udpDatagram(outsideIP6, 7497, via, ua.Port, []byte("waypoint"))
	h := make([]byte, 40)
	h[0] = 0x60
	h[4], h[5] = byte((len(rh)+len(d))>>8), byte(len(rh)+len(d))
	h[6], h[7] = 43, 64
	copy(h[8:], outsideIP6.To16())
	copy(h[24:], labNodeA6.To16())
	must(t, a15SendRaw6(lab.out, labNodeA6, append(append(h, rh...), d...), 1))
	gotX := a16Read(c, "waypoint", time.Second)
	from := pp(time.Second)
	t.Logf("a datagram to node:%d behind a routing header with segments left 1: x got it %v; parameter problems from %v", ua.Port, gotX, from)
	if gotX {
		t.Errorf("x's socket got a datagram for which the node was only a waypoint")
	}
	for _, f := range from {
		if f != labNodeA6.String() {
			t.Errorf("a parameter problem about it came from %s, not the node %s", f, labNodeA6)
		}
	}
	if len(from) == 0 {
		t.Logf("no parameter problem came back (the node's answer, if any, lost)")
	}
}

// a16Frag6 is a UDP datagram src:sport -> dst:dport in two fragments, the
// headers pre (hbh, dst, rt) before each fragment header and, if post, a
// destination options header after it in the first fragment (Linux's
// layout for IPV6_DSTOPTS).
func a16Frag6(src net.IP, sport int, dst net.IP, dport int, pre []string, post bool, id uint32, payload []byte) [][]byte {
	code := map[string]byte{"hbh": 0, "dst": 60, "rt": 43}
	udp := a15UDP6(src, sport, dst, dport, nil, payload)[40:]
	fnext, part := byte(17), append([]byte{}, udp[:8]...)
	if post {
		fnext, part = 60, append(padOpts(17), udp[:8]...)
	}
	chain := func(f []byte) (byte, []byte) {
		var c []byte
		for i, k := range pre {
			next := byte(44)
			if i+1 < len(pre) {
				next = code[pre[i+1]]
			}
			if k == "rt" {
				c = append(c, next, 0, 0, 0, 0, 0, 0, 0)
			} else {
				c = append(c, padOpts(next)...)
			}
		}
		first := byte(44)
		if len(pre) > 0 {
			first = code[pre[0]]
		}
		return first, append(c, f...)
	}
	pkt := func(f, data []byte) []byte {
		first, c := chain(f)
		h := make([]byte, 40)
		h[0], h[6], h[7] = 0x60, first, 64
		h[4], h[5] = byte((len(c)+len(data))>>8), byte(len(c)+len(data))
		copy(h[8:], src.To16())
		copy(h[24:], dst.To16())
		return append(append(h, c...), data...)
	}
	return [][]byte{
		pkt(fragHdr(fnext, 0, true, id), part),
		pkt(fragHdr(fnext, len(part)/8, false, id), udp[8:]),
	}
}

// TestAttack16HostPortUDP6FourHeaders: the walk's bound is 4 extension
// headers (docs/hostport.md). A datagram to a UDP hostPort over IPv6 in two
// fragments behind exactly four (hop-by-hop, destination options, routing,
// fragment; hop-by-hop, destination options, fragment, destination options)
// and whole behind four (hop-by-hop, destination options, routing,
// destination options) must reach the pod, intact; behind five (one more
// before the fragment header) it may not be translated, but nothing may
// reach the pod other than the datagram as sent.
func TestAttack16HostPortUDP6FourHeaders(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	w := lab.a.NewPod()
	lab.a.MustAddHP(w, "a16fw", testenv.PM{HostPort: 8096, ContainerPort: 96, Protocol: "udp"})
	toW := listenUDP6(t, w, 96)
	payload := strings.Repeat("four headers ", 4)
	for i, c := range []struct {
		what  string
		pkts  [][]byte
		reach bool
	}{
		{"hbh, dst, rt, frag", a16Frag6(outsideIP6, 7600, labNodeA6, 8096, []string{"hbh", "dst", "rt"}, false, 0xa1600, []byte(payload)), true},
		{"hbh, dst, frag, dst", a16Frag6(outsideIP6, 7601, labNodeA6, 8096, []string{"hbh", "dst"}, true, 0xa1601, []byte(payload)), true},
		{"whole, hbh, dst, rt, dst", [][]byte{a15UDP6(outsideIP6, 7602, labNodeA6, 8096, []string{"hbh", "dst", "rt", "dst"}, []byte(payload))}, true},
		{"hbh, dst, rt, dst, frag", a16Frag6(outsideIP6, 7603, labNodeA6, 8096, []string{"hbh", "dst", "rt", "dst"}, false, 0xa1603, []byte(payload)), false},
		{"hbh, dst, rt, frag, dst", a16Frag6(outsideIP6, 7604, labNodeA6, 8096, []string{"hbh", "dst", "rt"}, true, 0xa1604, []byte(payload)), false},
	} {
		for _, p := range c.pkts {
			must(t, a15SendRaw6(lab.out, labNodeA6, p, 1))
		}
		g := toW(time.Second)
		want := payload + " from " + hp(outsideIP6, 7600+i)
		t.Logf("%s: the pod got %q", c.what, g)
		if c.reach && (len(g) != 1 || g[0] != want) {
			t.Errorf("a datagram to hostPort 8096 behind %s: the pod got %q, want %q", c.what, g, want)
		}
		for _, x := range g {
			if x != want {
				t.Errorf("a datagram to hostPort 8096 behind %s: the pod got %q, not what was sent", c.what, x)
			}
		}
	}
	if n := a16Snmp(t, w, "snmp6", "Udp6InCsumErrors"); n > 0 {
		t.Errorf("pod w's stack counted %d UDP checksum errors", n)
	}
}
