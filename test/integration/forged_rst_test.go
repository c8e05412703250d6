// A blind RST from the wire, its sequence number nowhere near the window,
// must not close a tracked flow (bpf/lib/tcpseq.h): neither a pod's
// policy flow nor a hostPort flow of cni_ct. The kernel ignores such an
// RST (RFC 5961); the tracking closing on it cut the flow 10 s later.

package integration

import (
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// controlAndForged dials, per family, a "control" and a "forged-rst"
// connection from client to addr(fam), each accepted in srv at listen(fam).
func controlAndForged(t *testing.T, srv ns.NetNS, listen func(fam int) string, client ns.NetNS, addr func(fam int) string) []connPair {
	t.Helper()
	var pairs []connPair
	for _, fam := range []int{4, 6} {
		accepted := acceptTCP(t, srv, fam, listen(fam))
		for _, name := range []string{"control", "forged-rst"} {
			pairs = append(pairs, dialPair(t, client, addr(fam), accepted, name, fam))
		}
	}
	return pairs
}

// blindRSTs sends, from remote's eth0 to node's uplink0, an RST whose
// sequence number is nowhere near the window for each "forged-rst" pair,
// between the addresses and ports ends gives it.
func blindRSTs(t *testing.T, remote, node ns.NetNS, pairs []connPair, ends func(connPair) (src net.IP, sport int, dst net.IP, dport int)) {
	t.Helper()
	from, to := linkMAC(t, remote, "eth0"), linkMAC(t, node, "uplink0")
	for _, p := range pairs {
		if p.name != "forged-rst" {
			continue
		}
		src, sport, dst, dport := ends(p)
		sendFrames(t, remote, "eth0", [][]byte{tcpFrame(from, to, src, sport, dst, dport, 0x0badf00d, 0, 0x04, 0)})
	}
}

// TestPolicyForgedRSTLeavesAllowedFlow: a's ingress is isolated (allows
// nothing), its egress open; it holds a TCP connection to a server off the
// node, which pushes data now and then (a watch, a subscription). Any host
// on the wire sends a an RST posing as that server, with a sequence number
// nowhere near the window: a's kernel ignores it (RFC 5961; conntrack
// ignores it too), but flow_next marked the flow entry closing on any RST
// (bpf/lib/flowlife.h), whose timeout is 10 s idle. After 10 s of quiet
// the entry was gone; the server's next segment was a new flow to the
// rules, which denied it: the connection was dead while a's kernel still
// held it open, and stayed dead until a sent first. The same connection
// without the forged RST (control) gets its data.
func TestPolicyForgedRSTLeavesAllowedFlow(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	l.apply(t, policy.Endpoint{Ingress: isolated()})
	const port = 7100
	srv := func(fam int) string { return hp(remoteIP[fam], port) }
	pairs := controlAndForged(t, l.remote, srv, l.a, srv)
	blindRSTs(t, l.remote, l.Node, pairs, func(p connPair) (net.IP, int, net.IP, int) {
		return remoteIP[p.fam], port, l.aIP[p.fam], p.client.LocalAddr().(*net.TCPAddr).Port
	})
	time.Sleep(11 * time.Second) // past the closing timeout (10 s idle)
	for _, p := range pairs {
		if _, err := p.srv.Write([]byte("pushed")); err != nil {
			t.Fatalf("%s v%d: server write: %v", p.name, p.fam, err)
		}
	}
	for _, p := range pairs {
		buf := make([]byte, 16)
		p.client.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, err := p.client.Read(buf)
		if err != nil || string(buf[:n]) != "pushed" {
			t.Errorf("IPv%d %s: a's read of the server's push: %q, %v; want it delivered (a's kernel ignored the out-of-window RST, so must its policy)", p.fam, p.name, buf[:n], err)
		}
	}
}

// TestHostPortForgedRSTLeavesFlow: a client off the node holds a TCP
// connection to a pod's hostPort, quiet for a while. A blind host on the
// wire sends the node an RST posing as that client, its sequence number
// nowhere near the window. The masquerade checks an RST against the window
// (tcpseq.h, TestMasqForgedRSTs); hostPort's cni_ct did not: ct_track
// marked the flow closing on any RST (flow_next), its timer deleted it 10 s
// later, and the client's next segment was not translated (a non-SYN
// segment of no known flow): the connection was dead while both ends held
// it open. The same connection without the RST (control) carries on.
func TestHostPortForgedRSTLeavesFlow(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	p := h.NewPod()
	h.CleanupDel(p, "web")
	const hostPort = 8090
	h.MustAddHP(p, "web", testenv.PM{HostPort: hostPort, ContainerPort: 80, Protocol: "tcp"})
	pairs := controlAndForged(t, p, func(int) string { return ":80" }, h.remote,
		func(fam int) string { return hp(uplinkIP[fam], hostPort) })
	blindRSTs(t, h.remote, h.Node, pairs, func(q connPair) (net.IP, int, net.IP, int) {
		return remoteIP[q.fam], q.client.LocalAddr().(*net.TCPAddr).Port, uplinkIP[q.fam], hostPort
	})
	time.Sleep(11 * time.Second) // past the closing timeout (10 s)
	for _, q := range pairs {
		if _, err := q.client.Write([]byte("later")); err != nil {
			t.Errorf("IPv%d %s: client write: %v", q.fam, q.name, err)
			continue
		}
		buf := make([]byte, 16)
		q.srv.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, err := q.srv.Read(buf)
		if err != nil || string(buf[:n]) != "later" {
			t.Errorf("IPv%d %s: the pod's read of the client's segment: %q, %v; want it delivered (the RST was out of the window: the pod's TCP ignored it)", q.fam, q.name, buf[:n], err)
		}
	}
}
