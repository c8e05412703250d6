// Traffic helpers: servers that name themselves, clients that ask them, the
// rulesets of a namespace, the hostPort lab's flows.

package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

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
			// A large receive buffer: a test flooding the server (the
			// masquerade port flood) measures the NAT, not this socket.
			if rc, err := pc.(*net.UDPConn).SyscallConn(); err == nil {
				rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20) })
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
		acceptEach(ln, func(c net.Conn) {
			c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
			// Stay until the client is done, so its reads see our close.
			buf := make([]byte, 64)
			c.Read(buf)
		})
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

// acceptEach hands every connection ln accepts to handle, each in its own
// goroutine, and closes it when handle returns; it stops when ln closes.
func acceptEach(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// servedPod runs pod name on node e with serve's servers on port, answering
// as name, and returns it with its IPv4 and IPv6 addresses.
func servedPod(t *testing.T, e *testenv.Env, name string, port int) (ns.NetNS, net.IP, net.IP) {
	t.Helper()
	p, r := e.RunPod(name)
	a4, a6 := testenv.PodIPs(t, r)
	serve(t, p, port, name)
	return p, a4, a6
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
	all, err := m.HostPorts().ListCT()
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

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
