// NAT state an outsider cannot steer (issue 28): forged packets from a host
// on the node's link, with any source address it likes.

package integration

import (
	"encoding/binary"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// setPodPortRange sets a pod's ip_local_port_range, so that a spray can
// cover every port its unbound sockets get.
func setPodPortRange(t *testing.T, pod ns.NetNS, r string) {
	t.Helper()
	err := pod.Do(func(ns.NetNS) error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte(r), 0o644)
	})
	if err != nil {
		t.Fatalf("pod ip_local_port_range %s: %v", r, err)
	}
}

// TestMasqOutsideCannotSteer: datagrams a host on node A's link forges from
// the server's address to a masquerading pod's address (NTP-like: to the
// port the pod will use towards the server; DNS-like: a spray over the
// pod's whole ephemeral range) do not change how the pod's own later
// queries to that server leave: masqueraded, with A's address. Before the
// fix they left with the pod's private address (the outside has no route
// back to it: no answer). IPv4 and IPv6.
func TestMasqOutsideCannotSteer(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	pod := a.NewPod()
	a.CleanupDel(pod, "p")
	p4, p6 := resultIPs(a.Add(pod, "p"))
	serve(t, lab.out, 7000, "outside")
	setPodPortRange(t, pod, "40000 40031")
	brMAC, upMAC := linkMAC(t, lab.out, "br0"), linkMAC(t, a.Node, "uplink0")

	for _, c := range []struct {
		name           string
		pod, srv, node net.IP
	}{{"v4", p4, outsideIP, labNodeA}, {"v6", p6, outsideIP6, labNodeA6}} {
		t.Run(c.name, func(t *testing.T) {
			// NTP-like: the pod talks to server:7000 from port 7000.
			sendFrames(t, lab.out, "br0", [][]byte{udpFrame(brMAC, upMAC, c.srv, 7000, c.pod, 7000, []byte("forged"))})
			// DNS-like: every port of the pod's ephemeral range.
			var spray [][]byte
			for p := 40000; p <= 40031; p++ {
				spray = append(spray, udpFrame(brMAC, upMAC, c.srv, 7000, c.pod, p, []byte("forged")))
			}
			sendFrames(t, lab.out, "br0", spray)
			time.Sleep(100 * time.Millisecond)

			mustAsk(t, pod, "udp", hp(c.srv, 7000), 7000, "outside", c.node)
			for i := 0; i < 3; i++ {
				mustAsk(t, pod, "udp", hp(c.srv, 7000), 0, "outside", c.node)
			}
		})
	}
}

// sniffSynAck watches link name in netns for the SYN-ACK a server on port
// sends, and delivers its sequence number (the attacker of the test is
// blind; the test is not, so that its spray provably misses the window).
func sniffSynAck(t *testing.T, netns ns.NetNS, name string, port int) <-chan uint32 {
	t.Helper()
	out := make(chan uint32, 1)
	ready := make(chan error, 1)
	go func() {
		err := netns.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, int(htons16(syscall.ETH_P_ALL)))
			if err != nil {
				return err
			}
			defer syscall.Close(fd)
			if err := syscall.Bind(fd, &syscall.SockaddrLinklayer{Protocol: htons16(syscall.ETH_P_ALL), Ifindex: l.Attrs().Index}); err != nil {
				return err
			}
			tv := syscall.Timeval{Sec: 1}
			syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
			ready <- nil
			buf := make([]byte, 2048)
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
				n, _, err := syscall.Recvfrom(fd, buf, 0)
				if err != nil || n < 14 {
					continue
				}
				var l4 []byte
				switch binary.BigEndian.Uint16(buf[12:]) {
				case 0x0800:
					if n < 34 || buf[23] != 6 {
						continue
					}
					l4 = buf[14+int(buf[14]&0xf)*4 : n]
				case 0x86dd:
					if n < 54 || buf[20] != 6 {
						continue
					}
					l4 = buf[54:n]
				default:
					continue
				}
				if len(l4) >= 20 && int(binary.BigEndian.Uint16(l4)) == port && l4[13]&(tcpSYN|tcpACK) == tcpSYN|tcpACK {
					out <- binary.BigEndian.Uint32(l4[4:])
					return nil
				}
			}
			return nil
		})
		if err != nil {
			ready <- err
		}
	}()
	if err := <-ready; err != nil {
		t.Fatalf("sniff %s: %v", name, err)
	}
	return out
}

func htons16(v uint16) uint16 { return v<<8 | v>>8 }

// TestMasqForgedRSTs: a host on node A's link sprays RSTs at a masquerading
// pod's idle connection to an outside server, with the server's address
// and port and the node's address and port (the tuple an attacker can
// learn or guess), every sequence number at least 1 MiB away from the
// server's: none is in the pod's window, so none closes the flow, and
// after longer than a closed flow lives (10 s) the server's next segment
// still reaches the pod. Before the fix any RST closed it. An RST at the
// server's sequence number still does. IPv4 and IPv6.
func TestMasqForgedRSTs(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	pod := a.NewPod()
	a.CleanupDel(pod, "p")
	a.Add(pod, "p")
	brMAC, upMAC := linkMAC(t, lab.out, "br0"), linkMAC(t, a.Node, "uplink0")

	for _, c := range []struct {
		name      string
		srv, node net.IP
		port      int
	}{{"v4", outsideIP, labNodeA, 7104}, {"v6", outsideIP6, labNodeA6, 7106}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var ln net.Listener
			if err := lab.out.Do(func(ns.NetNS) (err error) { ln, err = net.Listen("tcp", hp(c.srv, c.port)); return }); err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			isn := sniffSynAck(t, lab.out, "br0", c.port)
			accepted := make(chan net.Conn, 1)
			go func() {
				if s, err := ln.Accept(); err == nil {
					accepted <- s
				}
			}()
			var cli net.Conn
			if err := pod.Do(func(ns.NetNS) (err error) {
				cli, err = net.DialTimeout("tcp", hp(c.srv, c.port), 5*time.Second)
				return
			}); err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			var srv net.Conn
			select {
			case srv = <-accepted:
			case <-time.After(5 * time.Second):
				t.Fatal("the server accepted nothing")
			}
			defer srv.Close()
			seen := srv.RemoteAddr().(*net.TCPAddr)
			if !seen.IP.Equal(c.node) {
				t.Fatalf("the server saw %s, want node A's address", seen)
			}
			var end uint32
			select {
			case s := <-isn:
				end = s + 1
			case <-time.After(5 * time.Second):
				t.Fatal("no SYN-ACK seen on the outside link")
			}

			var spray [][]byte
			for i := uint32(0); i < 2048; i++ {
				seq := end + 1<<20 + i<<21
				flags := byte(tcpRST)
				if i%2 == 1 {
					flags |= tcpACK
				}
				spray = append(spray, tcpFrame(brMAC, upMAC, c.srv, c.port, c.node, seen.Port, seq, i*7919, flags, 0))
			}
			sendFrames(t, lab.out, "br0", spray)
			time.Sleep(12 * time.Second) // longer than a closed flow's 10 s

			if _, err := srv.Write([]byte("pong\n")); err != nil {
				t.Fatal(err)
			}
			cli.SetReadDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 16)
			if n, err := cli.Read(buf); err != nil || string(buf[:n]) != "pong\n" {
				t.Fatalf("the pod's idle connection after %d forged RSTs: read %q, %v; want pong", len(spray), buf[:n], err)
			}

			// The server's own RST (at its next sequence number) still
			// closes the flow.
			sendFrames(t, lab.out, "br0", [][]byte{tcpFrame(brMAC, upMAC, c.srv, c.port, c.node, seen.Port, end+5, 0, tcpRST, 0)})
			time.Sleep(100 * time.Millisecond)
			flows, err := a.Maps().ListSNAT()
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, f := range flows {
				if f.Peer.Port() == uint16(c.port) && int(f.Node.Port()) == seen.Port {
					found = true
					if !f.Closing {
						t.Errorf("an in-window RST left the flow %+v open", f)
					}
				}
			}
			if !found {
				t.Errorf("no masqueraded flow to port %d in %+v", c.port, flows)
			}

			// A refused connection: the server's RST acknowledges the pod's
			// SYN before any reply, and closes the flow.
			refused := c.port + 100
			err = pod.Do(func(ns.NetNS) error {
				conn, err := net.DialTimeout("tcp", hp(c.srv, refused), 3*time.Second)
				if err == nil {
					conn.Close()
				}
				return err
			})
			if err == nil || !strings.Contains(err.Error(), "refused") {
				t.Fatalf("dial a closed port of the server: %v, want connection refused", err)
			}
			flows, err = a.Maps().ListSNAT()
			if err != nil {
				t.Fatal(err)
			}
			found = false
			for _, f := range flows {
				if int(f.Peer.Port()) == refused {
					found = true
					if !f.Closing {
						t.Errorf("the RST refusing the connection left the flow %+v open", f)
					}
				}
			}
			if !found {
				t.Errorf("no masqueraded flow to port %d in %+v", refused, flows)
			}
		})
	}
}
