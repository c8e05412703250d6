package integration

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// groupAnswered sends a datagram from pod (from src, nil: the kernel's
// choice) to dst (a broadcast or multicast group, or a link-local address,
// on the pod's eth0) and says whether any server answered it, and who.
func groupAnswered(t *testing.T, pod ns.NetNS, src net.IP, dst *net.UDPAddr) (string, bool) {
	t.Helper()
	var got string
	err := pod.Do(func(ns.NetNS) error {
		if dst.Zone != "" {
			// By index: Go caches interface names process-wide, and every
			// pod has an eth0.
			l, err := netlink.LinkByName(dst.Zone)
			if err != nil {
				return err
			}
			d := *dst
			d.Zone = strconv.Itoa(l.Attrs().Index)
			dst = &d
		}
		network := "udp4"
		if dst.IP.To4() == nil {
			network = "udp6"
		}
		c, err := net.ListenUDP(network, &net.UDPAddr{IP: src})
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
			// The pod's IPv6 multicast route comes with its first address.
			for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				_, err := c.WriteToUDP([]byte("probe"), dst)
				if err == nil {
					break
				}
				if !errors.Is(err, unix.ENETUNREACH) || time.Now().After(end) {
					return fmt.Errorf("send to %s: %w", dst, err)
				}
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
	_, a6 := resultIPs(h.Add(a, "a"))
	hostIf, idx := h.HostVeth("a")
	serve(t, h.Node, 9093, "node")
	dsts := []*net.UDPAddr{
		{IP: net.IPv4bcast, Port: 9093},
		{IP: net.IPv4(198, 51, 100, 255), Port: 9093}, // uplink0's subnet's
		{IP: net.IPv4allsys, Port: 9093},
		{IP: net.IPv6linklocalallnodes, Port: 9093, Zone: "eth0"},
	}
	// From the pod's global address to its host veth's link-local one: the
	// stack delivers that to the node's sockets too.
	ll := usableLinkLocal(t, h.Env, hostIf)
	check := func(t *testing.T) {
		for _, fam := range []int{4, 6} {
			blocked(t, a, "udp", nodeIP[fam], 9093) // unicast: judged, denied
		}
		for _, d := range dsts {
			if who, ok := groupAnswered(t, a, nil, d); ok {
				t.Errorf("UDP to %s: answered %q, want the pod's egress to deny it", d, strings.TrimSpace(who))
			}
		}
		d := &net.UDPAddr{IP: ll, Port: 9093, Zone: "eth0"}
		if who, ok := groupAnswered(t, a, a6, d); ok {
			t.Errorf("UDP from %s to %s: answered %q, want the pod's egress to deny it", a6, d, strings.TrimSpace(who))
		}
	}
	t.Run("pending", check)
	w := h.Maps().Policy().Writer()
	if err := w.Apply(uint32(idx), policy.Endpoint{Egress: isolated()}); err != nil {
		t.Fatal(err)
	}
	t.Run("isolated", check)
}

// usableLinkLocal is the IPv6 link-local address of the node's link name
// once its DAD is done.
func usableLinkLocal(t *testing.T, e *testenv.Env, name string) net.IP {
	t.Helper()
	var ll net.IP
	must(t, e.InNode(func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		for end := time.Now().Add(10 * time.Second); ll == nil && time.Now().Before(end); time.Sleep(50 * time.Millisecond) { // DAD, slower on a loaded node
			as, err := netlink.AddrList(l, netlink.FAMILY_V6)
			if err != nil {
				return err
			}
			for _, a := range as {
				if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
					ll = a.IP
				}
			}
		}
		if ll == nil {
			return fmt.Errorf("%s has no usable link-local address", name)
		}
		return nil
	}))
	return ll
}
