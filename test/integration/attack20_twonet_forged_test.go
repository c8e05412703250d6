// attack20: to_container's ingress-interface check (docs/networkpolicy.md,
// the forged-source paragraph) admits a node source from "a pod's host
// veth". A pod of a second ebpf-cni network on the same pinDir, without
// networkPolicy, has a host veth of its own: can it forge the node's
// address, or a local pod's, into an isolated pod of the first?

package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack20SecondNetworkForgedSource: b isolated, admitting UDP from a
// only (and the node, as every pod). x, a pod of a second network, sends b
// datagrams by IP_TRANSPARENT forged from a's and the node's addresses,
// IPv4 and IPv6; a listener in b on a port nothing else uses tells whether
// b took any. Controls: x's own datagram to h (open) arrives, and a's own
// to b's listener.
func TestAttack20SecondNetworkForgedSource(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	p.apply(t, "a", policy.Endpoint{})
	p.apply(t, "h", policy.Endpoint{})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(allowAll(host(ip("a", 4))), allowAll(host(ip("a", 6))))})
	netB := p.NetList(testenv.RandName("netb"), map[string]any{
		"type": "ebpf-cni", "pinDir": p.PinDir, "stateDir": t.TempDir(),
		"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{
			{{"subnet": "10.251.0.0/24"}}, {{"subnet": "fd00:251::/64"}}}},
	})
	x := p.NewPod()
	rt := &libcni.RuntimeConf{ContainerID: "x", NetNS: x.Path(), IfName: "eth0"}
	t.Cleanup(func() { p.DelList(netB, rt) })
	if _, err := p.AddList(netB, rt); err != nil {
		t.Fatalf("ADD x on the second network: %v", err)
	}
	const port = 9731
	for _, fam := range []int{4, 6} {
		reach(t, x, "udp", ip("h", fam), 80, "h") // the path works
		var ln *net.UDPConn
		must(t, p.b.Do(func(ns.NetNS) error {
			var err error
			ln, err = net.ListenUDP(fmt.Sprintf("udp%d", fam), &net.UDPAddr{Port: port})
			return err
		}))
		for _, src := range []net.IP{ip("a", fam), nodeIP[fam]} {
			for i := 0; i < 3; i++ {
				sendForged(t, x, &net.UDPAddr{IP: src, Port: 5555}, &net.UDPAddr{IP: ip("b", fam), Port: port}, "forged from "+src.String())
			}
		}
		sendForged(t, p.a, &net.UDPAddr{IP: ip("a", fam), Port: 5556}, &net.UDPAddr{IP: ip("b", fam), Port: port}, "control")
		ln.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
		buf := make([]byte, 512)
		control := false
		for {
			n, from, err := ln.ReadFromUDP(buf)
			if err != nil {
				break
			}
			if string(buf[:n]) == "control" {
				control = true
				continue
			}
			t.Errorf("IPv%d: x (second network) forged into isolated b: %q from %s", fam, buf[:n], from)
		}
		ln.Close()
		if !control {
			t.Errorf("IPv%d: control: a's own datagram to b:%d did not arrive", fam, port)
		}
	}
}
