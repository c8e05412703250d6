// The one-pod policy lab (the deferral, RST and isolation tests): a node
// with NetworkPolicy on, the remote host beyond its uplink routed both
// ways, and pod a; and the TCP and UDP tools those tests share.

package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// podPolLab is hpEnv with NetworkPolicy on and pod a added.
type podPolLab struct {
	*hpEnv
	a   ns.NetNS
	aIP map[int]net.IP // a's address of each family
	idx int            // a's host veth
	m   *maps.Maps
	w   *maps.PolicyWriter
}

func newPodPolLab(t *testing.T) *podPolLab {
	t.Helper()
	return newPodPolLabWith(t, nil)
}

// newPodPolLabWith is newPodPolLab with extra set in the network
// configuration before a's ADD.
func newPodPolLabWith(t *testing.T, extra map[string]any) *podPolLab {
	t.Helper()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	for k, v := range extra {
		h.Extra[k] = v
	}
	for _, fam := range []int{4, 6} {
		routeVia(t, h.Node, "", remoteIP[fam])
		routeVia(t, h.remote, cluster[fam], uplinkIP[fam])
	}
	a, r := h.RunPod("a")
	a4, a6 := resultIPs(r)
	_, idx := h.HostVeth("a")
	m := h.Maps()
	return &podPolLab{hpEnv: h, a: a, aIP: map[int]net.IP{4: a4, 6: a6}, idx: idx, m: m, w: m.Policy().Writer()}
}

// apply gives a the policy ep.
func (l *podPolLab) apply(t *testing.T, ep policy.Endpoint) {
	t.Helper()
	must(t, l.w.Apply(uint32(l.idx), ep))
}

// repliesDropped wants no answer over proto from ip:port to pod a and its
// policy's ingress drop counter raised: the answers came and were dropped
// at the pod's door (to_container), not lost elsewhere.
func (l *podPolLab) repliesDropped(t *testing.T, proto string, ip net.IP, port int) {
	t.Helper()
	before := counter(t, l.m, l.idx, maps.DirIngress, maps.ReasonDropPolicy).Packets
	blocked(t, l.a, proto, ip, port)
	if after := counter(t, l.m, l.idx, maps.DirIngress, maps.ReasonDropPolicy).Packets; after <= before {
		t.Errorf("%s %s: a's drop_policy ingress counter stayed at %d: no answer was dropped at a's door", proto, hp(ip, port), after)
	}
}

// acceptTCP listens on addr (tcp4 or tcp6 by fam) in netns and hands over
// every connection it accepts; all are closed when the test ends.
func acceptTCP(t *testing.T, netns ns.NetNS, fam int, addr string) <-chan net.Conn {
	t.Helper()
	var ln net.Listener
	must(t, netns.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen(fmt.Sprintf("tcp%d", fam), addr)
		return err
	}))
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			accepted <- c
		}
	}()
	return accepted
}

// connPair is one TCP connection: the side that dialled and the side
// that accepted.
type connPair struct {
	name        string
	fam         int
	client, srv net.Conn
}

// dialPair dials addr from netns and takes its other end from accepted.
func dialPair(t *testing.T, from ns.NetNS, addr string, accepted <-chan net.Conn, name string, fam int) connPair {
	t.Helper()
	var c net.Conn
	must(t, from.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 2*time.Second)
		return err
	}))
	t.Cleanup(func() { c.Close() })
	select {
	case s := <-accepted:
		return connPair{name, fam, c, s}
	case <-time.After(3 * time.Second):
		t.Fatalf("%s v%d: nothing accepted %s", name, fam, addr)
	}
	return connPair{}
}

// hopLimit1 makes ln's datagrams die at the first router: the node's
// stack drops them before any judgement after the stack.
func hopLimit1(t *testing.T, ln *net.UDPConn, fam int) {
	t.Helper()
	rc, err := ln.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	must(t, rc.Control(func(fd uintptr) {
		if fam == 4 {
			err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TTL, 1)
		} else {
			err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, 1)
		}
	}))
	must(t, err)
}
