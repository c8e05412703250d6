package integration

import (
	"encoding/json"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// masqueradeAll marks every packet to the lab's Services named (web, ext)
// for kube-proxy's SNAT, both families, as kube-proxy's masqueradeAll does.
func masqueradeAll(t *testing.T, p *polLab, svcs ...string) {
	t.Helper()
	must(t, p.Node.Do(func(ns.NetNS) error {
		for _, cmd := range []string{"iptables-nft", "ip6tables-nft"} {
			for _, svc := range svcs {
				for _, proto := range []string{"TCP", "UDP"} {
					chain := "KUBE-SVC-" + svc + "-" + proto
					if out, err := exec.Command(cmd, "-t", "nat", "-I", chain, "1", "-j", "KUBE-MARK-MASQ").CombinedOutput(); err != nil {
						t.Fatalf("%s: %v: %s", cmd, err, out)
					}
				}
			}
		}
		return nil
	}))
}

// TestPolicyMasqueradedService (issue 23): kube-proxy with masqueradeAll (or any
// SNAT rule of the node's POSTROUTING) masquerades a pod's Service traffic
// behind a node address before the tc egress hooks see it. The sender's
// egress denial is deferred by from_container to the judgement after the
// stack (the ClusterIP is no pod's), but after the SNAT to_container and
// to_uplink no longer see the pod's address, so they judge nothing for the
// sender; and the receiver's ingress takes the node's address as the
// node's own traffic (kubelet's), which always passes. A pod denied all
// egress then reaches a pod denied all ingress through its Service.
func TestPolicyMasqueradedService(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	masqueradeAll(t, p, "WEB", "EXT")
	p.apply(t, "h", policy.Endpoint{})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated()})
	p.apply(t, "a", policy.Endpoint{Egress: isolated()})
	for _, fam := range []int{4, 6} {
		blocked(t, p.a, "tcp", p.ip["b"][fam], 8080) // directly: denied
		blocked(t, p.a, "tcp", svcWeb[fam], 80)      // through the masqueraded Service
		blocked(t, p.a, "udp", svcWeb[fam], 80)
		blocked(t, p.h, "tcp", svcWeb[fam], 80) // h may send, b takes nothing
		blocked(t, p.h, "udp", svcWeb[fam], 80)
		// Leaving the node (to_uplink), masqueraded: a's egress still holds.
		blocked(t, p.a, "tcp", svcExt[fam], 80)
		blocked(t, p.a, "udp", svcExt[fam], 80)
		reach(t, p.h, "tcp", svcExt[fam], 80, "remote") // the path works
		reach(t, p.Node, "tcp", svcWeb[fam], 80, "b")   // the node's own, masqueraded too: passes
	}
}

// TestPolicyMasqueradedServiceAllowed: what the rules allow still passes
// when kube-proxy masquerades it, both ways (the replies come back to the
// node address the SNAT chose, and pass as replies of the flow without a
// rule for them), and the rules still judge the real sender: b admits a,
// not h, though both reach it from the same node address.
func TestPolicyMasqueradedServiceAllowed(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	masqueradeAll(t, p, "WEB", "EXT")
	var toB, fromA []policy.Allow
	for _, fam := range []int{4, 6} {
		toB = append(toB, tcpUDP(host(p.ip["b"][fam]), 8080), tcpUDP(host(remoteIP[fam]), 7000))
		fromA = append(fromA, tcpUDP(host(p.ip["a"][fam]), 8080))
	}
	p.apply(t, "h", policy.Endpoint{})
	// Both isolated both ways: every reply depends on the flow entries.
	p.apply(t, "a", policy.Endpoint{Ingress: isolated(), Egress: isolated(toB...)})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(fromA...), Egress: isolated()})
	for _, fam := range []int{4, 6} {
		for _, proto := range []string{"tcp", "udp"} {
			// The server sees a node address, not a's: the SNAT happened.
			want(t, p.a, proto, svcWeb[fam], 80, "b", nil, p.ip["a"][fam])
			want(t, p.a, proto, svcExt[fam], 80, "remote", nil, p.ip["a"][fam])
			blocked(t, p.h, proto, svcWeb[fam], 80)
		}
	}
	// b's entries of those flows are keyed by the node address, marked
	// masqueraded, and their state follows both directions as any flow's:
	// a TCP one is assured (the client answered b's SYN-ACK), so it keeps
	// the established timeout, not the opening one.
	flows, err := p.m.Policy().ListFlows()
	if err != nil {
		t.Fatal(err)
	}
	var snat, assured int
	for _, f := range flows {
		if f.Ifindex != int(p.idx["b"]) || f.Flags&maps.PolicyCTSnat == 0 {
			continue
		}
		snat++
		if f.Proto == maps.ProtoTCP && f.Flags&(1<<2) != 0 { // FLOW_F_ASSURED
			assured++
		}
	}
	if snat == 0 || assured == 0 {
		t.Errorf("b's flow table has %d masqueraded entries, %d of them assured TCP: want some of each\n%+v", snat, assured, flows)
	}
	// The operator's view of them: dump ct's policy rows of b, marked snat.
	out, err := p.AgentCmd("dump", "ct", "-o", "json", "--pin-dir", p.PinDir, "--state-dir", p.StateDir)
	if err != nil {
		t.Fatalf("dump ct: %v\n%s", err, out)
	}
	var d inspect.CTDump
	must(t, json.Unmarshal([]byte(out), &d))
	rows := 0
	for _, r := range d.Flows {
		if strings.HasPrefix(r.Kind, "policy/") && r.Ifindex == int(p.idx["b"]) && r.SNAT && r.Interface != "" {
			rows++
		}
	}
	if rows == 0 {
		t.Errorf("dump ct -o json has no masqueraded policy flow of b:\n%s", out)
	}
}

// tcpUDP allows port of prefix over TCP and UDP.
func tcpUDP(p netip.Prefix, port uint16) policy.Allow {
	return policy.Allow{Prefix: p, Ports: []policy.PortRange{{Proto: 6, First: port, Last: port}, {Proto: 17, First: port, Last: port}}}
}

// TestPolicyNodePortMasqueraded: a NodePort of externalTrafficPolicy
// Cluster, which kube-proxy always masquerades, is judged by the client
// outside, not by the node address it reaches the pod from (Kubernetes
// leaves it to the implementation; iptables-based policy sees the client
// too, in FORWARD before the SNAT). The node's own traffic still passes.
func TestPolicyNodePortMasqueraded(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	var fromRemote []policy.Allow
	for _, fam := range []int{4, 6} {
		fromRemote = append(fromRemote, allowAll(host(remoteIP[fam])))
	}
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(fromRemote...), Egress: isolated()})
	for _, fam := range []int{4, 6} {
		for _, proto := range []string{"tcp", "udp"} {
			want(t, p.remote, proto, uplinkIP[fam], npWeb, "b", nil, remoteIP[fam])
		}
		expectServer(t, p.Node, "tcp", hp(p.ip["b"][fam], 8080), "b") // the node (kubelet)
	}
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(), Egress: isolated()})
	for _, fam := range []int{4, 6} {
		for _, proto := range []string{"tcp", "udp"} {
			blocked(t, p.remote, proto, uplinkIP[fam], npWeb)
		}
		expectServer(t, p.Node, "tcp", hp(p.ip["b"][fam], 8080), "b")
	}
}

// TestPolicyHairpinMasqueraded: a pod reaching itself through its own
// Service is masqueraded by kube-proxy (hairpin); it is judged as it would
// be without the SNAT, by the pod's own address, not passed as the node's.
func TestPolicyHairpinMasqueraded(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	var self []policy.Allow
	for _, fam := range []int{4, 6} {
		self = append(self, allowAll(host(p.ip["b"][fam])))
	}
	p.apply(t, "b", policy.Endpoint{Ingress: isolated()})
	for _, fam := range []int{4, 6} {
		blocked(t, p.b, "tcp", svcWeb[fam], 80)
	}
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(self...)})
	for _, fam := range []int{4, 6} {
		want(t, p.b, "tcp", svcWeb[fam], 80, "b", nil, p.ip["b"][fam])
	}
}

// TestPolicyNodePortForgedPodSource: the conntrack entry names whatever
// source a packet entered the node with, so a host outside forging pod a's
// address to a masqueraded NodePort would be judged as a. It must not reach
// b, which admits a only: such a source is a forgery off the wire and
// from_uplink drops it first. b would answer a (the SNAT undone), where a
// listens on the forged port; a's own datagrams to the NodePort pass.
func TestPolicyNodePortForgedPodSource(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	var fromA []policy.Allow
	for _, fam := range []int{4, 6} {
		fromA = append(fromA, tcpUDP(host(p.ip["a"][fam]), 8080))
	}
	p.apply(t, "a", policy.Endpoint{})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(fromA...)})
	const port = 5555
	for _, fam := range []int{4, 6} {
		want(t, p.a, "udp", uplinkIP[fam], npWeb, "b", nil, p.ip["a"][fam])
		blocked(t, p.remote, "udp", uplinkIP[fam], npWeb)
		var ln *net.UDPConn
		must(t, p.a.Do(func(ns.NetNS) error {
			var err error
			ln, err = net.ListenUDP("udp", &net.UDPAddr{IP: p.ip["a"][fam], Port: port})
			return err
		}))
		for i := 0; i < 3; i++ {
			sendForged(t, p.remote, &net.UDPAddr{IP: p.ip["a"][fam], Port: port}, &net.UDPAddr{IP: uplinkIP[fam], Port: npWeb}, "forged")
		}
		ln.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 512)
		if n, from, err := ln.ReadFromUDP(buf); err == nil {
			t.Errorf("IPv%d: a datagram forged from outside with a's source reached b through the NodePort, which answered a from %s: %q", fam, from, buf[:n])
		}
		ln.Close()
	}
}
