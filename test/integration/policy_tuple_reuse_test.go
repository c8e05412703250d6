// Hostile review 8, NetworkPolicy: a TCP 5-tuple reused for a new
// connection after the policy changed.

package integration

import (
	"bufio"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// dialFromPortRST connects from netns, bound to lport (SO_REUSEADDR), to
// addr within timeout, reads the server's answer line and closes with an
// RST (SO_LINGER 0): a client that sent data then aborts, leaving no
// TIME_WAIT, so the same 5-tuple can be dialled again at once.
func dialFromPortRST(netns ns.NetNS, addr string, lport int, timeout time.Duration) (string, error) {
	var line string
	err := netns.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{Port: lport},
			Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
				return serr
			}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer func() {
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		line, err = bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return fmt.Errorf("read answer: %w", err)
		}
		// Data, then the RST at the exact next sequence number.
		_, err = c.Write([]byte("bye\n"))
		return err
	})
	return line, err
}

// TestPolicyReusedTupleAfterRSTSeesNewPolicy: docs/networkpolicy.md
// promises "A flow outlives a policy change ...; new flows see the new
// rules". Pod a is isolated for ingress and admits b on TCP 8080; b
// connects from a fixed port, sends data and aborts (RST). a's policy then
// stops admitting b, and b dials a again from the same port: a new
// connection (a new SYN, a new ISN) on the old 5-tuple. It must be judged
// by the new rules and denied, as a connection from any other port of b's
// is; a flow entry left closing by the RST must not carry the old verdict
// over to a new connection (Linux conntrack starts a new entry for a SYN in
// CLOSE; Calico's and Cilium's policy then judge it anew).
func TestPolicyReusedTupleAfterRSTSeesNewPolicy(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	// Every interface starts pending: b open both ways.
	p.apply(t, "b", policy.Endpoint{})
	for i, fam := range []int{4, 6} {
		bAddr := p.ip["b"][fam]
		aAddr := p.ip["a"][fam]
		lport := 41000 + i
		admitB := isolated(allowPorts(host(bAddr), 6, 8080, 8080))
		p.apply(t, "a", policy.Endpoint{Ingress: admitB})
		if _, err := dialFromPortRST(p.b, hp(aAddr, 8080), lport, 3*time.Second); err != nil {
			t.Fatalf("IPv%d: b to a:8080 from port %d while a admits b: %v", fam, lport, err)
		}
		// The new policy: a admits nobody.
		p.apply(t, "a", policy.Endpoint{Ingress: isolated()})
		before := p.drops(t, "a", maps.DirIngress)
		// Control: b from another port is denied.
		if _, err := dialFromPortRST(p.b, hp(aAddr, 8080), lport+100, 700*time.Millisecond); err == nil {
			t.Fatalf("IPv%d: b reached a from a fresh port after a stopped admitting b: the lab is wrong", fam)
		}
		line, err := dialFromPortRST(p.b, hp(aAddr, 8080), lport, 700*time.Millisecond)
		if err == nil {
			t.Errorf("IPv%d: a new connection from b's port %d (the 5-tuple of the aborted flow) reached a after a stopped admitting b: answered %q (a's ingress drops: %d before, %d after)",
				fam, lport, line, before, p.drops(t, "a", maps.DirIngress))
		}
	}
}
