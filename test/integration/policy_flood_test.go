// The NetworkPolicy flow table cannot be flushed by another pod, nor by a
// host that a pod's policy lets open flows to it (issue 23: cni_pol_ct was
// one LRU for the node; an evicted flow's replies were judged as new
// packets and dropped).

package integration

import (
	"bufio"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// idleConn is a TCP connection from a pod to a server that speaks only
// when told: the pod's side and the server's.
type idleConn struct{ cli, srv net.Conn }

// dialIdle connects from netns to ip:port, where ln (in the server's netns)
// accepts.
func dialIdle(t *testing.T, from ns.NetNS, ln net.Listener, ip net.IP, port int) idleConn {
	t.Helper()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	var cli net.Conn
	must(t, from.Do(func(ns.NetNS) (err error) {
		cli, err = net.DialTimeout("tcp", hp(ip, port), 5*time.Second)
		return
	}))
	t.Cleanup(func() { cli.Close() })
	select {
	case srv := <-accepted:
		t.Cleanup(func() { srv.Close() })
		return idleConn{cli, srv}
	case <-time.After(5 * time.Second):
		t.Fatalf("nothing accepted %s", hp(ip, port))
	}
	return idleConn{}
}

// serverSpeaks: the server writes a line and the pod must read it: the
// server's segment is the flow's reply (or its peer's packet), which the
// pod's ingress rules alone deny.
func (c idleConn) serverSpeaks(t *testing.T, what string) {
	t.Helper()
	if _, err := c.srv.Write([]byte("pong\n")); err != nil {
		t.Fatalf("%s: server write: %v", what, err)
	}
	c.cli.SetReadDeadline(time.Now().Add(3 * time.Second))
	if got, err := bufio.NewReader(c.cli).ReadString('\n'); err != nil || got != "pong\n" {
		t.Errorf("%s: the pod read %q, %v; want the server's line", what, got, err)
	}
}

// TestPolicyFlowFlood: pod a holds an idle TCP connection to a remote server
// that its egress rules allow and its ingress rules (which allow nothing)
// would not. Pod b opens 80000 UDP flows to the remote host (a raw socket,
// as any pod can); then b opens an idle connection like a's (its ingress
// rules allow the remote host UDP only), and the remote host opens 80000
// UDP flows to b. After each flood the server speaks on the connections,
// and each pod must get the line:
// a flood evicts nothing of another pod's flows, and flows that peers open
// to a pod evict nothing of the flows the pod opened. Before per-pod
// tables, both floods emptied the node-wide table (14080 entries at the
// default maxPods) and the servers' segments were dropped by the pods'
// ingress rules. IPv4 and IPv6.
func TestPolicyFlowFlood(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	const port = 7100
	lns := map[int]net.Listener{}
	for _, fam := range []int{4, 6} {
		must(t, p.remote.Do(func(ns.NetNS) (err error) {
			lns[fam], err = net.Listen(fmt.Sprintf("tcp%d", fam), fmt.Sprintf(":%d", port))
			return
		}))
		defer lns[fam].Close()
	}
	var aOut, bOut, bIn []policy.Allow
	for _, fam := range []int{4, 6} {
		r := host(remoteIP[fam])
		aOut = append(aOut, allowPorts(r, policy.ProtoTCP, port, port))
		bOut = append(bOut, policy.Allow{Prefix: r, Ports: []policy.PortRange{
			{Proto: policy.ProtoTCP, First: port, Last: port}, {Proto: policy.ProtoUDP, First: 0, Last: 65535}}})
		bIn = append(bIn, allowPorts(r, policy.ProtoUDP, 0, 65535))
	}
	p.apply(t, "a", policy.Endpoint{Ingress: isolated(), Egress: isolated(aOut...)})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(bIn...), Egress: isolated(bOut...)})
	p.apply(t, "h", policy.Endpoint{})

	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("v%d", fam), func(t *testing.T) {
			a := dialIdle(t, p.a, lns[fam], remoteIP[fam], port)

			// A pod flooding its own flows out.
			must(t, rawUDPFlood(p.b, remoteIP[fam], []uint16{9, 10}))
			time.Sleep(500 * time.Millisecond)
			t.Logf("flow entries after b's flood: a %d, b %d", len(flowsOf(t, p, "a")), len(flowsOf(t, p, "b")))
			a.serverSpeaks(t, "a's idle connection after b flooded flows out")

			// A host outside opening flows to a pod, which its policy allows.
			// (b's connection is younger than its own flood, which its own
			// table's LRU may well have evicted.)
			b := dialIdle(t, p.b, lns[fam], remoteIP[fam], port)
			must(t, rawUDPFlood(p.remote, p.ip["b"][fam], []uint16{9, 10}))
			time.Sleep(500 * time.Millisecond)
			t.Logf("flow entries after the remote host's flood of b: a %d, b %d", len(flowsOf(t, p, "a")), len(flowsOf(t, p, "b")))
			a.serverSpeaks(t, "a's idle connection after the remote host flooded b")
			b.serverSpeaks(t, "b's own idle connection after the remote host flooded b")
		})
	}
}

// TestPolicyFlowTablesLifecycle: ADD on a networkPolicy network gives the
// pod's host veth its two flow tables (none without networkPolicy), DEL
// drops them, and the agent's reconcile drops tables whose veth is gone
// without a DEL (a killed ADD, a lost pod).
func TestPolicyFlowTablesLifecycle(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	pod := h.NewPod()
	h.CleanupDel(pod, "p")
	h.Add(pod, "p")
	_, idx := h.HostVeth("p")
	m := h.Maps()
	has := func(i int) bool {
		t.Helper()
		ids, err := m.Policy().FlowTables()
		must(t, err)
		for _, x := range ids {
			if x == i {
				return true
			}
		}
		return false
	}
	if !has(idx) {
		t.Fatalf("no policy flow tables for the pod's host veth %d after ADD", idx)
	}
	must(t, h.Del(pod, "p", "eth0"))
	if has(idx) {
		t.Errorf("the policy flow tables of host veth %d outlived DEL", idx)
	}

	// Without networkPolicy: no tables (the programs never judge the pod).
	delete(h.Extra, "networkPolicy")
	plain := h.NewPod()
	h.CleanupDel(plain, "q")
	h.Add(plain, "q")
	if _, qi := h.HostVeth("q"); has(qi) {
		t.Errorf("a pod of a network without networkPolicy got policy flow tables (host veth %d)", qi)
	}

	const gone = 999999 // no such link
	must(t, m.Policy().AddFlowTables(gone))
	confDir := h.WriteConfDir()
	if out, err := h.AgentCmd(append([]string{"reconcile"}, h.AgentArgs(confDir)...)...); err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	if has(gone) {
		t.Errorf("reconcile left the policy flow tables of ifindex %d, which has no link", gone)
	}
}

// TestPolicyFlowTablesRestored: a policy interface without flow tables (a
// pod attached by a build that kept every pod's flows in one node-wide
// table, or whose tables were lost) records no flow, so the replies of its
// allowed connections are judged by its ingress rules and dropped; the
// agent's reconcile gives it its tables back, after which they pass. IPv4
// and IPv6.
func TestPolicyFlowTablesRestored(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	var out []policy.Allow
	for _, fam := range []int{4, 6} {
		out = append(out, allowPorts(host(remoteIP[fam]), policy.ProtoTCP, 7000, 7000))
	}
	p.apply(t, "a", policy.Endpoint{Ingress: isolated(), Egress: isolated(out...)})
	for _, fam := range []int{4, 6} {
		reach(t, p.a, "tcp", remoteIP[fam], 7000, "remote")
	}
	idx := int(p.idx["a"])
	must(t, p.m.Policy().DeleteFlowTables(idx))
	for _, fam := range []int{4, 6} {
		blocked(t, p.a, "tcp", remoteIP[fam], 7000) // the SYN passes, the SYN-ACK is denied
	}
	confDir := p.WriteConfDir()
	if o, err := p.AgentCmd(append([]string{"reconcile"}, p.AgentArgs(confDir)...)...); err != nil {
		t.Fatalf("reconcile: %v\n%s", err, o)
	}
	ids, err := p.m.Policy().FlowTables()
	must(t, err)
	if !slices.Contains(ids, idx) {
		t.Fatalf("reconcile did not give ifindex %d its flow tables back (tables of %v)", idx, ids)
	}
	for _, fam := range []int{4, 6} {
		reach(t, p.a, "tcp", remoteIP[fam], 7000, "remote")
	}
}
