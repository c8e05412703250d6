// Hostile review 8, the tunnel: path MTU for a hostPort's replies.

package integration

import (
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// serveBigUDP answers every datagram to port (IPv4) in netns with size
// bytes, until the test ends.
func serveBigUDP(t *testing.T, netns ns.NetNS, port, size int) {
	t.Helper()
	var pc net.PacketConn
	err := netns.Do(func(ns.NetNS) error {
		var err error
		pc, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatalf("listen UDP %d: %v", port, err)
	}
	t.Cleanup(func() { pc.Close() })
	reply := make([]byte, size)
	for i := range reply {
		reply[i] = 'x'
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(reply, from)
		}
	}()
}

// bigUDPAnswered sends a small datagram from netns to addr once a second
// for up to tries seconds and reports the first answer of want bytes.
func bigUDPAnswered(netns ns.NetNS, addr string, want, tries int) (sent int, err error) {
	err = netns.Do(func(ns.NetNS) error {
		raddr, err := net.ResolveUDPAddr("udp4", addr)
		if err != nil {
			return err
		}
		c, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 4096)
		for sent = 1; sent <= tries; sent++ {
			if _, err := c.WriteToUDP([]byte("give"), raddr); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			if n, _, err := c.ReadFromUDP(buf); err == nil {
				if n != want {
					return fmt.Errorf("answered %d bytes, want %d", n, want)
				}
				return nil
			}
		}
		return fmt.Errorf("no answer to %d requests", tries)
	})
	return sent, err
}

// TestAttack8TunnelHostPortReplyPMTU: a hostPort pod of node 1 (1500-byte
// link, pods' MTU 1450) answers a pod of node 3 (behind the router's
// 1400-byte link) with 1400-byte UDP datagrams, which fit the pod's MTU but
// not the path once encapsulated (1478 bytes). docs/tunnel.md promises
// PMTU through the tunnel: the router's "fragmentation needed" reaches node
// 1, the agent locks the path MTU on the routes, and the pod is told. The
// control, pod 3 to the hostPort pod's own address, works that way. The
// same server through node 1's hostPort (the client's address kept: node
// addresses are cluster CIDRs) must be answered too, after the same few
// retries; its replies go into the tunnel by tun_redirect, which sets the
// tunnel key itself ("the path MTU the device learns is not recorded on
// its route", docs/tunnel.md "Not done"): nobody tells the pod, every
// reply is lost, and a UDP service (DNS over a hostPort, a game server)
// is dead for every pod behind a smaller link.
func TestAttack8TunnelHostPortReplyPMTU(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	for _, e := range lab.nodes {
		e.Extra["clusterCIDRs"] = []string{tunCluster, tunCluster6, tunNode[0].String() + "/32", tunNode[1].String() + "/32", tunNode[2].String() + "/32"}
	}
	startTunAgents(t, lab)
	p3, _ := n3.RunPod("c3")
	hp1 := n1.NewPod()
	n1.CleanupDel(hp1, "hp1")
	r := n1.MustAddHP(hp1, "hp1", testenv.PM{HostPort: 11353, ContainerPort: 5353, Protocol: "udp"})
	a1, _ := testenv.PodIPs(t, r)
	const size = 1400
	serveBigUDP(t, hp1, 5353, size)

	// The hostPort first: the control below teaches the pod the path MTU
	// toward pod 3, after which its replies would fit whatever path.
	hostPortErr := error(nil)
	if n, err := bigUDPAnswered(p3, hp(tunNode[0], 11353), size, 15); err != nil {
		hostPortErr = err
	} else {
		t.Logf("hostPort answered after %d requests", n)
	}
	// Control: the plain path learns the path MTU within a few retries.
	if n, err := bigUDPAnswered(p3, hp(a1, 5353), size, 20); err != nil {
		t.Fatalf("control: pod 3 to the hostPort pod's own address %s: %v", a1, err)
	} else {
		t.Logf("control: pod 3 to %s answered after %d requests", a1, n)
	}
	if hostPortErr != nil {
		t.Errorf("pod 3 to node 1's hostPort %s: %v (the same server answered on its own address)", hp(tunNode[0], 11353), hostPortErr)
	}
}

// TestAttack8TunnelClearForgedSourceThroughStackDNAT: check 5 of
// docs/tunnel.md drops, off the wire in the clear, a source in a pod CIDR
// that is routed into the tunnel "when the packet could reach a pod": a
// host on the link (the stranger) claiming node 3's pod. To a hostPort it
// is dropped (TestTunnelClearPeerPodSourceToNode); to a node address with
// no hostPort it is passed to the stack for the rolling upgrade. But the
// stack DNATs node-address ports into local pods keeping the source:
// kube-proxy's NodePort with externalTrafficPolicy Local, the portmap
// plugin's hostPorts, any DNAT rule. Here node 1 DNATs 10.77.1.1:30080 to
// its pod's 8080 (what kube-proxy writes for such a NodePort); the
// stranger's TCP SYN and UDP datagram claiming node 3's pod reach the pod,
// which takes them as node 3's pod's (a NetworkPolicy admitting that pod
// admits them; its replies go into the tunnel to the real pod). Expected:
// dropped like the same forgery to a hostPort. The control, the stranger's
// own address to the same port, reaches the pod.
func TestAttack8TunnelClearForgedSourceThroughStackDNAT(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	must(t, n1.InNode(func() error {
		for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.uplink0.rp_filter"} {
			if err := tunSysctl(k, "2"); err != nil {
				return err
			}
		}
		return nil
	}))
	startTunAgents(t, lab)
	_, r3 := n3.RunPod("c3")
	a3, _ := testenv.PodIPs(t, r3)
	p1, r1 := n1.RunPod("c1")
	a1, _ := testenv.PodIPs(t, r1)
	got := listenUDP4(t, p1, 8080)
	must(t, n1.InNode(func() error {
		for _, proto := range []string{"tcp", "udp"} {
			args := []string{"-w", "-t", "nat", "-A", "PREROUTING", "-d", tunNode[0].String(), "-p", proto, "--dport", "30080",
				"-j", "DNAT", "--to-destination", a1.String() + ":8080"}
			if out, err := exec.Command("iptables-nft", args...).CombinedOutput(); err != nil {
				return fmt.Errorf("iptables %v: %v: %s", args, err, out)
			}
		}
		return nil
	}))
	strMAC, n1MAC := linkMAC(t, lab.strang, "uplink0"), linkMAC(t, n1.Node, "uplink0")

	// Control: the stranger as itself reaches the pod through the DNAT.
	sendFrames(t, lab.strang, "uplink0", [][]byte{udpFrame(strMAC, n1MAC, tunStrang, 40020, tunNode[0], 30080, []byte("control"))})
	if g := got(2 * time.Second); len(g) != 1 {
		t.Fatalf("control: the stranger's own datagram through node 1's DNAT: pod 1 got %q, want it", g)
	}

	up1 := uplinkIndex(t, n1)
	m1 := n1.Maps()
	drops0 := counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunSrc).Packets
	before := podSNMP(t, p1)
	sendFrames(t, lab.strang, "uplink0", [][]byte{
		tcpFrame(strMAC, n1MAC, a3, 40021, tunNode[0], 30080, 1000, 0, tcpSYN, 64240),
		udpFrame(strMAC, n1MAC, a3, 40022, tunNode[0], 30080, []byte("forged-as-node3-pod")),
	})
	g := got(2 * time.Second)
	if d := podReceived(before, podSNMP(t, p1)); len(d) != 0 || len(g) != 0 {
		t.Errorf("pod 1 received the stranger's forgeries claiming node 3's pod %s through node 1's DNAT: %v, datagrams %q (node 1's uplink drop_tunnel_source: %d)",
			a3, d, g, counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunSrc).Packets-drops0)
	}
}

// TestAttack8TunnelHostPortIntoIsolatedPod: a pod of node 3 dials node 1's
// address and a hostPort; node addresses are cluster CIDRs, so it keeps its
// address and the request comes out of the tunnel, where cni_from_tunnel
// DNATs it into the hostPort pod (docs/tunnel.md, "Pods to other nodes'
// addresses"). docs/networkpolicy.md: a hostPort into an isolated pod is
// judged by the receiver's ingress, on the pod's address and containerPort.
// The hostPort pod isolated for ingress and admitting nobody must not
// answer pod 3, through the hostPort as on its own address.
func TestAttack8TunnelHostPortIntoIsolatedPod(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	n1.Extra["networkPolicy"] = true
	for _, e := range lab.nodes {
		e.Extra["clusterCIDRs"] = []string{tunCluster, tunCluster6, tunNode[0].String() + "/32", tunNode[1].String() + "/32", tunNode[2].String() + "/32"}
	}
	startTunAgents(t, lab)
	p3, _ := n3.RunPod("c3")
	h1 := n1.NewPod()
	n1.CleanupDel(h1, "h1")
	r := n1.MustAddHP(h1, "h1", testenv.PM{HostPort: 11355, ContainerPort: 8080, Protocol: "tcp"},
		testenv.PM{HostPort: 11355, ContainerPort: 8080, Protocol: "udp"})
	a1, _ := testenv.PodIPs(t, r)
	serve(t, h1, 8080, "h1")
	_, idx := n1.HostVeth("h1")
	pw := n1.Maps().Policy().Writer()

	// Open: pod 3 reaches the hostPort pod both ways (the path works).
	if err := pw.Apply(uint32(idx), policy.Endpoint{}); err != nil {
		t.Fatal(err)
	}
	for _, proto := range []string{"tcp", "udp"} {
		if a, err := askFrom(p3, proto, hp(tunNode[0], 11355), 0); err != nil || a.server != "h1" {
			t.Fatalf("control: %s from pod 3 to node 1's hostPort with h1 open: %+v %v", proto, a, err)
		}
		reach(t, p3, proto, a1, 8080, "h1")
	}

	// Isolated for ingress, nobody admitted.
	if err := pw.Apply(uint32(idx), policy.Endpoint{Ingress: isolated()}); err != nil {
		t.Fatal(err)
	}
	for _, proto := range []string{"tcp", "udp"} {
		blocked(t, p3, proto, a1, 8080)
		blocked(t, p3, proto, tunNode[0], 11355)
	}
	if d := counter(t, n1.Maps(), idx, maps.DirIngress, maps.ReasonDropPolicy).Packets; d == 0 {
		t.Errorf("h1 counted no drop_policy ingress")
	}
}

// TestAttack8TunnelHostPortIngressLimit: docs/bandwidth.md and
// TestBandwidthHostPortIngress: a pod's ingress limit holds for what
// reaches it through its hostPort (the uplink program hands such packets to
// the host veth's queue). Through the tunnel, cni_from_tunnel DNATs a pod
// of another node's request at this node's address into the hostPort pod
// (docs/tunnel.md, "Pods to other nodes' addresses"): its stream must meet
// the same limit (at most 1.05x) and pass the same queue. The control, the
// same pod streaming to the pod's own address through the tunnel, does.
func TestAttack8TunnelHostPortIngressLimit(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	for _, e := range lab.nodes {
		e.Extra["clusterCIDRs"] = []string{tunCluster, tunCluster6, tunNode[0].String() + "/32", tunNode[1].String() + "/32", tunNode[2].String() + "/32"}
	}
	n1.Extra["capabilities"] = map[string]bool{"portMappings": true, "bandwidth": true}
	startTunAgents(t, lab)
	p3, _ := n3.RunPod("c3")
	h1 := n1.NewPod()
	n1.CleanupDel(h1, "h1")
	const rate = 20e6
	rt := n1.RuntimeConfHP(h1, "h1", []testenv.PM{{HostPort: 11356, ContainerPort: 80, Protocol: "tcp"}})
	rt.CapabilityArgs["bandwidth"] = bandwidthArgs(rate, 0)
	r, err := n1.AddList(n1.ConfList("1.0.0"), rt)
	if err != nil {
		t.Fatalf("ADD with a hostPort and an ingress limit: %v", err)
	}
	a1, _ := testenv.PodIPs(t, r)
	_, idx := n1.HostVeth("h1")
	for _, c := range []struct{ what, listen, dial string }{
		{"pod 3 to the pod's address (control)", hp(a1, 81), ""},
		{"pod 3 to node 1's hostPort", hp(a1, 80), hp(tunNode[0], 11356)},
	} {
		before := queueBytes(t, n1, idx)
		s := tcpStreamVia(t, p3, h1, c.listen, c.dial, 4*time.Second)
		queued := queueBytes(t, n1, idx) - before
		var got float64
		for _, bps := range s.intervals {
			got += bps / 8
		}
		t.Logf("%s at a %.0f Mbit/s ingress limit: mean %.3fx, %d retransmitted, %.2f MB of %.2f MB through the queue",
			c.what, rate/1e6, s.mean/rate, s.retrans, float64(queued)/1e6, got/1e6)
		if s.mean > 1.05*rate {
			t.Errorf("%s: mean %.1f Mbit/s over a %.0f Mbit/s ingress limit", c.what, s.mean/1e6, rate/1e6)
		}
		if float64(queued) < 0.9*got {
			t.Errorf("%s: %.2f MB passed the ingress queue of %.2f MB received: the stream went around it", c.what, float64(queued)/1e6, got/1e6)
		}
	}
}

// TestAttack8TunnelMasqueradedServiceAcross: kube-proxy with
// masqueradeAll (or any SNAT at POSTROUTING) masquerades a pod's ClusterIP
// connection; when the endpoint is a pod of another node, the translated
// packet goes into the tunnel. docs/networkpolicy.md admits "such a packet
// did not get through the tunnel here even with no policy: not
// investigated". A user expects a Service to answer whatever kube-proxy's
// masquerade setting: the same ClusterIP answers without the masquerade
// (the control), and must with it, TCP and UDP.
func TestAttack8TunnelMasqueradedServiceAcross(t *testing.T) {
	lab := newTunLab(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	startTunAgents(t, lab)
	p1, _ := n1.RunPod("c1")
	p3, r3 := n3.RunPod("c3")
	a3, _ := testenv.PodIPs(t, r3)
	serve(t, p3, 7001, "c3")
	proxyModes[0].install(t, n1.Node, 4, tunCluster, []net.IP{tunNode[0]}, []svcPort{
		{name: "m8t", proto: "tcp", clusterIP: svcWeb[4], port: 80, backend: a3, target: 7001},
		{name: "m8u", proto: "udp", clusterIP: svcWeb[4], port: 80, backend: a3, target: 7001},
	})
	for _, proto := range []string{"tcp", "udp"} {
		reach(t, p1, proto, svcWeb[4], 80, "c3")
	}
	if t.Failed() {
		t.Fatalf("control: the ClusterIP without masquerade did not answer")
	}
	must(t, n1.InNode(func() error {
		for _, chain := range []string{"KUBE-SVC-M8T", "KUBE-SVC-M8U"} {
			if out, err := exec.Command("iptables-nft", "-t", "nat", "-I", chain, "1", "-j", "KUBE-MARK-MASQ").CombinedOutput(); err != nil {
				return fmt.Errorf("%s: %v: %s", chain, err, out)
			}
		}
		return nil
	}))
	for _, proto := range []string{"tcp", "udp"} {
		a, err := askFrom(p1, proto, hp(svcWeb[4], 80), 0)
		if err != nil || a.server != "c3" {
			idx, _, _ := tunDevice(t, n1)
			t.Errorf("%s to the ClusterIP masqueraded by kube-proxy, endpoint pod 3 across the tunnel: %+v %v; node 1's ebpf-tun: %s",
				proto, a, err, dumpCounters(n1.Maps(), idx))
		} else {
			t.Logf("%s: pod 3 saw the client as %s", proto, a.peer)
		}
	}
}
