// attack19: a policy tightened under live flows, then loosened. The
// documented semantics (docs/networkpolicy.md, Flows; as Calico): a flow the
// policy allowed outlives the change, new flows see the new rules, and
// `ebpf-agent dump ct` shows the flows that still pass.

package integration

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// udpRoundTrip sends marker on c and wants it echoed within d.
func udpRoundTrip(c *net.UDPConn, to *net.UDPAddr, marker string, d time.Duration) bool {
	buf := make([]byte, 2048)
	for end := time.Now().Add(d); time.Now().Before(end); {
		c.WriteToUDP([]byte(marker), to)
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, _, err := c.ReadFromUDP(buf); err == nil && string(buf[:n]) == marker {
			return true
		}
	}
	return false
}

// TestAttack19PolicyChangeLiveFlows: a may send to b TCP 7070 and UDP 7071
// (a's egress), b admits them from a (b's ingress); a holds a TCP
// connection and a UDP flow to b. Then both policies allow nothing: the two
// flows go on both ways (as documented), a new connection and a UDP flow
// from a new port are denied and counted, dump ct lists the old flows.
// Loosened back, new flows pass again. IPv4 and IPv6.
func TestAttack19PolicyChangeLiveFlows(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	p.apply(t, "h", policy.Endpoint{})
	allow := func(pod string, fam int) []policy.Allow {
		return []policy.Allow{{Prefix: host(ip(pod, fam)), Ports: []policy.PortRange{
			{Proto: policy.ProtoTCP, First: 7070, Last: 7070}, {Proto: policy.ProtoUDP, First: 7071, Last: 7071}}}}
	}
	loose := func() {
		p.apply(t, "a", policy.Endpoint{Egress: isolated(append(allow("b", 4), allow("b", 6)...)...)})
		p.apply(t, "b", policy.Endpoint{Ingress: isolated(append(allow("a", 4), allow("a", 6)...)...)})
	}
	loose()
	type live struct {
		tcp   connPair
		udp   *net.UDPConn
		udpTo *net.UDPAddr
	}
	flows := map[int]live{}
	for _, fam := range []int{4, 6} {
		accepted := acceptTCP(t, p.b, fam, hp(ip("b", fam), 7070))
		udpEcho(t, p.b, ip("b", fam), 7071)
		c := udpSocket(t, p.a, ip("a", fam))
		to := &net.UDPAddr{IP: ip("b", fam), Port: 7071}
		if !udpRoundTrip(c, to, "open", 2*time.Second) {
			t.Fatalf("v%d: the UDP flow did not open under the loose policy", fam)
		}
		flows[fam] = live{dialPair(t, p.a, hp(ip("b", fam), 7070), accepted, "held", fam), c, to}
	}

	// Tightened: nothing allowed either way.
	p.apply(t, "a", policy.Endpoint{Egress: isolated()})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated()})
	t.Run("tightened", func(t *testing.T) {
		for _, fam := range []int{4, 6} {
			f := flows[fam]
			exchange(t, f.tcp, "v"+strconv.Itoa(fam)+" after tightening")
			if !udpRoundTrip(f.udp, f.udpTo, "still", 2*time.Second) {
				t.Errorf("v%d: the live UDP flow stopped after tightening (documented: it goes on)", fam)
			}
			before := p.drops(t, "a", maps.DirEgress)
			blocked(t, p.a, "tcp", ip("b", fam), 7070)
			blocked(t, p.a, "udp", ip("b", fam), 7071)
			if after := p.drops(t, "a", maps.DirEgress); after <= before {
				t.Errorf("v%d: new flows denied but a's egress drop counter stayed at %d", fam, after)
			}
		}
		out, err := p.AgentCmd("dump", "ct", "--pin-dir", p.PinDir, "--state-dir", p.StateDir)
		if err != nil {
			t.Fatalf("dump ct: %v\n%s", err, out)
		}
		for _, fam := range []int{4, 6} {
			_, port, _ := net.SplitHostPort(flows[fam].tcp.client.LocalAddr().String())
			if !strings.Contains(out, port) || !strings.Contains(out, "7071") {
				t.Errorf("dump ct does not show v%d's surviving flows (TCP from port %s, UDP to 7071):\n%s", fam, port, out)
			}
		}
	})

	loose()
	t.Run("loosened", func(t *testing.T) {
		for _, fam := range []int{4, 6} {
			if !dialOK(p.a, ip("b", fam), 7070) {
				t.Errorf("v%d: a new connection to 7070 failed after loosening", fam)
			}
			c := udpSocket(t, p.a, ip("a", fam))
			if !udpRoundTrip(c, flows[fam].udpTo, "new", 2*time.Second) {
				t.Errorf("v%d: a new UDP flow failed after loosening", fam)
			}
			exchange(t, flows[fam].tcp, "v"+strconv.Itoa(fam)+" after loosening")
		}
	})
}
