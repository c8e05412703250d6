// Defects found reviewing the pending deferral (issue 23, polfix5).

package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"syscall"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestPolfix5PendingEntryAdmitsNoICMPError: an ICMP error enters a pod
// when it quotes a flow of the pod's (pol_error_related). A deferred
// entry the judgement after the stack never confirmed (a's datagram with
// TTL or hop limit 1, dropped by the stack before to_uplink) must not
// count as one: else any host on the path sends a pod isolated both ways
// whatever it appends to an error quoting that datagram. Control: the
// same error quoting a datagram a's egress allowed gets in.
func TestPolfix5PendingEntryAdmitsNoICMPError(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	for _, fam := range []int{4, 6} {
		routeVia(t, h.Node, "", remoteIP[fam])
		routeVia(t, h.remote, cluster[fam], uplinkIP[fam])
	}
	a := h.NewPod()
	h.CleanupDel(a, "a")
	a4, a6 := resultIPs(h.Add(a, "a"))
	aIP := map[int]net.IP{4: a4, 6: a6}
	_, idx := h.HostVeth("a")
	const peerPort = 7003
	for _, fam := range []int{4, 6} {
		ln := udpSocket(t, a, aIP[fam])
		port := ln.LocalAddr().(*net.UDPAddr).Port
		fd := rawICMPListen(t, a, fam)
		errorQuotingA := func(marker string) bool {
			sendICMP(t, h.remote, aIP[fam], icmpErrorQuotingUDP(aIP[fam], port, remoteIP[fam], peerPort, []byte(marker)), 3)
			return rawSaw(fd, []byte(marker), time.Second)
		}
		// Control: a's egress allows the peer; the error about its
		// datagram gets in, although a's ingress allows nothing.
		must(t, h.Maps().Policy().Writer().Apply(uint32(idx), policy.Endpoint{Ingress: isolated(),
			Egress: isolated(allowAll(host(remoteIP[fam])))}))
		if _, err := ln.WriteToUDP([]byte("allowed"), &net.UDPAddr{IP: remoteIP[fam], Port: peerPort}); err != nil {
			t.Fatal(err)
		}
		if m := fmt.Sprintf("about-an-allowed-datagram-v%d", fam); !errorQuotingA(m) {
			t.Fatalf("IPv%d: the peer's ICMP error about a's allowed datagram did not reach a", fam)
		}
		// a denied all egress: its datagram with TTL 1 is deferred, and
		// dropped by the stack before any second judgement.
		must(t, h.Maps().Policy().Writer().Apply(uint32(idx), policy.Endpoint{Ingress: isolated(), Egress: isolated()}))
		rc, err := ln.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		must(t, rc.Control(func(fd uintptr) {
			if fam == 4 {
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TTL, 1)
			} else {
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, 1)
			}
		}))
		must(t, err)
		// A new flow (another peer port): the control's entry is not it.
		if _, err := ln.WriteToUDP([]byte("knock"), &net.UDPAddr{IP: remoteIP[fam], Port: peerPort + 1}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		m := fmt.Sprintf("about-a-pending-datagram-v%d", fam)
		sendICMP(t, h.remote, aIP[fam], icmpErrorQuotingUDP(aIP[fam], port, remoteIP[fam], peerPort+1, []byte(m)), 3)
		if rawSaw(fd, []byte(m), time.Second) {
			t.Errorf("IPv%d: the peer's ICMP error quoting a's deferred, never confirmed datagram reached a, whose ingress allows nothing", fam)
		}
	}
}

// icmpErrorQuotingUDP is icmpErrorCarrying's error quoting a UDP datagram
// src:sport -> dst:dport (the quote's ports sit where UDP's do).
func icmpErrorQuotingUDP(src net.IP, sport int, dst net.IP, dport int, data []byte) []byte {
	m := icmpErrorCarrying(src, sport, dst, dport, data)
	if src.To4() == nil {
		m[8+6] = syscall.IPPROTO_UDP // the kernel sums ICMPv6
		return m
	}
	m[8+9] = syscall.IPPROTO_UDP
	m[8+10], m[8+11] = 0, 0
	binary.BigEndian.PutUint16(m[8+10:], csum16(m[8:28]))
	m[2], m[3] = 0, 0
	binary.BigEndian.PutUint16(m[2:], csum16(m))
	return m
}
