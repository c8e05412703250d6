// A pod address of a node reached through the tunnel, forged in the clear
// (docs/tunnel.md, "Only nodes may tunnel"): such a source only ever
// arrives decapsulated, so an ordinary packet off the wire claiming it is
// a forgery, which a NetworkPolicy admitting that node's pod would admit.

package integration

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// podSNMP reads the counters of a pod's netns that show what reached its
// stack: TCP segments, UDP datagrams (to a socket or to none) and echo
// requests, IPv4 and IPv6.
func podSNMP(t *testing.T, pod ns.NetNS) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	must(t, pod.Do(func(ns.NetNS) error {
		// thread-self: Do runs on a thread locked into the pod's netns.
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			for j := 1; j < len(names) && j < len(vals); j++ {
				v, _ := strconv.ParseInt(vals[j], 10, 64)
				out[strings.TrimSuffix(names[0], ":")+names[j]] = v
			}
		}
		b, err = os.ReadFile("/proc/thread-self/net/snmp6")
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 2 {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				out[f[0]] = v
			}
		}
		return nil
	}))
	return out
}

// podReceived is how many TCP segments, UDP datagrams and echo requests
// the pod's stack took in between two podSNMP readings.
func podReceived(before, after map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for _, k := range []string{"TcpInSegs", "UdpInDatagrams", "UdpNoPorts", "IcmpInEchos",
		"Udp6InDatagrams", "Udp6NoPorts", "Icmp6InEchos"} {
		if n := after[k] - before[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

// forgedToPod is a TCP SYN, a UDP datagram and an echo request from src to
// dst (one family), in frames from the attacker's MAC to the node's.
func forgedToPod(from, to net.HardwareAddr, src, dst net.IP) [][]byte {
	echo := []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1, 'f', 'o', 'r', 'g', 'e', 'd'}
	icmp := l4Frame(from, to, src, dst, 1, icmp4(echo), -1)
	if src.To4() == nil {
		echo[0] = 128
		icmp = l4Frame(from, to, src, dst, 58, echo, 2)
	}
	return [][]byte{
		tcpFrame(from, to, src, 40001, dst, 9980, 1000, 0, tcpSYN, 64240),
		udpFrame(from, to, src, 40002, dst, 9981, []byte("forged-udp")),
		icmp,
	}
}

// forgedToPort is a TCP SYN from sport and a UDP datagram (payload) from
// sport+1, src to dst's dport (one family), in frames from the attacker's
// MAC to the node's.
func forgedToPort(from, to net.HardwareAddr, src, dst net.IP, sport, dport int, payload string) [][]byte {
	return [][]byte{
		tcpFrame(from, to, src, sport, dst, dport, 1000, 0, tcpSYN, 64240),
		udpFrame(from, to, src, sport+1, dst, dport, []byte(payload)),
	}
}

// TestTunnelClearForgedPeerPodSource: on hybrid VXLAN, the stranger on node
// 1's subnet sends plain (not encapsulated) TCP SYN, UDP and ICMP echo
// packets claiming a pod address of node 3 (reached through the tunnel) to
// a pod of node 1, IPv4 (node 1 at rp_filter=2, loose: the source is
// routable, through ebpf-tun) and IPv6 (no reverse-path check). The pod
// must receive none of them; each is counted on node 1's uplink as
// drop_tunnel_source, with an event. Controls: node 3's pod reaches node
// 1's pod through the tunnel, and node 2's pod (a direct node: same
// subnet, plain routing) reaches it in the clear, both families. Red
// before from_uplink judged a clear source against cni_tun_cidrs: the six
// forgeries were delivered.
func TestTunnelClearForgedPeerPodSource(t *testing.T) {
	lab := newTunLab(t)
	n1 := lab.nodes[0]
	looseRPFilter(t, n1)
	startTunAgents(t, lab, "--tunnel-hybrid")
	pods, v4, v6 := lab.podPerNode(t, "f")
	p1, p2, p3 := pods[0], pods[1], pods[2]
	a1, a2, a3 := v4[0], v4[1], v4[2]
	a16, a26, a36 := v6[0], v6[1], v6[2]
	up1 := uplinkIndex(t, n1)
	m1 := n1.Maps()

	// Controls: node 3's pod through the tunnel, node 2's directly.
	got4 := listenUDP4(t, p1, 9990)
	got6 := listenUDP6(t, p1, 9990)
	sendUDPFrom(t, p3, a1, 9990, []byte("pod3-tunnel"))
	sendUDPFrom(t, p2, a1, 9990, []byte("pod2-direct"))
	sendUDPFrom(t, p3, a16, 9990, []byte("pod3-tunnel6"))
	sendUDPFrom(t, p2, a16, 9990, []byte("pod2-direct6"))
	arrived := append(got4(3*time.Second), got6(time.Second)...)
	for _, want := range missing(arrived, []string{"pod3-tunnel from " + a3.String(), "pod2-direct from " + a2.String(),
		"pod3-tunnel6 from [" + a36.String() + "]", "pod2-direct6 from [" + a26.String() + "]"}) {
		t.Errorf("pod 1 did not receive %q (got %q)", want, arrived)
	}
	if n := counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunSrc).Packets; n != 0 {
		t.Errorf("%d drop_tunnel_source on node 1's uplink of genuine traffic", n)
	}

	// The forgeries, from the stranger's own MAC: what a host on the link
	// can send with any source address.
	strMAC, n1MAC := linkMAC(t, lab.strang, "uplink0"), linkMAC(t, n1.Node, "uplink0")
	seq := lastSeq(t, n1)
	before := podSNMP(t, p1)
	frames := append(forgedToPod(strMAC, n1MAC, a3, a1), forgedToPod(strMAC, n1MAC, a36, a16)...)
	sendFrames(t, lab.strang, "uplink0", frames)
	time.Sleep(time.Second)
	if d := podReceived(before, podSNMP(t, p1)); len(d) != 0 {
		t.Errorf("pod 1 received forged packets claiming node 3's pod %s / %s from the stranger: %v", a3, a36, d)
	}
	evs := tunDropEvents(t, n1, up1, maps.DirIngress, maps.ReasonDropTunSrc, 0, 6, seq)
	seen := map[string]bool{}
	for _, ev := range evs {
		seen[ev.Src+" "+ev.Protocol] = true
	}
	for _, s := range []net.IP{a3, a36} {
		for _, proto := range []string{"tcp", "udp"} {
			if !seen[s.String()+" "+proto] {
				t.Errorf("no drop_tunnel_source event of %s from %s: %+v", proto, s, evs)
			}
		}
	}

	// Node 3's and node 2's pods still reach pod 1 afterwards.
	sendUDPFrom(t, p3, a1, 9990, []byte("pod3-again"))
	sendUDPFrom(t, p2, a16, 9990, []byte("pod2-again6"))
	if arrived := append(got4(2*time.Second), got6(time.Second)...); len(arrived) != 2 {
		t.Errorf("pod 1 received %q after the forgeries, want pod 3's and pod 2's datagrams", arrived)
	}
}

// listenUDP6 is listenUDP4 for IPv6.
func listenUDP6(t *testing.T, pod ns.NetNS, port int) func(wait time.Duration) []string {
	t.Helper()
	return listenUDP(t, pod, "udp6", port)
}

// listenUDP is listenUDP6 for network "udp4" or "udp6".
func listenUDP(t *testing.T, pod ns.NetNS, network string, port int) func(wait time.Duration) []string {
	t.Helper()
	var pc net.PacketConn
	must(t, pod.Do(func(ns.NetNS) error {
		var err error
		pc, err = net.ListenPacket(network, ":"+strconv.Itoa(port))
		return err
	}))
	t.Cleanup(func() { pc.Close() })
	return func(wait time.Duration) []string {
		var out []string
		buf := make([]byte, 2048)
		pc.SetReadDeadline(time.Now().Add(wait))
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return out
			}
			out = append(out, string(buf[:n])+" from "+from.String())
		}
	}
}

// TestTunnelClearPeerPodSourceToNode: a rolling upgrade (docs/tunnel.md,
// check 5). Node 3 plays a node of the previous build, which has no table
// 199: its agent stopped, its rules `from <its pod CIDRs> lookup 199`
// removed, so its pod's packets to node 1's addresses cross the router in
// the clear with the pod's source (node addresses are cluster CIDRs: no
// masquerade). Node 1 (rp_filter=2) lets them reach its hostNetwork server,
// TCP and UDP, IPv4 and IPv6, the server seeing the pod's address, and
// drops none as drop_tunnel_source. Still dropped: the stranger's TCP SYN
// and UDP datagram claiming node 3's pod to node 1's hostPort, which
// cni_from_uplink would DNAT into the hostPort pod (its stack counts
// none; four drop_tunnel_source). Red before check 5 told a node address
// apart: the four exchanges with the server timed out.
func TestTunnelClearPeerPodSourceToNode(t *testing.T) {
	lab := newTunLab6(t)
	n1, n3 := lab.nodes[0], lab.nodes[2]
	looseRPFilter(t, n1)
	lab.nodesInCluster(true)
	agents := startTunAgents(t, lab)
	p3, r3 := n3.RunPod("old3")
	a3, a36 := testenv.PodIPs(t, r3)
	hp1 := hostPortPod(n1, "hpo1", 11311)
	serve(t, hp1, 8080, "hpo1")
	serve(t, n1.Node, 8083, "node1")
	testenv.WaitIPv6Ready(t, p3)
	// This build's node 3: through the tunnel (table 199: nodes 1 and 2,
	// two addresses each).
	tunNodeTable(t, n3, 4)
	mustAsk(t, p3, "tcp", hp(tunNode[0], 8083), 0, "node1", a3)

	// The previous build's node 3: no table 199 consulted.
	agents[2].Stop()
	p4, p6 := tunPods(2)
	must(t, n3.InNode(func() error {
		return ipCmds([]string{"-4", "rule", "del", "from", p4, "lookup", "199"}, []string{"-6", "rule", "del", "from", p6, "lookup", "199"})
	}))
	if rules := tunNodeRules(t, n3); len(rules) != 0 {
		t.Fatalf("node 3 still has rules to table 199: %q", rules)
	}
	up1 := uplinkIndex(t, n1)
	m1 := n1.Maps()
	drops0 := counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunSrc).Packets
	_, _, tx0 := tunDevice(t, n3)
	for _, proto := range []string{"tcp", "udp"} {
		mustAsk(t, p3, proto, hp(tunNode[0], 8083), 0, "node1", a3)
		mustAsk(t, p3, proto, hp(tunNode6[0], 8083), 0, "node1", a36)
	}
	if _, _, tx := tunDevice(t, n3); tx-tx0 > 1 {
		t.Errorf("node 3's ebpf-tun sent %d packets: the requests were to cross in the clear", tx-tx0)
	}
	if n := counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunSrc).Packets - drops0; n != 0 {
		t.Errorf("node 1's uplink dropped %d packets of node 3's pod in the clear to its address", n)
	}

	// Forged to node 1's hostPort: dropped before the DNAT into the pod.
	strMAC, n1MAC := linkMAC(t, lab.strang, "uplink0"), linkMAC(t, n1.Node, "uplink0")
	before := podSNMP(t, hp1)
	sendFrames(t, lab.strang, "uplink0", append(forgedToPort(strMAC, n1MAC, a3, tunNode[0], 40011, 11311, "forged-hostport"),
		forgedToPort(strMAC, n1MAC, a36, tunNode6[0], 40011, 11311, "forged-hostport")...))
	time.Sleep(time.Second)
	if d := podReceived(before, podSNMP(t, hp1)); len(d) != 0 {
		t.Errorf("node 1's hostPort pod received forged packets claiming node 3's pod %s / %s: %v", a3, a36, d)
	}
	if n := counter(t, m1, up1, maps.DirIngress, maps.ReasonDropTunSrc).Packets - drops0; n != 4 {
		t.Errorf("node 1's uplink counted %d drop_tunnel_source, want the 4 forgeries to its hostPort", n)
	}
}
