// Attack (round 12 hostile review, attack15) on "a closed TCP flow no
// longer counts in the pod's share" (docs/masquerade.md, SNAT_F_UNSHARED;
// "the pod's own RSTs always count").

package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// a15RST4 is an IPv4 TCP RST src:sport -> dst:dport with sequence seq.
func a15RST4(src net.IP, sport int, dst net.IP, dport int, seq uint32) []byte {
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], uint16(sport))
	binary.BigEndian.PutUint16(tcp[2:], uint16(dport))
	binary.BigEndian.PutUint32(tcp[4:], seq)
	tcp[12], tcp[13] = 5<<4, 0x04
	ph := make([]byte, 12)
	copy(ph[0:], src.To4())
	copy(ph[4:], dst.To4())
	ph[9] = 6
	binary.BigEndian.PutUint16(ph[10:], 20)
	binary.BigEndian.PutUint16(tcp[16:], csum16(append(ph, tcp...)))
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, 6
	binary.BigEndian.PutUint16(ip[2:], 40)
	copy(ip[12:], src.To4())
	copy(ip[16:], dst.To4())
	binary.BigEndian.PutUint16(ip[10:], csum16(ip))
	return append(ip, tcp...)
}

func a15SendRaw4(netns ns.NetNS, dst net.IP, pkt []byte) error {
	return netns.Do(func(ns.NetNS) error {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		sa := &syscall.SockaddrInet4{}
		copy(sa.Addr[:], dst.To4())
		return syscall.Sendto(fd, pkt, 0, sa)
	})
}

// TestAttack15MasqShareBogusRST: ipMasqPodPortLimit 8 on a 32-port range.
// Pod x opens 8 TCP connections to one server (its share), then sends,
// from a raw socket, an RST on each whose sequence number is far outside
// the server's window: the server ignores it, the connections live on, but
// the masquerade counts a pod's own RST. A second later x opens 8 more
// connections. A pod must not hold more than its share of live flows
// towards one destination: all 16 alive at once (each answered with its own
// echo, on its own node port) means the share was bypassed by lies the pod
// told, and the others' ports with it.
func TestAttack15MasqShareBogusRST(t *testing.T) {
	t.Parallel()
	lab := newShareLab(t, "62400-62431")
	a14Echo(t, lab.out, 7480)
	srv := hp(outsideIP, 7480)
	y, _ := lab.a.RunPod("a15sy")
	if n := a15ShareRun(t, y, nil, srv, 42000, false); n > 8 {
		t.Errorf("control: pod y, no RST, holds %d live connections to one server, over its share of 8", n)
	}
	x, r := lab.a.RunPod("a15sx")
	x4, _ := resultIPs(r)
	n := a15ShareRun(t, x, x4, srv, 41000, true)
	t.Logf("after 8 bogus RSTs: %d connections answered at the end on as many node ports (share 8)", n)
	if n > 8 {
		t.Errorf("pod x holds %d live masqueraded connections to one server, over its share of 8: its own bogus RSTs (ignored by the server) took its first flows out of the count", n)
	}
}

// a15ShareRun opens 8 connections from pod to srv (ports base on), sends a
// bogus RST on each if rst, opens 8 more a second later, and returns how
// many node ports answer at the end.
func a15ShareRun(t *testing.T, x ns.NetNS, x4 net.IP, srv string, base int, rst bool) int {
	t.Helper()
	var flows []*a14Flow
	seen := map[string]int{}
	open := func(from, n int) {
		for j := from; j < from+n; j++ {
			f, err := a14Dial(x, "tcp", base+j, srv)
			if err != nil {
				t.Logf("connection %d: %v", j, err)
				flows = append(flows, nil)
				continue
			}
			t.Cleanup(func() { f.c.Close() })
			flows = append(flows, f)
			if p, e, err := f.ask(fmt.Sprint("c", j)); err == nil && e == fmt.Sprint("c", j) {
				seen[p]++
			}
		}
	}
	open(0, 8)
	for j := 0; j < 8 && rst; j++ {
		must(t, a15SendRaw4(x, outsideIP, a15RST4(x4, base+j, outsideIP, 7480, 0x5a5a5a5a+uint32(j)<<20)))
	}
	time.Sleep(1200 * time.Millisecond)
	open(8, 8)
	alive := map[string]bool{}
	for j, f := range flows {
		if f == nil {
			continue
		}
		if p, e, err := f.ask(fmt.Sprint("again", j)); err == nil && e == fmt.Sprint("again", j) {
			alive[p] = true
		}
	}
	t.Logf("rst %v: %d of 16 connections answered at the end", rst, len(alive))
	return len(alive)
}
