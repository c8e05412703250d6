// attack19: ICMP. A pod isolated for ingress pings out; the host it pings
// sends it echo *requests* with the same identifier. Linux conntrack keys an
// echo by type too (a request from the other side is a new flow), so
// Calico's and iptables' rules see a new flow and deny it.

package integration

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// echoMsg is an ICMP(v6) echo request (or reply) with id and payload; the
// ICMPv6 checksum is the kernel's.
func echoMsg(fam int, reply bool, id uint16, payload string) []byte {
	m := make([]byte, 8, 8+len(payload))
	switch {
	case fam == 4 && !reply:
		m[0] = 8
	case fam == 6 && !reply:
		m[0] = 128
	case fam == 6:
		m[0] = 129
	}
	binary.BigEndian.PutUint16(m[4:], id)
	binary.BigEndian.PutUint16(m[6:], 1)
	m = append(m, payload...)
	if fam == 4 {
		binary.BigEndian.PutUint16(m[2:], csum16(m))
	}
	return m
}

// TestAttack19EchoRequestOnPodsEchoFlow: a's ingress allows nothing, its
// egress everything. a pings the remote host with id 0x4242 (allowed: its
// egress). The remote host then sends a echo requests: with another id
// (control: dropped at a's door), then with a's id 0x4242, and echo replies
// with an id a never used. a must answer none; every one is a policy drop.
// IPv4 and IPv6.
func TestAttack19EchoRequestOnPodsEchoFlow(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	l.apply(t, policy.Endpoint{Ingress: isolated()})
	const id = 0x4242
	for _, fam := range []int{4, 6} {
		fd := rawICMPListen(t, l.remote, fam)
		// a's ping: the remote host answers it (a's egress allows it, the
		// reply rides the flow).
		afd := rawICMPListen(t, l.a, fam)
		sendICMP(t, l.a, remoteIP[fam], echoMsg(fam, false, id, "a-ping"), 1)
		if !rawSaw(afd, []byte("a-ping"), time.Second) {
			t.Fatalf("v%d: a's own ping got no reply", fam)
		}
		for _, c := range []struct {
			what   string
			reply  bool
			id     uint16
			marker string
		}{
			{"a request, another id", false, 0x1111, "other-id"},
			{"a request with a's echo id", false, id, "same-id"},
			{"an unsolicited reply", true, 0x7777, "bogus-reply"},
		} {
			before := counter(t, l.m, l.idx, maps.DirIngress, maps.ReasonDropPolicy).Packets
			sendICMP(t, l.remote, l.aIP[fam], echoMsg(fam, c.reply, c.id, c.marker), 3)
			if c.reply {
				if rawSaw(afd, []byte(c.marker), 500*time.Millisecond) {
					t.Errorf("v%d: %s reached a", fam, c.what)
				}
			} else if rawSaw(fd, []byte(c.marker), 500*time.Millisecond) {
				t.Errorf("v%d: %s from the remote host: isolated a answered it", fam, c.what)
			}
			if after := counter(t, l.m, l.idx, maps.DirIngress, maps.ReasonDropPolicy).Packets; after < before+3 {
				t.Errorf("v%d: %s: a's ingress drop counter rose by %d of 3", fam, c.what, after-before)
			}
		}
	}
}
