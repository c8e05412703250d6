// NetworkPolicy in the datapath: a network with "networkPolicy": true, its
// pods programmed through maps.PolicyWriter (standing in for the agent),
// judged on every path a packet takes into or out of a pod.

package integration

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// polLab is the kube-proxy lab (svcLab: pods a, b and h with hostPort
// 8081 -> 80, a remote host routed through the node's uplink, kube-proxy's
// iptables rules) on a network with networkPolicy, and the writer.
type polLab struct {
	*svcLab
	w   *maps.PolicyWriter
	m   *maps.Maps
	idx map[string]uint32 // pod -> host veth ifindex
}

func newPolLab(t *testing.T, masq bool) *polLab {
	t.Helper()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	if masq {
		h.Extra["ipMasq"] = true
	}
	l := &svcLab{hpEnv: h, masq: masq, fams: []int{4, 6}, ip: map[string]map[int]net.IP{}}
	for _, fam := range []int{4, 6} {
		routeVia(t, h.Node, "", remoteIP[fam])
		routeVia(t, h.remote, cluster[fam], uplinkIP[fam])
	}
	l.a, l.b, l.h = h.NewPod(), h.NewPod(), h.NewPod()
	for _, p := range []struct {
		id  string
		pod ns.NetNS
	}{{"a", l.a}, {"b", l.b}} {
		h.CleanupDel(p.pod, p.id)
		v4, v6 := resultIPs(h.Add(p.pod, p.id))
		l.ip[p.id] = map[int]net.IP{4: v4, 6: v6}
	}
	v4, v6 := resultIPs(h.MustAddHP(l.h, "h", testenv.PM{HostPort: hostPortH, ContainerPort: 80, Protocol: "tcp"},
		testenv.PM{HostPort: hostPortH, ContainerPort: 80, Protocol: "udp"}))
	l.ip["h"] = map[int]net.IP{4: v4, 6: v6}
	serve(t, l.a, 8080, "a")
	serve(t, l.b, 8080, "b")
	serve(t, l.b, 53, "dns")
	serve(t, l.h, 80, "h")
	serve(t, h.remote, 7000, "remote")
	for _, fam := range l.fams {
		proxyModes[0].install(t, h.Node, fam, cluster[fam], []net.IP{uplinkIP[fam], nodeIP[fam]}, l.services(fam))
	}
	m := h.Maps()
	p := &polLab{svcLab: l, w: m.Policy().Writer(), m: m, idx: map[string]uint32{}}
	for _, id := range []string{"a", "b", "h"} {
		_, idx := h.HostVeth(id)
		p.idx[id] = uint32(idx)
	}
	return p
}

// apply programs pod's policy and waits out nothing: the next packet sees it.
func (p *polLab) apply(t *testing.T, pod string, ep policy.Endpoint) {
	t.Helper()
	if err := p.w.Apply(p.idx[pod], ep); err != nil {
		t.Fatalf("apply policy of %s: %v", pod, err)
	}
}

// host is the /32 or /128 of ip.
func host(ip net.IP) netip.Prefix {
	a, _ := netip.AddrFromSlice(ip)
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen())
}

func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s).Masked() }

func allowAll(p netip.Prefix) policy.Allow { return policy.Allow{Prefix: p, AllPorts: true} }

func allowPorts(p netip.Prefix, proto uint8, first, last uint16) policy.Allow {
	return policy.Allow{Prefix: p, Ports: []policy.PortRange{{Proto: proto, First: first, Last: last}}}
}

func isolated(allows ...policy.Allow) policy.Rules {
	return policy.Rules{Isolated: true, Allows: allows}
}

// reach wants addr over proto answered by server from netns.
func reach(t *testing.T, from ns.NetNS, proto string, ip net.IP, port int, server string) {
	t.Helper()
	expectServer(t, from, proto, hp(ip, port), server)
}

// blocked wants no answer over proto from addr, quicker than expectNoServer
// (a denied packet is dropped: only time tells).
func blocked(t *testing.T, from ns.NetNS, proto string, ip net.IP, port int) {
	t.Helper()
	addr := hp(ip, port)
	err := from.Do(func(ns.NetNS) error {
		if proto == "tcp" {
			c, err := net.DialTimeout("tcp", addr, 700*time.Millisecond)
			if err == nil {
				c.Close()
				return fmt.Errorf("connected")
			}
			return nil
		}
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 256)
		for try := 0; try < 2; try++ {
			c.Write([]byte("ping"))
			c.SetReadDeadline(time.Now().Add(400 * time.Millisecond))
			if n, err := c.Read(buf); err == nil {
				return fmt.Errorf("answered %q", buf[:n])
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("%s %s: %v, want it denied", proto, addr, err)
	}
}

func (p *polLab) drops(t *testing.T, pod string, dir maps.Dir) uint64 {
	t.Helper()
	return counter(t, p.m, int(p.idx[pod]), dir, maps.ReasonDropPolicy).Packets
}

// TestPolicy: pending until programmed, then ingress and egress by peer
// address, CIDR with except (a pod address in the hole), port and endPort
// range, TCP and UDP, IPv4 and IPv6, on the same-node fast path, through
// the stack (a remote host routed through the node, kube-proxy's ClusterIP
// DNAT, a Service to another host), hostPort into an isolated pod, the
// node's own traffic, replies of allowed flows both ways, and "replies" of
// flows that never were.
func TestPolicy(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	fams := []int{4, 6}

	t.Run("pending", func(t *testing.T) {
		// CHECK is unaffected: the interface has its state and flag.
		must(t, p.Check(p.a, "a", "eth0"))
		for _, fam := range fams {
			before := p.drops(t, "a", maps.DirEgress)
			blocked(t, p.a, "tcp", ip("b", fam), 8080)
			blocked(t, p.remote, "tcp", ip("b", fam), 8080)
			blocked(t, p.remote, "udp", ip("b", fam), 8080)
			// The node (kubelet's probes) reaches a pending pod.
			reach(t, p.Node, "tcp", ip("b", fam), 8080, "b")
			reach(t, p.Node, "udp", ip("b", fam), 8080, "b")
			if after := p.drops(t, "a", maps.DirEgress); after <= before {
				t.Errorf("IPv%d: a's drop_policy egress counter stayed at %d", fam, after)
			}
		}
	})

	// Nothing selects any pod: everything flows.
	for _, pod := range []string{"a", "b", "h"} {
		p.apply(t, pod, policy.Endpoint{})
	}
	t.Run("programmed-open", func(t *testing.T) {
		for _, fam := range fams {
			reach(t, p.a, "tcp", ip("b", fam), 8080, "b")
			reach(t, p.b, "udp", ip("a", fam), 8080, "a")
			reach(t, p.remote, "tcp", ip("b", fam), 8080, "b")
		}
	})

	// b: ingress from a only, TCP 8000-8100; egress: nothing.
	p.apply(t, "b", policy.Endpoint{
		Ingress: isolated(allowPorts(host(ip("a", 4)), policy.ProtoTCP, 8000, 8100),
			allowPorts(host(ip("a", 6)), policy.ProtoTCP, 8000, 8100)),
		Egress:   isolated(),
		Policies: []string{"ns/b-ingress"},
	})
	t.Run("ingress-by-peer-and-port", func(t *testing.T) {
		for _, fam := range fams {
			before := p.drops(t, "b", maps.DirIngress)
			reach(t, p.a, "tcp", ip("b", fam), 8080, "b")    // fast path; replies pass b's isolated egress
			blocked(t, p.a, "udp", ip("b", fam), 8080)       // UDP not allowed
			blocked(t, p.h, "tcp", ip("b", fam), 8080)       // another pod
			blocked(t, p.remote, "tcp", ip("b", fam), 8080)  // through the stack
			reach(t, p.a, "tcp", svcWeb[fam], 80, "b")       // ClusterIP DNAT to b: judged as a -> b:8080
			blocked(t, p.a, "udp", svcWeb[fam], 80)          // same Service, UDP
			reach(t, p.Node, "tcp", ip("b", fam), 8080, "b") // the node
			blocked(t, p.b, "tcp", ip("a", fam), 8080)       // b's egress: nothing, a's replies notwithstanding
			blocked(t, p.b, "tcp", remoteIP[fam], 7000)      // nor off the node
			if after := p.drops(t, "b", maps.DirIngress); after <= before {
				t.Errorf("IPv%d: b's drop_policy ingress counter stayed at %d", fam, after)
			}
		}
	})

	// The endPort range moved past 8080.
	p.apply(t, "b", policy.Endpoint{
		Ingress: isolated(allowPorts(host(ip("a", 4)), policy.ProtoTCP, 8081, 9000),
			allowPorts(host(ip("a", 6)), policy.ProtoTCP, 8081, 9000)),
		Egress: isolated(),
	})
	t.Run("endport-range", func(t *testing.T) {
		for _, fam := range fams {
			blocked(t, p.a, "tcp", ip("b", fam), 8080)
		}
	})

	// b: ingress from the pods' CIDRs but a (the except), and from the
	// remote host's /24 but the remote host itself; UDP too.
	remoteNet := map[int]netip.Prefix{4: netip.PrefixFrom(host(remoteIP4).Addr(), 24).Masked(),
		6: netip.PrefixFrom(host(remoteIP6).Addr(), 64).Masked()}
	exceptA := func(fam int) []policy.Allow {
		return []policy.Allow{
			allowAll(prefix(cluster[fam])),
			{Prefix: host(ip("a", fam))}, // the except: nothing
			allowAll(remoteNet[fam]),
			{Prefix: host(remoteIP[fam])},
		}
	}
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(append(exceptA(4), exceptA(6)...)...), Egress: isolated()})
	t.Run("cidr-except", func(t *testing.T) {
		for _, fam := range fams {
			blocked(t, p.a, "tcp", ip("b", fam), 8080)
			blocked(t, p.a, "udp", ip("b", fam), 8080)
			reach(t, p.h, "tcp", ip("b", fam), 8080, "b")
			reach(t, p.h, "udp", ip("b", fam), 8080, "b")
			must(t, testenv.PingFrom(p.h, ip("h", fam), ip("b", fam), 1)) // a rule without ports: every protocol
			blocked(t, p.remote, "tcp", ip("b", fam), 8080)
			blocked(t, p.remote, "tcp", uplinkIP[fam], npLocal) // NodePort, externalTrafficPolicy Local: the client's address
		}
	})
	// The hole moved off the remote host: it comes in.
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(allowAll(remoteNet[4]), allowAll(remoteNet[6])), Egress: isolated()})
	t.Run("cidr-allowed-through-stack", func(t *testing.T) {
		for _, fam := range fams {
			reach(t, p.remote, "tcp", ip("b", fam), 8080, "b")
			reach(t, p.remote, "udp", ip("b", fam), 8080, "b")
			reach(t, p.remote, "tcp", uplinkIP[fam], npLocal, "b")
		}
	})

	// Fragmented datagrams: b takes UDP 8080 from a and the remote host
	// only, and sends nothing of its own. A 3000-byte datagram and its
	// 3000-byte answer are three fragments each way: the later fragments
	// carry no ports and pass because their first one did.
	udp8080 := []policy.PortRange{{Proto: policy.ProtoUDP, First: 8080, Last: 8080}}
	var fragPeers []policy.Allow
	for _, fam := range fams {
		fragPeers = append(fragPeers, policy.Allow{Prefix: host(ip("a", fam)), Ports: udp8080}, policy.Allow{Prefix: host(remoteIP[fam]), Ports: udp8080})
	}
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(fragPeers...), Egress: isolated()})
	t.Run("fragments", func(t *testing.T) {
		for _, fam := range fams {
			for _, from := range []ns.NetNS{p.a, p.remote} {
				if err := bigUDP(from, ip("b", fam), 8080, 3000); err != nil {
					t.Errorf("IPv%d: %v", fam, err)
				}
			}
			// Port-less fragments of a datagram whose first fragment was denied.
			if err := bigUDP(p.h, ip("b", fam), 8080, 3000); err == nil {
				t.Errorf("IPv%d: h's fragmented datagram reached b, whose rules do not name h", fam)
			}
		}
	})

	// a: egress to b TCP 8080 only (and b open again).
	p.apply(t, "b", policy.Endpoint{})
	p.apply(t, "a", policy.Endpoint{Egress: isolated(allowPorts(host(ip("b", 4)), policy.ProtoTCP, 8080, 8080),
		allowPorts(host(ip("b", 6)), policy.ProtoTCP, 8080, 8080))})
	t.Run("egress", func(t *testing.T) {
		for _, fam := range fams {
			before := p.drops(t, "a", maps.DirEgress)
			reach(t, p.a, "tcp", ip("b", fam), 8080, "b")
			blocked(t, p.a, "udp", ip("b", fam), 8080)
			blocked(t, p.a, "tcp", ip("h", fam), 80)
			blocked(t, p.a, "tcp", remoteIP[fam], 7000)
			// Services: judged after kube-proxy's DNAT.
			reach(t, p.a, "tcp", svcWeb[fam], 80, "b") // -> b:8080
			blocked(t, p.a, "udp", svcDNS[fam], 53)    // -> b:53
			blocked(t, p.a, "tcp", svcExt[fam], 80)    // -> remote:7000, leaves through the uplink
			// Ingress open: b reaches a, and the remote host does.
			reach(t, p.b, "tcp", ip("a", fam), 8080, "a")
			reach(t, p.remote, "udp", ip("a", fam), 8080, "a")
			if after := p.drops(t, "a", maps.DirEgress); after <= before {
				t.Errorf("IPv%d: a's drop_policy egress counter stayed at %d", fam, after)
			}
		}
	})
	p.apply(t, "a", policy.Endpoint{Egress: isolated(allowPorts(host(remoteIP4), policy.ProtoTCP, 7000, 7000),
		allowPorts(host(remoteIP6), policy.ProtoTCP, 7000, 7000))})
	t.Run("egress-through-service-off-node", func(t *testing.T) {
		for _, fam := range fams {
			reach(t, p.a, "tcp", remoteIP[fam], 7000, "remote")
			reach(t, p.a, "tcp", svcExt[fam], 80, "remote")
			blocked(t, p.a, "tcp", svcWeb[fam], 80)
		}
	})

	// h: isolated ingress, reached through its hostPort.
	p.apply(t, "a", policy.Endpoint{})
	p.apply(t, "h", policy.Endpoint{Ingress: isolated()})
	t.Run("hostport-into-isolated-pod", func(t *testing.T) {
		for _, fam := range fams {
			blocked(t, p.remote, "tcp", uplinkIP[fam], hostPortH)
			blocked(t, p.remote, "udp", uplinkIP[fam], hostPortH)
		}
		// A host on the wire posing as the node (a node address as its
		// source) to reach the hostPort: the node's pass is not its.
		must(t, p.remote.Do(func(ns.NetNS) error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			for _, a := range []string{nodeIP[4].String() + "/32", nodeIP[6].String() + "/128"} {
				addr, _ := netlink.ParseAddr(a)
				addr.Flags = unix.IFA_F_NODAD
				if err := netlink.AddrAdd(lo, addr); err != nil {
					return err
				}
			}
			return nil
		}))
		for _, fam := range fams {
			before := p.drops(t, "h", maps.DirIngress)
			must(t, p.remote.Do(func(ns.NetNS) error {
				c, err := net.DialUDP("udp", &net.UDPAddr{IP: nodeIP[fam]}, &net.UDPAddr{IP: uplinkIP[fam], Port: hostPortH})
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte("posing as the node"))
				return err
			}))
			deadline := time.Now().Add(2 * time.Second)
			for p.drops(t, "h", maps.DirIngress) == before && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if p.drops(t, "h", maps.DirIngress) == before {
				t.Errorf("IPv%d: a datagram from the wire with the node's address reached h's hostPort undenied", fam)
			}
		}
	})
	// Allowed by the port the pod listens on (the hostPort's containerPort).
	p.apply(t, "h", policy.Endpoint{Ingress: isolated(allowPorts(host(remoteIP4), policy.ProtoTCP, 80, 80),
		allowPorts(host(remoteIP6), policy.ProtoTCP, 80, 80))})
	t.Run("hostport-allowed", func(t *testing.T) {
		for _, fam := range fams {
			reach(t, p.remote, "tcp", uplinkIP[fam], hostPortH, "h")
			blocked(t, p.remote, "udp", uplinkIP[fam], hostPortH)
		}
	})

	// a: ingress nothing. b sends UDP "replies" from its port 8080 to a
	// port a listens on: no flow of a's has that tuple.
	p.apply(t, "h", policy.Endpoint{})
	p.apply(t, "a", policy.Endpoint{Ingress: isolated()})
	t.Run("forged-replies", func(t *testing.T) {
		for _, fam := range fams {
			ln := udpSocket(t, p.a, ip("a", fam))
			port := ln.LocalAddr().(*net.UDPAddr).Port
			err := p.b.Do(func(ns.NetNS) error {
				c, err := net.DialUDP("udp", &net.UDPAddr{IP: ip("b", fam), Port: 8081}, &net.UDPAddr{IP: ip("a", fam), Port: port})
				if err != nil {
					return err
				}
				defer c.Close()
				for i := 0; i < 3; i++ {
					c.Write([]byte("forged"))
				}
				return nil
			})
			must(t, err)
			if got, _ := udpReceived(ln, "none"); len(got) != 0 {
				t.Errorf("IPv%d: a received %q from b with no flow of its own", fam, got)
			}
			// An ICMP error about a's own flow comes in: the remote host's
			// port unreachable refuses a's connected UDP socket.
			must(t, p.a.Do(func(ns.NetNS) error {
				c, err := net.Dial("udp", hp(remoteIP[fam], 7999))
				if err != nil {
					return err
				}
				defer c.Close()
				buf := make([]byte, 64)
				for try := 0; try < 3; try++ {
					c.Write([]byte("anyone?"))
					c.SetReadDeadline(time.Now().Add(time.Second))
					_, err = c.Read(buf)
					if errors.Is(err, syscall.ECONNREFUSED) {
						return nil
					}
				}
				return fmt.Errorf("IPv%d: UDP to a closed port of the remote host: %v, want connection refused (its ICMP error)", fam, err)
			}))
			// a's own flow to b: b's answers come back in.
			reach(t, p.a, "udp", ip("b", fam), 8080, "b")
			reach(t, p.a, "tcp", ip("b", fam), 8080, "b")
			blocked(t, p.b, "tcp", ip("a", fam), 8080)
		}
	})

	// Read back what is programmed.
	pp, ok, err := p.m.Policy().Read(int(p.idx["a"]))
	if err != nil || !ok || pp.Mode[policy.Ingress] != "isolated" || pp.Mode[policy.Egress] != "open" || len(pp.Ingress.Allows) != 0 {
		t.Errorf("programmed policy of a: %+v, %v, %v", pp, ok, err)
	}
	// a's policy goes with the writer's Remove; b's and h's with DEL alone.
	must(t, p.w.Remove(p.idx["a"]))
	p.w.Flush()
	p.teardown(t)
	if st, err := p.m.Policy().States(); err != nil || len(st) != 0 {
		t.Errorf("policy states left after DEL: %v %v", st, err)
	}
	if fl, err := p.m.Policy().ListFlows(); err != nil || len(fl) != 0 {
		t.Errorf("policy flows left after DEL: %d %v", len(fl), err)
	}
	if n, err := p.w.Sweep(); err != nil || n != 0 {
		t.Errorf("sets left after Remove: %d %v", n, err)
	}
}

// TestPolicyKilledADD: an ADD killed after it made the interface pending
// leaves a state that GC removes with the rest of the attachment; the
// killed pod was never reachable meanwhile but from the node.
func TestPolicyKilledADD(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	bin := crashBinary(t)
	pod := h.NewPod()
	envv := pluginEnv("ADD", "killed", pod, "eth0")
	envv["EBPF_CNI_CRASH_AT"] = "endpoints"
	out, err := h.RunPlugin(bin, envv, h.StdinConf(nil))
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("ADD with EBPF_CNI_CRASH_AT=endpoints: %v, want killed by SIGKILL; stdout %s", err, out)
	}
	m := h.Maps()
	st, err := m.Policy().States()
	must(t, err)
	if len(st) != 1 {
		t.Fatalf("policy states after the killed ADD: %+v, want its pending one", st)
	}
	for _, s := range st {
		if s.Mode != [2]uint8{maps.PolicyPending, maps.PolicyPending} {
			t.Errorf("the killed ADD's interface is %v, want pending both ways", s.Mode)
		}
	}
	must(t, h.GC())
	if st, err := m.Policy().States(); err != nil || len(st) != 0 {
		t.Errorf("policy states after GC: %+v, %v", st, err)
	}
	h.AssertClean()
}

// TestPolicyMasq: with ipMasq, a pod's egress is judged before the
// masquerade (on its own address), and the replies the uplink translates
// back pass its isolated ingress.
func TestPolicyMasq(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, true)
	for _, pod := range []string{"b", "h"} {
		p.apply(t, pod, policy.Endpoint{})
	}
	both := []policy.PortRange{{Proto: policy.ProtoTCP, First: 7000, Last: 7000}, {Proto: policy.ProtoUDP, First: 7000, Last: 7000}}
	p.apply(t, "a", policy.Endpoint{Ingress: isolated(), Egress: isolated(
		policy.Allow{Prefix: host(remoteIP4), Ports: both}, policy.Allow{Prefix: host(remoteIP6), Ports: both})})
	for _, fam := range []int{4, 6} {
		for _, proto := range []string{"tcp", "udp"} {
			a := expectServer(t, p.a, proto, hp(remoteIP[fam], 7000), "remote")
			if a.server == "remote" && !peer(t, a).Equal(uplinkIP[fam]) {
				t.Errorf("IPv%d %s: the remote host saw %s, want the node's %s (masqueraded)", fam, proto, peer(t, a), uplinkIP[fam])
			}
			reach(t, p.a, proto, svcExt[fam], 80, "remote") // DNAT to remote:7000, then masqueraded
		}
		blocked(t, p.a, "tcp", svcWeb[fam], 80)
		blocked(t, p.remote, "tcp", p.ip["a"][fam], 8080)
	}
	p.teardown(t)
}

// bigUDP sends a size-byte datagram from netns to ip:port and wants an
// answer larger than an MTU: the server (serve) reads the reassembled
// datagram into 2048 bytes and echoes them, so both ways were fragmented.
func bigUDP(from ns.NetNS, ip net.IP, port, size int) error {
	return from.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp", hp(ip, port))
		if err != nil {
			return err
		}
		defer c.Close()
		payload := make([]byte, size)
		for i := range payload {
			payload[i] = 'x'
		}
		buf := make([]byte, 2*size)
		for try := 0; try < 2; try++ {
			if _, err := c.Write(payload); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(700 * time.Millisecond))
			n, err := c.Read(buf)
			if err != nil {
				continue
			}
			if n <= 1500 {
				return fmt.Errorf("%d-byte datagram to %s: answer of %d bytes", size, hp(ip, port), n)
			}
			return nil
		}
		return fmt.Errorf("%d-byte datagram to %s: no answer", size, hp(ip, port))
	})
}
