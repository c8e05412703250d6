// polfix20: a pod's packet to a hostPort on a node address is judged on the
// hostPort's backend only (after the programs' own DNAT), as Calico and
// Cilium judge after their translation; every other packet to a node
// address is judged on that address at once (fail closed).

package integration

import (
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// blockedCounted wants proto to ip:port from pod's netns unanswered and
// counted as a policy drop of pod's direction dir (whose pod: who judged).
func (p *polLab) blockedCounted(t *testing.T, from, judge string, dir maps.Dir, proto string, ip net.IP, port int) {
	t.Helper()
	before := p.drops(t, judge, dir)
	blocked(t, p.pods()[from], proto, ip, port)
	if after := p.drops(t, judge, dir); after <= before {
		t.Errorf("%s %s from %s: %s's drop_policy counter (%v) stayed at %d", proto, hp(ip, port), from, judge, dir, after)
	}
}

func (p *polLab) pods() map[string]ns.NetNS {
	return map[string]ns.NetNS{"a": p.a, "b": p.b, "h": p.h}
}

// TestPolicyHostPortJudgedOnBackend attacks the deferral of a node
// address's hostPort to its backend, TCP and UDP, IPv4 and IPv6: (1) a's
// egress allows pod b only: h's hostPort (backend h) is denied on the node
// and the uplink address, counted as a's egress drop; (2) a's egress allows
// the node's addresses (ipBlock /32 and /128) only: the node's own port
// answers, the hostPort to h (denied backend) does not; (3) a's egress
// allows h only and its ingress nothing: a reaches h by the hostPort (the
// replies come back), while the node's own port and a ping to the node stay
// denied; h's ingress allowing b only still keeps a out (the receiver's
// ingress is unchanged); (4) h, whose egress allows nothing, reaches itself
// by its own hostPort (a pod cannot block access to itself), but not the
// node's port nor b.
func TestPolicyHostPortJudgedOnBackend(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	for _, pod := range []string{"b", "h"} {
		p.apply(t, pod, policy.Endpoint{})
	}
	serve(t, p.Node, 9091, "node")
	protos := []string{"tcp", "udp"}

	// (1) The backend denied.
	p.apply(t, "a", policy.Endpoint{Egress: isolated(allowAll(host(ip("b", 4))), allowAll(host(ip("b", 6))))})
	for _, fam := range []int{4, 6} {
		reach(t, p.a, "tcp", ip("b", fam), 8080, "b")
		for _, proto := range protos {
			p.blockedCounted(t, "a", "a", maps.DirEgress, proto, nodeIP[fam], hostPortH)
			p.blockedCounted(t, "a", "a", maps.DirEgress, proto, uplinkIP[fam], hostPortH)
		}
		// A datagram in fragments: its later fragments carry no ports.
		before := p.drops(t, "a", maps.DirEgress)
		if err := bigUDP(p.a, nodeIP[fam], hostPortH, 3000); err == nil {
			t.Errorf("v%d: a's fragmented datagram reached h by its hostPort, a's egress allowing b only", fam)
		}
		if after := p.drops(t, "a", maps.DirEgress); after < before+2 {
			t.Errorf("v%d fragments: a's egress drop_policy counter went from %d to %d only", fam, before, after)
		}
	}

	// (2) The node address allowed, the backend not.
	p.apply(t, "a", policy.Endpoint{Egress: isolated(
		allowAll(host(nodeIP[4])), allowAll(host(uplinkIP[4])), allowAll(host(nodeIP[6])), allowAll(host(uplinkIP[6])))})
	for _, fam := range []int{4, 6} {
		reach(t, p.a, "tcp", nodeIP[fam], 9091, "node")
		for _, proto := range protos {
			p.blockedCounted(t, "a", "a", maps.DirEgress, proto, nodeIP[fam], hostPortH)
			p.blockedCounted(t, "a", "a", maps.DirEgress, proto, uplinkIP[fam], hostPortH)
		}
	}

	// (3) The backend allowed, the node not; a's ingress isolated.
	p.apply(t, "a", policy.Endpoint{
		Egress:  isolated(allowAll(host(ip("h", 4))), allowAll(host(ip("h", 6)))),
		Ingress: isolated(),
	})
	for _, fam := range []int{4, 6} {
		for _, proto := range protos {
			reach(t, p.a, proto, nodeIP[fam], hostPortH, "h")
			reach(t, p.a, proto, uplinkIP[fam], hostPortH, "h")
		}
		if err := bigUDP(p.a, nodeIP[fam], hostPortH, 3000); err != nil {
			t.Errorf("v%d fragments by the hostPort: %v", fam, err)
		}
		p.blockedCounted(t, "a", "a", maps.DirEgress, "tcp", nodeIP[fam], 9091)
		p.blockedCounted(t, "a", "a", maps.DirEgress, "udp", nodeIP[fam], 9091)
		p.untranslatedToNode(t, fam)
		before := p.drops(t, "a", maps.DirEgress)
		if tx, rx, out, err := pingStats(p.a, nodeIP[fam], 2, "0.2"); err != nil || tx == 0 || rx != 0 {
			t.Errorf("v%d ping node from a (egress to h only): tx %d rx %d, %v: %s", fam, tx, rx, err, out)
		}
		if after := p.drops(t, "a", maps.DirEgress); after <= before {
			t.Errorf("v%d ping node from a: a's egress drop_policy counter stayed at %d", fam, after)
		}
	}
	p.apply(t, "h", policy.Endpoint{Ingress: isolated(allowAll(host(ip("b", 4))), allowAll(host(ip("b", 6))))})
	for _, fam := range []int{4, 6} {
		for _, proto := range protos {
			p.blockedCounted(t, "a", "h", maps.DirIngress, proto, nodeIP[fam], hostPortH)
		}
	}

	// (4) The backend pod itself.
	p.apply(t, "h", policy.Endpoint{Egress: isolated()})
	for _, fam := range []int{4, 6} {
		for _, proto := range protos {
			reach(t, p.h, proto, nodeIP[fam], hostPortH, "h")
			p.blockedCounted(t, "h", "h", maps.DirEgress, proto, nodeIP[fam], 9091)
		}
		p.blockedCounted(t, "h", "h", maps.DirEgress, "tcp", ip("b", fam), 8080)
	}
}

// untranslatedToNode: packets of a (egress to h only) to the node address
// and h's hostPort that the hostPort path leaves alone reach the node's
// stack, where nothing would judge them again: they must stay denied,
// counted. TCP segments of no translated flow (no SYN: the hairpin opens
// nothing), and a UDP datagram whose exact flow a connected node socket
// owns (bound to the node address and the hostPort number). That socket's
// own datagram to a is answered: a's reply passes (replies unchanged).
func (p *polLab) untranslatedToNode(t *testing.T, fam int) {
	t.Helper()
	aIP, sport := p.ip["a"][fam], 40000+fam
	hostVeth, _ := p.HostVeth("a")
	src, dst := linkMAC(t, p.a, "eth0"), linkMAC(t, p.Node, hostVeth)
	var frames [][]byte
	for i := 0; i < 5; i++ {
		frames = append(frames, tcpFrame(src, dst, aIP, sport, nodeIP[fam], hostPortH, 1000+uint32(i), 1, tcpACK, 512))
	}
	before := p.drops(t, "a", maps.DirEgress)
	sendFrames(t, p.a, "eth0", frames)
	if after := p.drops(t, "a", maps.DirEgress); after < before+5 {
		t.Errorf("v%d: 5 ACKs of no flow to the hostPort: a's egress drop_policy counter went from %d to %d", fam, before, after)
	}

	var node *net.UDPConn
	err := p.Node.Do(func(ns.NetNS) (err error) {
		node, err = net.DialUDP("udp", &net.UDPAddr{IP: nodeIP[fam], Port: hostPortH}, &net.UDPAddr{IP: aIP, Port: sport})
		return err
	})
	if err != nil {
		t.Fatalf("v%d node socket: %v", fam, err)
	}
	defer node.Close()
	var pod *net.UDPConn
	err = p.a.Do(func(ns.NetNS) (err error) {
		pod, err = net.DialUDP("udp", &net.UDPAddr{IP: aIP, Port: sport}, &net.UDPAddr{IP: nodeIP[fam], Port: hostPortH})
		return err
	})
	if err != nil {
		t.Fatalf("v%d pod socket: %v", fam, err)
	}
	defer pod.Close()
	buf := make([]byte, 64)
	before = p.drops(t, "a", maps.DirEgress)
	pod.Write([]byte("unasked"))
	node.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := node.Read(buf); err == nil {
		t.Errorf("v%d: the node socket owning the flow got a's unasked datagram %q", fam, buf[:n])
	}
	if after := p.drops(t, "a", maps.DirEgress); after <= before {
		t.Errorf("v%d: a's unasked datagram to the node socket: a's egress drop_policy counter stayed at %d", fam, after)
	}
	node.Write([]byte("asked"))
	pod.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := pod.Read(buf); err != nil {
		t.Fatalf("v%d: the node's datagram did not reach a: %v", fam, err)
	}
	pod.Write([]byte("reply"))
	node.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := node.Read(buf); err != nil || string(buf[:n]) != "reply" {
		t.Errorf("v%d: a's reply to the node socket: %q, %v", fam, buf[:n], err)
	}
}
