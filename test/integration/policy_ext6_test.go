// Round 12 mend: ICMPv6 errors quoting a datagram with extension headers,
// related to a flow of an isolated pod (pol_error_related, lib/policy.h).

package integration

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestPolicyICMP6ErrorQuotingExtHeaders: pod a's UDP datagrams carry a
// destination options header, or a hop-by-hop header (sticky socket
// options); so do a remote client's to a. pol_parse judges such a datagram
// by the UDP header behind the chain and records its flow. The port
// unreachable a closed port answers quotes the datagram, chain and all:
// related to the recorded flow, it passes a policy that isolates the pod
// in its direction, as it does for a datagram without headers (the
// control), and the sender's connected socket gets ECONNREFUSED. Both
// ways: the remote's error into a (a's ingress isolated, its egress
// allowing the remote) and a's error out to the client (a's egress
// isolated, its ingress allowing the client). Red before (mend12,
// 7aa7159) for both header cases in both directions, the controls green:
// pol_error_related took the quote's first extension header for its
// transport, read its ports in the options, found no flow, and the error
// was judged as any ICMPv6 packet and dropped.
func TestPolicyICMP6ErrorQuotingExtHeaders(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	cases := []struct {
		what  string
		setup func(fd int) error
	}{
		{"no extension header", func(int) error { return nil }},
		{"a destination options header", ip6OptsSock(false, true)},
		{"a hop-by-hop header", ip6OptsSock(true, false)},
	}
	// Nobody listens on 7311 on either side.
	l.apply(t, policy.Endpoint{Ingress: isolated(), Egress: isolated(allowAll(host(remoteIP[6])))})
	for _, c := range cases {
		if err := udp6RefusedOpts(l.a, hp(remoteIP[6], 7311), c.setup); err != nil {
			t.Errorf("a's UDP with %s to the remote's closed port, a's ingress isolated: %v", c.what, err)
		}
	}
	l.apply(t, policy.Endpoint{Ingress: isolated(allowAll(host(remoteIP[6]))), Egress: isolated()})
	for _, c := range cases {
		if err := udp6RefusedOpts(l.remote, hp(l.aIP[6], 7311), c.setup); err != nil {
			t.Errorf("the remote's UDP with %s to a's closed port, a's egress isolated: %v", c.what, err)
		}
	}
	// A packet too big quoting a's datagram with a destination options
	// header enters a (a's flow); the same error quoting a flow a never
	// had (another peer port) does not: the walk relates an error to a
	// flow, it admits nothing by itself.
	l.apply(t, policy.Endpoint{Ingress: isolated(), Egress: isolated(allowAll(host(remoteIP[6])))})
	ln := udpSocket(t, l.a, l.aIP[6])
	must(t, sockSetup(ln, ip6OptsSock(false, true)))
	port := ln.LocalAddr().(*net.UDPAddr).Port
	fd := rawICMPListen(t, l.a, 6)
	if _, err := ln.WriteToUDP([]byte("sent"), &net.UDPAddr{IP: remoteIP[6], Port: 7312}); err != nil {
		t.Fatal(err)
	}
	sendICMP(t, l.remote, l.aIP[6], ptb6Quoting(l.aIP[6], port, remoteIP[6], 7312, "ptb-about-a-flow"), 3)
	if !rawSaw(fd, []byte("ptb-about-a-flow"), time.Second) {
		t.Errorf("a packet too big quoting a's datagram (destination options header) to the remote did not reach a")
	}
	sendICMP(t, l.remote, l.aIP[6], ptb6Quoting(l.aIP[6], port, remoteIP[6], 7313, "ptb-about-no-flow"), 3)
	if rawSaw(fd, []byte("ptb-about-no-flow"), time.Second) {
		t.Errorf("a packet too big quoting a datagram a never sent (destination options header) reached a, whose ingress allows nothing")
	}
}

// ptb6Quoting is an ICMPv6 packet too big (MTU 1280) quoting a UDP
// datagram src:sport -> dst:dport behind a destination options header,
// marker its payload. The checksum is the kernel's (raw ICMPv6 socket).
func ptb6Quoting(src net.IP, sport int, dst net.IP, dport int, marker string) []byte {
	u := make([]byte, 8)
	binary.BigEndian.PutUint16(u[0:], uint16(sport))
	binary.BigEndian.PutUint16(u[2:], uint16(dport))
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(marker)))
	q := make([]byte, 40)
	q[0], q[6], q[7] = 0x60, 60, 64
	binary.BigEndian.PutUint16(q[4:], uint16(8+8+len(marker)))
	copy(q[8:], src.To16())
	copy(q[24:], dst.To16())
	m := []byte{2, 0, 0, 0, 0, 0, 5, 0} // packet too big, MTU 1280
	return append(append(append(append(m, q...), padOpts(17)...), u...), marker...)
}
