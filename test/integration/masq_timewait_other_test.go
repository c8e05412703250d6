// attack14's TestAttack14MasqTimeWaitOtherPod (hostile review, branch
// attack14): a server that closed first holds TIME_WAIT for the translated
// tuple; another pod connecting from the same source port 700 ms later
// must not get that node port (the server refused its SYNs by PAWS: 5 of 8
// in attack14's run), while the same pod reusing its port must get it back
// at once.

package integration

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack14MasqTimeWaitOtherPod: pods x and y of node A; per round (8,
// IPv4 and IPv6) x connects from a port to a server that closes first, x
// again from it 700 ms later (its own tuple: the server's TIME_WAIT takes
// the SYN), then y from the same port 700 ms after that: y must get
// another node port (no PAWS refusal, no SYN retransmitted, none over 500 ms).
func TestAttack14MasqTimeWaitOtherPod(t *testing.T) {
	lab := newMasqLab(t)
	const port = 7414
	seen := make(chan string, 100)
	for _, srvIP := range []net.IP{outsideIP, outsideIP6} {
		go serveCloseFirst(listenTCPIn(t, lab.out, "tcp", hp(srvIP, port)), seen)
	}
	x, _ := lab.a.RunPod("tx")
	y, _ := lab.a.RunPod("ty")
	testenv.WaitIPv6Ready(t, x)
	testenv.WaitIPv6Ready(t, y)
	for k, srvIP := range []net.IP{outsideIP, outsideIP6} {
		t.Run([]string{"ipv4", "ipv6"}[k], func(t *testing.T) {
			a14TimeWaitRounds(t, lab, x, y, srvIP, port, seen, 62300+10*k)
		})
	}
}

// a14TimeWaitRounds: 8 rounds, each from its own source port from base:
// pod x connects, x again 700 ms after, then pod y 700 ms after that.
func a14TimeWaitRounds(t *testing.T, lab *masqLab, x, y ns.NetNS, srvIP net.IP, port int, seen chan string, base int) {
	once := func(pod ns.NetNS, lport int) (time.Duration, string, error) {
		t0 := time.Now()
		err := pod.Do(func(ns.NetNS) error {
			d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{Port: lport}}
			c, err := d.Dial("tcp", hp(srvIP, port))
			if err != nil {
				return err
			}
			defer c.Close()
			return readCloseFirst(c, make([]byte, 2))
		})
		select {
		case p := <-seen:
			return time.Since(t0), p, err
		case <-time.After(time.Second):
			return time.Since(t0), "", err
		}
	}
	paws0 := tcpExt(t, lab.out, "PAWSTimewait")
	sx0, sy0 := tcpExt(t, x, "TCPSynRetrans"), tcpExt(t, y, "TCPSynRetrans")
	var slowSame, slowOther int
	for i := 0; i < 8; i++ {
		lport := base + i
		d1, p1, err := once(x, lport)
		if err != nil {
			t.Fatalf("x from %d: %v", lport, err)
		}
		time.Sleep(700 * time.Millisecond)
		d2, p2, err := once(x, lport)
		if err != nil {
			t.Fatalf("x again from %d: %v", lport, err)
		}
		time.Sleep(700 * time.Millisecond)
		d3, p3, err := once(y, lport)
		if err != nil {
			t.Fatalf("y from %d: %v", lport, err)
		}
		t.Logf("port %d: x %s (%v), x again %s (%v), y %s (%v)", lport, p1, d1.Round(time.Millisecond), p2, d2.Round(time.Millisecond), p3, d3.Round(time.Millisecond))
		if d2 > 500*time.Millisecond {
			slowSame++
		}
		if d3 > 500*time.Millisecond {
			slowOther++
		}
	}
	paws := tcpExt(t, lab.out, "PAWSTimewait") - paws0
	sx, sy := tcpExt(t, x, "TCPSynRetrans")-sx0, tcpExt(t, y, "TCPSynRetrans")-sy0
	t.Logf("PAWS refusals at the server %d; SYN retransmissions: pod x %d, pod y %d; slow: same pod %d, other pod %d of 8", paws, sx, sy, slowSame, slowOther)
	if sx != 0 || slowSame != 0 {
		t.Errorf("the same pod reusing its port after the server's close: %d SYNs retransmitted, %d of 8 connections over 500 ms", sx, slowSame)
	}
	if sy != 0 || slowOther != 0 || paws != 0 {
		t.Errorf("another pod from the same port after the first pod's flow closed: %d SYNs retransmitted, %d of 8 connections over 500 ms, %d PAWS refusals at the server: the node port went to another pod while the server held TIME_WAIT for it", sy, slowOther, paws)
	}
}

// TestMasqPodClosedFirstPortReused: the other half of the rule above. When
// the pod closes first the pod holds TIME_WAIT, not the server, and the
// node port stays anyone's once quiet for half a second: pod y connecting
// from pod x's port 700 ms after x's flow closed gets x's node port (the
// one its own port maps to), with no SYN lost (IPv4 and IPv6).
func TestMasqPodClosedFirstPortReused(t *testing.T) {
	lab := newMasqLab(t)
	const port = 7415
	for _, srvIP := range []net.IP{outsideIP, outsideIP6} {
		acceptEach(listenTCPIn(t, lab.out, "tcp", hp(srvIP, port)), func(c net.Conn) {
			// Answers with the peer it sees, then waits for the pod's close.
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			io.Copy(io.Discard, c)
		})
	}
	x, _ := lab.a.RunPod("px")
	y, _ := lab.a.RunPod("py")
	testenv.WaitIPv6Ready(t, x)
	testenv.WaitIPv6Ready(t, y)
	once := func(pod ns.NetNS, srvIP net.IP, lport int) (string, error) {
		var peer string
		err := pod.Do(func(ns.NetNS) error {
			d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{Port: lport}}
			c, err := d.Dial("tcp", hp(srvIP, port))
			if err != nil {
				return err
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, 128)
			n, err := c.Read(b)
			peer = strings.TrimSpace(string(b[:n]))
			c.Close() // the pod closes first: TIME_WAIT is its
			return err
		})
		return peer, err
	}
	for k, srvIP := range []net.IP{outsideIP, outsideIP6} {
		t.Run([]string{"ipv4", "ipv6"}[k], func(t *testing.T) {
			sy0 := tcpExt(t, y, "TCPSynRetrans")
			for i := 0; i < 4; i++ {
				lport := 62400 + 10*k + i
				px, err := once(x, srvIP, lport)
				if err != nil {
					t.Fatalf("x from %d: %v", lport, err)
				}
				time.Sleep(700 * time.Millisecond)
				py, err := once(y, srvIP, lport)
				if err != nil {
					t.Fatalf("y from %d: %v", lport, err)
				}
				t.Logf("port %d: x %s, y %s", lport, px, py)
				if px != py {
					t.Errorf("port %d: y got %s, not x's closed %s: a flow the pod closed first held its node port", lport, py, px)
				}
			}
			if sy := tcpExt(t, y, "TCPSynRetrans") - sy0; sy != 0 {
				t.Errorf("pod y retransmitted %d SYNs", sy)
			}
		})
	}
}
