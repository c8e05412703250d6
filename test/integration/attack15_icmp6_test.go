// Attack (round 12 hostile review, attack15) on NetworkPolicy's relation of
// ICMPv6 errors to a pod's flows when the quoted packet carries extension
// headers (docs/networkpolicy.md: the quote's chain is walked as a packet's,
// hop-by-hop, routing, destination options, fragment, four at most; an
// error passes an isolating policy only when the packet it quotes belongs to
// a flow of the pod and it goes to that packet's sender).

package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// a15Chain builds an IPv6 extension header chain of the kinds named (hbh,
// dst, rt: a type 0 routing header with segments left 0, frag0: a first
// fragment, fragN: a later one at offset 8), each 8 bytes, ending in next;
// first is the fixed header's next header value.
func a15Chain(kinds []string, next byte) (first byte, chain []byte) {
	code := map[string]byte{"hbh": 0, "dst": 60, "rt": 43, "frag0": 44, "fragN": 44}
	for i := len(kinds) - 1; i >= 0; i-- {
		var h []byte
		switch kinds[i] {
		case "hbh", "dst":
			h = padOpts(next)
		case "rt":
			h = []byte{next, 0, 0, 0, 0, 0, 0, 0}
		case "frag0":
			h = []byte{next, 0, 0, 1, 0, 0, 0x15, 0x15}
		case "fragN":
			h = []byte{next, 0, 0, 8, 0, 0, 0x15, 0x15}
		}
		chain = append(h, chain...)
		next = code[kinds[i]]
	}
	return next, chain
}

// a15PTB is an ICMPv6 packet too big quoting a UDP datagram
// src:sport -> dst:dport behind the chain kinds, marker its payload.
func a15PTB(src net.IP, sport int, dst net.IP, dport int, kinds []string, marker string) []byte {
	first, chain := a15Chain(kinds, 17)
	u := make([]byte, 8)
	binary.BigEndian.PutUint16(u[0:], uint16(sport))
	binary.BigEndian.PutUint16(u[2:], uint16(dport))
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(marker)))
	q := make([]byte, 40)
	q[0], q[6], q[7] = 0x60, first, 64
	binary.BigEndian.PutUint16(q[4:], uint16(len(chain)+8+len(marker)))
	copy(q[8:], src.To16())
	copy(q[24:], dst.To16())
	m := []byte{2, 0, 0, 0, 0, 0, 5, 0}
	return append(append(append(append(m, q...), chain...), u...), marker...)
}

// TestAttack15PolicyICMP6ErrorChains: pod a's ingress isolated (nothing
// allowed in), its egress allowing the remote; a sends one UDP datagram to
// the remote's port 7412 (its flow). The remote then forges packets too big
// to a, each quoting a datagram behind another extension header chain:
//   - about a's flow behind hop-by-hop, destination options and a routing
//     header (segments left 0), and behind four headers: related, must enter;
//   - about a's flow behind a first fragment's header: related (conntrack
//     relates it), must enter;
//   - about a's flow behind five headers (the walk's limit is four: "a
//     longer chain is denied"): must stay out;
//   - about a flow a never had (another remote port) behind three headers:
//     must stay out;
//   - behind a later fragment's header (no transport header in it), its
//     first bytes a's flow's ports: must stay out;
//   - about a's flow but with the quote reversed (remote -> a: an error
//     that does not go to the quoted packet's sender), behind a destination
//     options header: must stay out.
func TestAttack15PolicyICMP6ErrorChains(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	l.apply(t, policy.Endpoint{Ingress: isolated(), Egress: isolated(allowAll(host(remoteIP[6])))})
	ln := udpSocket(t, l.a, l.aIP[6])
	port := ln.LocalAddr().(*net.UDPAddr).Port
	fd := rawICMPListen(t, l.a, 6)
	if _, err := ln.WriteToUDP([]byte("sent"), &net.UDPAddr{IP: remoteIP[6], Port: 7412}); err != nil {
		t.Fatal(err)
	}
	a, r := l.aIP[6], remoteIP[6]
	cases := []struct {
		what     string
		src, dst net.IP
		sport    int
		dport    int
		kinds    []string
		enter    bool
	}{
		{"a's flow behind hop-by-hop, destination options, routing", a, r, port, 7412, []string{"hbh", "dst", "rt"}, true},
		{"a's flow behind four headers", a, r, port, 7412, []string{"hbh", "dst", "rt", "dst"}, true},
		{"a's flow behind a first fragment's header", a, r, port, 7412, []string{"frag0"}, true},
		{"a's flow behind a first fragment's header after hop-by-hop", a, r, port, 7412, []string{"hbh", "frag0"}, true},
		{"a's flow behind five headers", a, r, port, 7412, []string{"hbh", "dst", "rt", "dst", "dst"}, false},
		{"a flow a never had behind three headers", a, r, port, 7413, []string{"hbh", "dst", "rt"}, false},
		{"a later fragment whose first bytes are a's flow's ports", a, r, port, 7412, []string{"fragN"}, false},
		{"a later fragment after hop-by-hop, a's ports in it", a, r, port, 7412, []string{"hbh", "fragN"}, false},
		{"a's flow reversed (remote -> a) behind destination options", r, a, 7412, port, []string{"dst"}, false},
	}
	for i, c := range cases {
		marker := fmt.Sprintf("a15-ptb-%d-", i)
		sendICMP(t, l.remote, a, a15PTB(c.src, c.sport, c.dst, c.dport, c.kinds, marker), 3)
		got := rawSaw(fd, []byte(marker), 800*time.Millisecond)
		t.Logf("%s: entered %v", c.what, got)
		if got != c.enter {
			t.Errorf("a packet too big quoting %s (%v): entered a %v, want %v (a's ingress isolated)", c.what, c.kinds, got, c.enter)
		}
	}
}
