// A policy that isolates a pod later keeps the replies of the flows the
// pod had (docs/networkpolicy.md, "A flow outlives a policy change").

package integration

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestPolicyIsolationKeepsRepliesOfOpenPodsFlows: a pod open both ways
// holds a TCP connection it opened to a server off the node, which pushes
// data now and then. Then a policy isolates its ingress (a namespace's
// default-deny-ingress): its egress stays open, so the replies of its own
// connections must still pass (NetworkPolicy allows the replies of allowed
// flows; docs/networkpolicy.md: "A flow outlives a policy change",
// "Established flows are not cut"). But while a pod was open both ways
// policy_judge recorded no flow (it returned at once), so after the change
// the server's segments found no entry and the ingress rules denied them:
// the connection stalled until the pod happened to send first. A
// connection opened after the change (control) gets its data.
func TestPolicyIsolationKeepsRepliesOfOpenPodsFlows(t *testing.T) {
	t.Parallel()
	l := newPodPolLab(t)
	l.apply(t, policy.Endpoint{})
	const port = 7101
	accepted := map[int]<-chan net.Conn{}
	for _, fam := range []int{4, 6} {
		accepted[fam] = acceptTCP(t, l.remote, fam, hp(remoteIP[fam], port))
	}
	dial := func(name string, fam int) connPair {
		return dialPair(t, l.a, hp(remoteIP[fam], port), accepted[fam], name, fam)
	}
	push := func(p connPair, msg string) {
		if _, err := p.srv.Write([]byte(msg)); err != nil {
			t.Fatalf("%s v%d: server write: %v", p.name, p.fam, err)
		}
		buf := make([]byte, 32)
		p.client.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, err := p.client.Read(buf)
		if err != nil || string(buf[:n]) != msg {
			t.Errorf("IPv%d %s: a's read of the server's %q: %q, %v; want it delivered", p.fam, p.name, msg, buf[:n], err)
		}
	}
	var before []connPair
	for _, fam := range []int{4, 6} {
		p := dial("opened-while-open", fam)
		push(p, "before")
		before = append(before, p)
	}
	l.apply(t, policy.Endpoint{Ingress: isolated()})
	for _, fam := range []int{4, 6} {
		push(dial("opened-after-isolation", fam), "control")
	}
	for _, p := range before {
		push(p, "after")
	}

	// The mirror case: a serves a connection the remote host opened while
	// a's egress was open; a policy then isolates a's egress (ingress stays
	// isolated, allowing the remote). a's answers are replies of an
	// allowed flow: they must pass. A connection opened after the change
	// (control) gets its answers too.
	const sport = 7102
	served := map[int]<-chan net.Conn{}
	for _, fam := range []int{4, 6} {
		served[fam] = acceptTCP(t, l.a, fam, hp(l.aIP[fam], sport))
	}
	allowRemote := func(fam int) policy.Allow {
		bits := 32
		if fam == 6 {
			bits = 128
		}
		addr, _ := netip.AddrFromSlice(remoteIP[fam])
		return policy.Allow{Prefix: netip.PrefixFrom(addr.Unmap(), bits), AllPorts: true}
	}
	ingress := isolated(allowRemote(4), allowRemote(6))
	l.apply(t, policy.Endpoint{Ingress: ingress})
	// client: the remote's side (it reads what a writes), srv: a's.
	answer := func(p connPair, msg string) {
		if _, err := p.srv.Write([]byte(msg)); err != nil {
			t.Fatalf("%s v%d: a's write: %v", p.name, p.fam, err)
		}
		buf := make([]byte, 32)
		p.client.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, err := p.client.Read(buf)
		if err != nil || string(buf[:n]) != msg {
			t.Errorf("IPv%d %s: the remote's read of a's %q: %q, %v; want it delivered", p.fam, p.name, msg, buf[:n], err)
		}
	}
	dialIn := func(name string, fam int) connPair {
		return dialPair(t, l.remote, hp(l.aIP[fam], sport), served[fam], name, fam)
	}
	var served0 []connPair
	for _, fam := range []int{4, 6} {
		p := dialIn("served-while-egress-open", fam)
		answer(p, "before")
		served0 = append(served0, p)
	}
	l.apply(t, policy.Endpoint{Ingress: ingress, Egress: isolated()})
	for _, fam := range []int{4, 6} {
		answer(dialIn("served-after-egress-isolation", fam), "control")
	}
	for _, p := range served0 {
		answer(p, "after")
	}
}
