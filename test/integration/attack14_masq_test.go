// attack14: hostile review of the masquerade's port choice after issue 30
// ("a pod's ports map one to one onto node ports, and a closed flow holds
// no share"), written from docs/masquerade.md without reading the
// allocator: same source ports at once, a node socket on the same tuple,
// node listeners and hostPorts in the range, TIME_WAIT reuse, exhaustion.

package integration

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a14Echo runs, in the outside netns on port (IPv4 and IPv6), a UDP server
// answering "<peer> <payload>" and a TCP server that answers each line with
// "<peer> <line>".
func a14Echo(t *testing.T, out ns.NetNS, port int) {
	t.Helper()
	must(t, out.Do(func(ns.NetNS) error {
		for _, a := range []net.IP{outsideIP, outsideIP6} {
			ln, err := net.Listen("tcp", hp(a, port))
			if err != nil {
				return err
			}
			t.Cleanup(func() { ln.Close() })
			acceptEach(ln, func(c net.Conn) {
				c.SetDeadline(time.Now().Add(30 * time.Second))
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					fmt.Fprintf(c, "%s %s", c.RemoteAddr(), line)
				}
			})
		}
		return nil
	}))
	for _, a := range []net.IP{outsideIP, outsideIP6} {
		udpPeerEcho(t, out, a, port)
	}
}

// udpPeerEcho answers each datagram to ip:port in netns with "<peer> <payload>".
func udpPeerEcho(t *testing.T, netns ns.NetNS, ip net.IP, port int) {
	t.Helper()
	var pc net.PacketConn
	must(t, netns.Do(func(ns.NetNS) error {
		var err error
		pc, err = net.ListenPacket("udp", hp(ip, port))
		return err
	}))
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(fmt.Sprintf("%s %s", from, buf[:n])), from)
		}
	}()
}

// a14Flow is one flow of a pod from a fixed local port to the echo server:
// ask sends msg and returns the peer the server saw and the payload it
// echoed.
type a14Flow struct {
	c     net.Conn
	r     *bufio.Reader
	proto string
}

func a14Dial(netns ns.NetNS, proto string, lport int, srv string) (*a14Flow, error) {
	var f *a14Flow
	err := netns.Do(func(ns.NetNS) error {
		var c net.Conn
		var err error
		if proto == "tcp" {
			d := net.Dialer{Timeout: 4 * time.Second, LocalAddr: &net.TCPAddr{Port: lport}}
			c, err = d.Dial("tcp", srv)
		} else {
			d := net.Dialer{LocalAddr: &net.UDPAddr{Port: lport}}
			c, err = d.Dial("udp", srv)
		}
		if err != nil {
			return err
		}
		f = &a14Flow{c: c, r: bufio.NewReader(c), proto: proto}
		return nil
	})
	return f, err
}

func (f *a14Flow) ask(msg string) (peer, echoed string, err error) {
	for try := 0; try < 3; try++ {
		f.c.SetDeadline(time.Now().Add(time.Second))
		if _, err = f.c.Write([]byte(msg + "\n")); err != nil {
			return "", "", err
		}
		var line string
		if f.proto == "tcp" {
			f.c.SetDeadline(time.Now().Add(4 * time.Second))
			line, err = f.r.ReadString('\n')
		} else {
			buf := make([]byte, 2048)
			var n int
			n, err = f.c.Read(buf)
			line = string(buf[:n])
		}
		if err != nil {
			if f.proto == "udp" {
				continue
			}
			return "", "", err
		}
		p, e, _ := strings.Cut(strings.TrimSpace(line), " ")
		return p, e, nil
	}
	return "", "", err
}

// TestAttack14MasqSamePortConcurrent: two pods of node A hold flows from
// the same source port (62000) to the same server at once, TCP and UDP,
// IPv4 and IPv6, and talk in turns: each gets only its own answers, and
// the server sees two different node ports.
func TestAttack14MasqSamePortConcurrent(t *testing.T) {
	lab := newMasqLab(t)
	a14Echo(t, lab.out, 7411)
	x, rx := lab.a.RunPod("sx")
	y, ry := lab.a.RunPod("sy")
	_, _ = rx, ry
	testenv.WaitIPv6Ready(t, x)
	testenv.WaitIPv6Ready(t, y)
	lport := masqSrcPort
	for _, srv := range []net.IP{outsideIP, outsideIP6} {
		for _, proto := range []string{"tcp", "udp"} {
			// One port per case: the pod's closed TCP flow holds its own
			// TIME_WAIT on the port, and a v4 socket's port is a v6 one's.
			lport++
			fx, err := a14Dial(x, proto, lport, hp(srv, 7411))
			if err != nil {
				t.Fatalf("%s x: %v", proto, err)
			}
			fy, err := a14Dial(y, proto, lport, hp(srv, 7411))
			if err != nil {
				t.Fatalf("%s y: %v", proto, err)
			}
			peers := map[string]string{}
			for i := 0; i < 10; i++ {
				for name, f := range map[string]*a14Flow{"x": fx, "y": fy} {
					msg := fmt.Sprintf("%s-%d", name, i)
					p, e, err := f.ask(msg)
					if err != nil {
						t.Errorf("%s %s pod %s: %v", proto, srv, name, err)
						continue
					}
					if e != msg {
						t.Errorf("%s %s: pod %s asked %q and got %q: another flow's answer", proto, srv, name, msg, e)
					}
					if was, ok := peers[name]; ok && was != p {
						t.Errorf("%s %s: pod %s's flow seen as %s, then %s", proto, srv, name, was, p)
					}
					peers[name] = p
				}
			}
			if peers["x"] == peers["y"] {
				t.Errorf("%s %s: both pods' flows seen by the server as %s", proto, srv, peers["x"])
			}
			t.Logf("%s %s: x as %s, y as %s", proto, srv, peers["x"], peers["y"])
			fx.c.Close()
			fy.c.Close()
		}
	}
}

// TestAttack14MasqHeldPorts: node A has a TCP listener on 62200, a UDP
// socket on 62201 and a hostPort 62202 (TCP and UDP), all in the
// masquerade range; a pod dials the server from those very ports. Its
// flows must take other node ports, and the server can still reach the
// listener, the UDP socket and the hostPort pod at node A's address.
func TestAttack14MasqHeldPorts(t *testing.T) {
	lab := newMasqLab(t)
	a14Echo(t, lab.out, 7413)
	serve(t, lab.a.Node, 62200, "node-tcp")
	h := hostPortPod(lab.a, "hh", 62202)
	serve(t, h, 8080, "hostport")
	x, _ := lab.a.RunPod("hx")
	x6, _ := lab.a.RunPod("hx6") // its own ports: x's IPv4 sockets hold them in x
	testenv.WaitIPv6Ready(t, x6)
	for _, c := range []struct {
		proto string
		port  int
		pod   ns.NetNS
		srv   string
	}{
		{"tcp", 62200, x, hp(outsideIP, 7413)}, {"udp", 62200, x, hp(outsideIP, 7413)},
		{"tcp", 62202, x, hp(outsideIP, 7413)}, {"udp", 62202, x, hp(outsideIP, 7413)},
		{"tcp", 62200, x6, hp(outsideIP6, 7413)}, {"udp", 62200, x6, hp(outsideIP6, 7413)},
		{"tcp", 62202, x6, hp(outsideIP6, 7413)}, {"udp", 62202, x6, hp(outsideIP6, 7413)},
	} {
		srv := c.srv
		f, err := a14Dial(c.pod, c.proto, c.port, srv)
		if err != nil {
			t.Fatalf("%s from %d: %v", c.proto, c.port, err)
		}
		p, e, err := f.ask("x")
		if err != nil || e != "x" {
			t.Errorf("%s from %d: %q %v", c.proto, c.port, e, err)
		}
		if strings.HasSuffix(p, fmt.Sprintf(":%d", c.port)) {
			t.Errorf("%s from %d: the pod's flow took node port %d, which node A holds (listener or hostPort)", c.proto, c.port, c.port)
		}
		t.Logf("%s from %d to %s: seen as %s", c.proto, c.port, srv, p)
		defer f.c.Close()
	}
	// The server (outside) still reaches what holds those ports.
	for _, c := range []struct{ proto, addr, want string }{
		{"tcp", hp(labNodeA, 62200), "node-tcp"}, {"udp", hp(labNodeA, 62200), "node-tcp"},
		{"tcp", hp(labNodeA, 62202), "hostport"}, {"udp", hp(labNodeA, 62202), "hostport"},
		{"tcp", hp(labNodeA6, 62200), "node-tcp"}, {"udp", hp(labNodeA6, 62200), "node-tcp"},
		{"tcp", hp(labNodeA6, 62202), "hostport"}, {"udp", hp(labNodeA6, 62202), "hostport"},
	} {
		a, err := askFrom(lab.out, c.proto, c.addr, 0)
		if err != nil {
			t.Errorf("outside %s to %s: %v", c.proto, c.addr, err)
			continue
		}
		if a.server != c.want {
			t.Errorf("outside %s to %s answered by %q, want %q", c.proto, c.addr, a.server, c.want)
		}
	}
}

// TestAttack14MasqExhausted: a 16-port range, three pods each opening 8
// UDP flows (8 source ports) to one server, replied and kept: more flows
// than ports. No two live flows may share a node port (the server would
// answer both on one tuple), every answer a pod gets is its own, the
// excess is refused and counted (drop_exhausted or drop_pod_limit), and the
// flows that got ports keep working after the exhaustion.
func TestAttack14MasqExhausted(t *testing.T) {
	lab := newShareLab(t, "62400-62415")
	a14Echo(t, lab.out, 7415)
	srv := hp(outsideIP, 7415)
	type flow struct {
		name string
		f    *a14Flow
		peer string
	}
	var flows []*flow
	var mu sync.Mutex
	var wg sync.WaitGroup
	var pods []ns.NetNS
	for i := 0; i < 3; i++ {
		p, _ := lab.a.RunPod(fmt.Sprintf("ex%d", i))
		pods = append(pods, p)
	}
	for i, p := range pods {
		for j := 0; j < 8; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				name := fmt.Sprintf("pod%d-flow%d", i, j)
				f, err := a14Dial(p, "udp", 40000+j, srv)
				if err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
				peer, e, err := f.ask(name)
				if err == nil && e != name {
					t.Errorf("%s got %q: another flow's answer", name, e)
				}
				mu.Lock()
				flows = append(flows, &flow{name, f, peer})
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	byPeer := map[string]string{}
	var answered int
	for _, fl := range flows {
		defer fl.f.c.Close()
		if fl.peer == "" {
			continue
		}
		answered++
		if o, ok := byPeer[fl.peer]; ok {
			t.Errorf("%s and %s both seen by the server as %s", o, fl.name, fl.peer)
		}
		byPeer[fl.peer] = fl.name
	}
	t.Logf("%d of 24 flows answered (16 ports)", answered)
	if answered > 16 || answered < 14 {
		t.Errorf("%d of 24 flows answered with 16 ports in the range", answered)
	}
	// The answered flows keep their ports and their own answers.
	for _, fl := range flows {
		if fl.peer == "" {
			continue
		}
		p, e, err := fl.f.ask(fl.name + "-again")
		if err != nil || e != fl.name+"-again" || p != fl.peer {
			t.Errorf("%s after the exhaustion: seen as %s (was %s), got %q, %v", fl.name, p, fl.peer, e, err)
		}
	}
	idx := uplinkIndex(t, lab.a)
	_ = idx
	var refused uint64
	for i := range pods {
		_, h := lab.a.HostVeth(fmt.Sprintf("ex%d", i))
		for _, r := range []maps.Reason{maps.ReasonDropNATPorts, maps.ReasonDropNATLimit} {
			refused += counter(t, lab.a.Maps(), h, maps.DirIngress, r).Packets + counter(t, lab.a.Maps(), h, maps.DirEgress, r).Packets
		}
	}
	t.Logf("refusals counted on the pods' host veths: %d", refused)
	if answered < 24 && refused == 0 {
		t.Errorf("%d flows got no port and no refusal was counted", 24-answered)
	}
}
