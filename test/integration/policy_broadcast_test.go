package integration

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// groupAnswered sends a datagram from pod to dst (a broadcast or multicast
// group, on the pod's eth0) and says whether any server answered it, and who.
func groupAnswered(t *testing.T, pod ns.NetNS, dst *net.UDPAddr) (string, bool) {
	t.Helper()
	var got string
	err := pod.Do(func(ns.NetNS) error {
		network := "udp4"
		if dst.IP.To4() == nil {
			network = "udp6"
		}
		c, err := net.ListenUDP(network, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		rc.Control(func(fd uintptr) {
			if network == "udp4" {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1)
			}
		})
		buf := make([]byte, 512)
		for try := 0; try < 3; try++ {
			if _, err := c.WriteToUDP([]byte("probe"), dst); err != nil {
				return fmt.Errorf("send to %s: %w", dst, err)
			}
			c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if n, _, err := c.ReadFromUDP(buf); err == nil {
				got = string(buf[:n])
				return nil
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s from the pod: %v", dst, err)
	}
	return got, got != ""
}

// TestPolicyEgressGroupToNode: a pod whose egress allows nothing (pending,
// then isolated with no rule) must not reach the node's UDP services
// through broadcast or multicast either. Such a datagram is no pod's and no
// node address's, so from_container defers it to the judgement after the
// stack's translation (to_container, to_uplink); but the stack delivers it
// to the node's own sockets, where neither runs, and the node's unicast
// answer enters the pod as the node's traffic: a full exchange with any
// node service bound to the wildcard address (NTP, DNS caches, rpcbind),
// which the same pod's unicast packets to the node's address cannot make.
func TestPolicyEgressGroupToNode(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	a := h.NewPod()
	h.CleanupDel(a, "a")
	h.Add(a, "a")
	_, idx := h.HostVeth("a")
	serve(t, h.Node, 9093, "node")
	dsts := []*net.UDPAddr{
		{IP: net.IPv4bcast, Port: 9093},
		{IP: net.IPv4allsys, Port: 9093},
		{IP: net.IPv6linklocalallnodes, Port: 9093, Zone: "eth0"},
	}
	check := func(t *testing.T) {
		for _, fam := range []int{4, 6} {
			blocked(t, a, "udp", nodeIP[fam], 9093) // unicast: judged, denied
		}
		for _, d := range dsts {
			if who, ok := groupAnswered(t, a, d); ok {
				t.Errorf("UDP to %s: answered %q, want the pod's egress to deny it", d, strings.TrimSpace(who))
			}
		}
	}
	t.Run("pending", check)
	w := h.Maps().PolicyWriter()
	if err := w.Apply(uint32(idx), policy.Endpoint{Egress: isolated()}); err != nil {
		t.Fatal(err)
	}
	t.Run("isolated", check)
}
