// attack19: fragments into an isolated pod, from a host outside the node,
// directly and through a hostPort: only the first fragment carries the
// ports; the later ones must not get a denied datagram through.
// (Spliced and reordered fragments: TestPolicyAttack, TestPolicyDenied*Fragments.)

package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestAttack19Fragments: h admits UDP 80 from the remote host only, b
// admits nothing. The remote host sends 4000-byte datagrams (3 fragments on
// the 1500-byte links): to h:80 directly and by h's hostPort (control: they
// arrive whole), then to b:80 directly, to h by its hostPort from a pod
// the rules deny (b), and to h:81 (a port no rule allows). None may arrive;
// each is counted as a policy drop at the receiver. IPv4 and IPv6.
func TestAttack19Fragments(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	p.apply(t, "a", policy.Endpoint{})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated()})
	p.apply(t, "h", policy.Endpoint{Ingress: isolated(allowPorts(host(remoteIP[4]), policy.ProtoUDP, 80, 80),
		allowPorts(host(remoteIP[6]), policy.ProtoUDP, 80, 80))})
	listen := func(pod ns.NetNS, ip net.IP, port int) *net.UDPConn {
		var ln *net.UDPConn
		must(t, pod.Do(func(ns.NetNS) error {
			var err error
			ln, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
			return err
		}))
		t.Cleanup(func() { ln.Close() })
		return ln
	}
	for _, fam := range []int{4, 6} {
		// serve holds h:80 and b:8080; these listeners take the other ports.
		h81 := listen(p.h, ip("h", fam), 81)
		b80 := listen(p.b, ip("b", fam), 80)
		for i, c := range []struct {
			what string
			from ns.NetNS
			dst  *net.UDPAddr
			ln   *net.UDPConn
			pod  string
		}{
			{"remote to b:80 directly", p.remote, &net.UDPAddr{IP: ip("b", fam), Port: 80}, b80, "b"},
			{"remote to h:81 directly", p.remote, &net.UDPAddr{IP: ip("h", fam), Port: 81}, h81, "h"},
		} {
			before := p.drops(t, c.pod, maps.DirIngress)
			marker := fmt.Sprintf("frag-v%d-%d", fam, i)
			sendBigUDP(t, c.from, nil, c.dst, 4000, marker)
			if bigReceived(c.ln, marker, time.Second) {
				t.Errorf("v%d %s: the fragmented datagram arrived", fam, c.what)
			}
			if after := p.drops(t, c.pod, maps.DirIngress); after <= before {
				t.Errorf("v%d %s: %s's ingress drop counter stayed at %d", fam, c.what, c.pod, after)
			}
		}
	}
	// Through the hostPort, h's server (port 80) answers the datagram's
	// marker: the remote host (allowed) gets it, b (denied) does not.
	for _, fam := range []int{4, 6} {
		for _, c := range []struct {
			from  ns.NetNS
			src   net.IP
			allow bool
		}{{p.remote, remoteIP[fam], true}, {p.b, ip("b", fam), false}} {
			var got bool
			must(t, c.from.Do(func(ns.NetNS) error {
				conn, err := net.DialUDP("udp", &net.UDPAddr{IP: c.src}, &net.UDPAddr{IP: uplinkIP[fam], Port: hostPortH})
				if err != nil {
					return err
				}
				defer conn.Close()
				msg := make([]byte, 4000)
				copy(msg, "big")
				conn.Write(msg)
				conn.SetReadDeadline(time.Now().Add(time.Second))
				buf := make([]byte, 8192)
				_, err = conn.Read(buf)
				got = err == nil
				return nil
			}))
			if got != c.allow {
				t.Errorf("v%d: a 4000-byte datagram from %s to h's hostPort answered %v, want %v", fam, c.src, got, c.allow)
			}
		}
	}
}
