// Attack (round 12 hostile review, attack15) on IPv6 extension header
// chains through the masquerade (docs/masquerade.md: the pod's packets and
// the replies are walked to their transport header, hop-by-hop and
// destination options; fragments are left to the stack).

package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// a15UDP6 is an IPv6 packet src:sport -> dst:dport carrying a UDP datagram
// (checksummed) behind the extension header chain kinds (a15Chain).
func a15UDP6(src net.IP, sport int, dst net.IP, dport int, kinds []string, payload []byte) []byte {
	first, chain := a15Chain(kinds, 17)
	u := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], uint16(sport))
	binary.BigEndian.PutUint16(u[2:], uint16(dport))
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	u = append(u, payload...)
	ph := make([]byte, 40)
	copy(ph[0:], src.To16())
	copy(ph[16:], dst.To16())
	binary.BigEndian.PutUint32(ph[32:], uint32(len(u)))
	ph[39] = 17
	sum := csum16(append(ph, u...))
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], sum)
	h := make([]byte, 40)
	h[0], h[6], h[7] = 0x60, first, 64
	binary.BigEndian.PutUint16(h[4:], uint16(len(chain)+len(u)))
	copy(h[8:], src.To16())
	copy(h[24:], dst.To16())
	return append(append(h, chain...), u...)
}

// a15SendRaw6 sends the whole IPv6 packet pkt from netns (IPPROTO_RAW: the
// header is ours, the route the netns's).
func a15SendRaw6(netns ns.NetNS, dst net.IP, pkt []byte, n int) error {
	return netns.Do(func(ns.NetNS) error {
		fd, err := syscall.Socket(syscall.AF_INET6, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		sa := &syscall.SockaddrInet6{}
		copy(sa.Addr[:], dst.To16())
		for i := 0; i < n; i++ {
			if err := syscall.Sendto(fd, pkt, 0, sa); err != nil {
				return err
			}
		}
		return nil
	})
}

// a15Recorder listens on [::]:port in netns and records, by payload, the
// source each datagram came from.
type a15Recorder struct {
	c    *net.UDPConn
	seen chan [2]string
}

func a15Record(t *testing.T, netns ns.NetNS, port int) *a15Recorder {
	t.Helper()
	r := &a15Recorder{seen: make(chan [2]string, 64)}
	must(t, netns.Do(func(ns.NetNS) error {
		var err error
		r.c, err = net.ListenUDP("udp6", &net.UDPAddr{Port: port})
		return err
	}))
	t.Cleanup(func() { r.c.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := r.c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			r.seen <- [2]string{string(buf[:n]), from.String()}
		}
	}()
	return r
}

// from waits up to d for payload and returns its source ("" if none came).
func (r *a15Recorder) from(payload string, d time.Duration) string {
	end := time.After(d)
	for {
		select {
		case s := <-r.seen:
			if s[0] == payload {
				return s[1]
			}
		case <-end:
			return ""
		}
	}
}

var a15Chains = [][]string{
	{"hbh", "dst"},
	{"rt"},
	{"hbh", "dst", "rt"},
	{"hbh", "dst", "rt", "dst"},
	{"hbh", "dst", "rt", "dst", "dst"},
	{"hbh", "dst", "dst", "dst", "dst", "dst", "dst", "dst", "dst", "dst"},
}

// TestAttack15MasqReplyChains: the pod's plain UDP flow to the outside is
// masqueraded; the outside answers it (hand-made, to the node's address and
// port the server saw) behind the same chains. Hop-by-hop + destination
// options, a routing header with segments left 0 (what a router must pass
// on), and four headers must reach the pod's socket, as a plain reply does.
func TestAttack15MasqReplyChains(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	pod := a.NewPod()
	a.CleanupDel(pod, "a15r")
	a.Add(pod, "a15r")
	rec := a15Record(t, lab.out, 7421)
	var c *net.UDPConn
	must(t, pod.Do(func(ns.NetNS) error {
		cc, err := net.Dial("udp6", hp(outsideIP6, 7421))
		c, _ = cc.(*net.UDPConn)
		return err
	}))
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("open")); err != nil {
		t.Fatal(err)
	}
	from := rec.from("open", 2*time.Second)
	ua, err := net.ResolveUDPAddr("udp6", from)
	if err != nil || !ua.IP.Equal(labNodeA6) {
		t.Fatalf("the outside saw the pod's flow from %q, want the node's %s", from, labNodeA6)
	}
	for i, kinds := range append([][]string{nil}, a15Chains[:4]...) {
		payload := fmt.Sprintf("a15-reply-%d", i)
		must(t, a15SendRaw6(lab.out, ua.IP, a15UDP6(outsideIP6, 7421, ua.IP, ua.Port, kinds, []byte(payload)), 2))
		buf := make([]byte, 256)
		got := false
		for end := time.Now().Add(time.Second); time.Now().Before(end) && !got; {
			c.SetReadDeadline(end)
			n, err := c.Read(buf)
			if err != nil {
				break
			}
			got = string(buf[:n]) == payload
		}
		t.Logf("reply behind %v: reached the pod %v", kinds, got)
		if !got {
			t.Errorf("the outside's reply behind %v to the node's %s did not reach the pod's socket", kinds, ua)
		}
	}
}

// TestAttack15MasqICMP6ErrorQuotingChains: the pod's UDP flow to the outside
// is masqueraded (node port np). The outside sends packets too big to the
// node quoting node:np -> server behind extension header chains (none: the
// control; destination options; hop-by-hop, destination options, routing):
// each must be translated back and reach the pod (its PMTU discovery). The
// same quoting a server port the pod never used (behind destination
// options) and a later fragment carrying the flow's ports must not reach
// the pod.
func TestAttack15MasqICMP6ErrorQuotingChains(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	pod := a.NewPod()
	a.CleanupDel(pod, "a15i")
	a.Add(pod, "a15i")
	rec := a15Record(t, lab.out, 7470)
	fd := rawICMPListen(t, pod, 6)
	var c *net.UDPConn
	must(t, pod.Do(func(ns.NetNS) error {
		cc, err := net.Dial("udp6", hp(outsideIP6, 7470))
		c, _ = cc.(*net.UDPConn)
		return err
	}))
	t.Cleanup(func() { c.Close() })
	c.Write([]byte("open"))
	ua, err := net.ResolveUDPAddr("udp6", rec.from("open", 2*time.Second))
	if err != nil || !ua.IP.Equal(labNodeA6) {
		t.Fatalf("the outside saw the pod's flow from %v, want the node", ua)
	}
	for i, c := range []struct {
		kinds []string
		dport int
		enter bool
	}{
		{nil, 7470, true},
		{[]string{"dst"}, 7470, true},
		{[]string{"hbh", "dst", "rt"}, 7470, true},
		{[]string{"dst"}, 7471, false},
		{[]string{"fragN"}, 7470, false},
	} {
		marker := fmt.Sprintf("a15-mptb-%d-", i)
		sendICMP(t, lab.out, labNodeA6, a15PTB(labNodeA6, ua.Port, outsideIP6, c.dport, c.kinds, marker), 3)
		got := rawSaw(fd, []byte(marker), 800*time.Millisecond)
		t.Logf("packet too big quoting node:%d -> server:%d behind %v: reached the pod %v", ua.Port, c.dport, c.kinds, got)
		if got != c.enter {
			t.Errorf("a packet too big quoting node:%d -> server:%d behind %v: reached the pod %v, want %v", ua.Port, c.dport, c.kinds, got, c.enter)
		}
	}
}

// TestAttack15MasqPodChains: the pod sends UDP datagrams (hand-made, raw
// socket) to the outside server behind longer chains than the round-12
// tests tried: hop-by-hop and destination options together, a routing
// header with segments left 0 (alone and among others), four, five and ten
// headers. None may reach the outside with the pod's private address (the
// outside has no route back: a flow that leaks is a flow that fails, and
// the cluster's address plan leaks with it). Up to four headers
// (IP6_EXT_MAX) the walk reaches the UDP header: masqueraded, from the
// node's address. Five it cannot walk: dropped at the uplink and counted
// in dump nat's drop_error (before the fix it left with the pod's own
// address). Ten never reach the uplink (before the fix neither).
func TestAttack15MasqPodChains(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	pod := a.NewPod()
	a.CleanupDel(pod, "a15c")
	_, pod6 := resultIPs(a.Add(pod, "a15c"))
	rec := a15Record(t, lab.out, 7420)
	dropErr := func() uint64 { // dump nat's counters
		_, c := a16Share(t, a, 0, "", "")
		return c["drop_error"]
	}
	for i, kinds := range a15Chains {
		payload := fmt.Sprintf("a15-chain-%d", i)
		d0 := dropErr()
		must(t, a15SendRaw6(pod, outsideIP6, a15UDP6(pod6, 41000+i, outsideIP6, 7420, kinds, []byte(payload)), 1))
		from := rec.from(payload, 700*time.Millisecond)
		d := dropErr() - d0
		t.Logf("pod's UDP behind %v: the outside saw it from %q; drop_error +%d", kinds, from, d)
		if from != "" && strings.Contains(from, pod6.String()) {
			t.Errorf("the pod's UDP behind %v reached the outside with the pod's own address (%s): not masqueraded", kinds, from)
		}
		walked := len(kinds) <= 4
		if walked && !strings.Contains(from, labNodeA6.String()) {
			t.Errorf("the pod's UDP behind %v: the outside saw it from %q, want the node's %s", kinds, from, labNodeA6)
		}
		if !walked && (from != "" || (len(kinds) == 5 && d == 0)) {
			t.Errorf("the pod's UDP behind %v (more than the walk's 4 headers): the outside saw it from %q, drop_error +%d; want dropped and counted", kinds, from, d)
		}
	}
}
