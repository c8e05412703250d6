// Bandwidth limits with no side door: every packet a pod sends counts
// against its egress limit, whatever its addresses' scope, and every way
// into a pod with an ingress limit meets the same queue.

package integration

import (
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// linkLocal6 waits until the link named ifname in netns has a usable (not
// tentative) IPv6 link-local address and returns it.
func linkLocal6(t *testing.T, netns ns.NetNS, ifname string) net.IP {
	t.Helper()
	var ip net.IP
	deadline := time.Now().Add(10 * time.Second)
	for ip == nil {
		err := netns.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(ifname)
			if err != nil {
				return err
			}
			as, err := netlink.AddrList(l, netlink.FAMILY_V6)
			if err != nil {
				return err
			}
			for _, a := range as {
				if a.IP.IsLinkLocalUnicast() && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
					ip = a.IP
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("addresses of %s: %v", ifname, err)
		}
		if ip == nil {
			if time.Now().After(deadline) {
				t.Fatalf("%s has no usable IPv6 link-local address after 10 s", ifname)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return ip
}

// TestBandwidthLinkLocalEgress: a pod with a 20 Mbit/s egress limit blasting
// UDP from its IPv6 link-local address to the node's (its host veth's)
// gets no more through than over its global address: the link-scope branch
// of the from-pod program used to return before the bucket (199 Mbit/s
// measured). The drop counter moves; the node's listener sees the limit.
// (IPv4 has no such branch: a pod's IPv4 source must be its own address.)
func TestBandwidthLinkLocalEgress(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a := e.NewPod()
	e.CleanupDel(a, "ll")
	const rate = 20e6
	if _, err := e.AddBW(a, "ll", bandwidthArgs(0, rate)); err != nil {
		t.Fatal(err)
	}
	hostIf, idx := e.HostVeth("ll")
	nodeLL := linkLocal6(t, e.Node, hostIf)
	linkLocal6(t, a, "eth0")

	const sendFor = 2 * time.Second
	sent, got := udpBlastTo(t, a, e.Node,
		&net.UDPAddr{IP: nodeLL, Zone: hostIf}, &net.UDPAddr{IP: nodeLL, Zone: "eth0"},
		sendFor, sendFor+2*time.Second, 0)
	limit := rate/8*sendFor.Seconds() + rate/8*0.05 // the rate plus the 50 ms bucket
	t.Logf("link-local UDP: sent %.1f MB, received %.2f MB (%.1f Mbit/s), limit %.2f MB",
		float64(sent)/1e6, float64(got)/1e6, float64(got)*8/sendFor.Seconds()/1e6, limit/1e6)
	if float64(sent) < 2*limit {
		t.Fatalf("the sender managed only %.2f MB: not enough to test the limit", float64(sent)/1e6)
	}
	if float64(got) > 1.1*limit {
		t.Errorf("the node received %.2f MB in %v from a pod limited to %.0f Mbit/s (%.2f MB allowed): link-local traffic escapes the egress limit",
			float64(got)/1e6, sendFor, rate/1e6, limit/1e6)
	}
	if float64(got) < 0.3*limit {
		t.Errorf("the node received only %.2f MB of %.2f MB allowed", float64(got)/1e6, limit/1e6)
	}
	if c := counter(t, e.Maps(), idx, maps.DirEgress, maps.ReasonDropBandwidth); c.Packets == 0 {
		t.Errorf("drop_bandwidth did not move for link-local traffic over the limit:\n%s", dumpCounters(e.Maps(), idx))
	}
	// Neighbour discovery still works under the limit: the pod reaches
	// the node's link-local address.
	if err := a.Do(func(ns.NetNS) error {
		out, err := exec.Command("ping", "-6", "-c", "2", "-W", "2", fmt.Sprintf("%s%%eth0", nodeLL)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v\n%s", err, out)
		}
		return nil
	}); err != nil {
		t.Errorf("ping the node's link-local address: %v", err)
	}
	e.MustDel(a, "ll")
	e.AssertClean()
}

// queueBytes is what went through the ingress queue's class 1:10 (0x10) on the
// host veth idx so far.
func queueBytes(t *testing.T, e *testenv.Env, idx int) uint64 {
	t.Helper()
	var n uint64
	must(t, e.InNode(func() error {
		cs, err := netlink.ClassList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}}, netlink.MakeHandle(1, 0))
		if err != nil {
			return err
		}
		for _, c := range cs {
			if a := c.Attrs(); a.Handle == netlink.MakeHandle(1, 0x10) && a.Statistics != nil && a.Statistics.Basic != nil {
				n = a.Statistics.Basic.Bytes
			}
		}
		return nil
	}))
	return n
}

// TestBandwidthHostPortIngress: a remote client streaming TCP to a pod
// with a 20 Mbit/s ingress limit through its hostPort meets the same
// ingress queue as one dialling the pod's address: its mean is the limit,
// with at most a few retransmits, and its bytes pass the queue's class; so
// does one reaching it through a NodePort Service.
// The uplink program used to redirect hostPort traffic into the pod past
// the host veth's queue, where only the bucket dropped: 13-16 Mbit/s with
// about 1000 retransmits. IPv4 and IPv6.
func TestBandwidthHostPortIngress(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.Extra = map[string]any{"capabilities": map[string]bool{"portMappings": true, "bandwidth": true}}
	remote := withRemote(t, e)
	a := e.NewPod()
	e.CleanupDel(a, "hpq")
	const rate = 20e6
	rt := e.RuntimeConfHP(a, "hpq", []testenv.PM{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}})
	rt.CapabilityArgs["bandwidth"] = bandwidthArgs(rate, 0)
	ra, err := e.AddList(e.ConfList("1.0.0"), rt)
	if err != nil {
		t.Fatalf("ADD with a hostPort and an ingress limit: %v", err)
	}
	a4, a6 := testenv.PodIPs(t, ra)
	_, idx := e.HostVeth("hpq")
	b := e.NewPod()
	e.CleanupDel(b, "hpq-client")
	b4, _ := testenv.PodIPs(t, e.Add(b, "hpq-client"))
	// A NodePort Service to a's port 80 (kube-proxy's rules: DNAT and
	// masquerade by the stack), for comparison.
	const nodePort = 30080
	proxyModes[0].install(t, e.Node, 4, testenv.PodSubnet4, []net.IP{uplinkIP4},
		[]svcPort{{name: "bwq-tcp", proto: "tcp", clusterIP: svcWeb[4], port: 80, nodePort: nodePort, backend: a4, target: 80}})

	for _, c := range []struct {
		what, listen, dial string
		from               ns.NetNS
	}{
		{"direct, IPv4", net.JoinHostPort(a4.String(), "81"), "", remote},
		{"hostPort, IPv4", net.JoinHostPort(a4.String(), "80"), net.JoinHostPort(uplinkIP4.String(), "8080"), remote},
		{"hostPort, IPv6", net.JoinHostPort(a6.String(), "80"), net.JoinHostPort(uplinkIP6.String(), "8080"), remote},
		{"NodePort Service, IPv4", net.JoinHostPort(a4.String(), "80"), net.JoinHostPort(uplinkIP4.String(), fmt.Sprint(nodePort)), remote},
		// A pod of the node dialling the hostPort (hairpin): not paced (it
		// dials a node address), so like a Service's client it meets the
		// queue.
		{"hostPort hairpin from a pod, IPv4", net.JoinHostPort(a4.String(), "80"), net.JoinHostPort(testenv.NodeIP4.String(), "8080"), b},
	} {
		before := queueBytes(t, e, idx)
		s := tcpStreamVia(t, c.from, a, c.listen, c.dial, 5*time.Second)
		queued := queueBytes(t, e, idx) - before
		var got float64
		for _, bps := range s.intervals {
			got += bps / 8
		}
		t.Logf("TCP %s at a %.0f Mbit/s ingress limit: mean %.3fx, 1 s intervals %s, %d retransmitted segments, %.2f MB through the queue",
			c.what, rate/1e6, s.mean/rate, ratios(s.intervals, rate), s.retrans, float64(queued)/1e6)
		if s.mean < 0.85*rate || s.mean > 1.05*rate {
			t.Errorf("%s: mean %.1f Mbit/s, want %.1f-%.1f (0.85x-1.05x of the limit)", c.what, s.mean/1e6, 0.85*rate/1e6, 1.05*rate/1e6)
		}
		// The queue and the pod's window keep drops rare; the bucket alone
		// dropped about a thousand segments.
		if s.retrans > 150 {
			t.Errorf("%s: %d retransmitted segments, want few (the ingress queue absorbs bursts)", c.what, s.retrans)
		}
		if float64(queued) < 0.9*got {
			t.Errorf("%s: %.2f MB passed the ingress queue of %.2f MB received: the stream went around it", c.what, float64(queued)/1e6, got/1e6)
		}
	}
	// hostPort flows are the node hooks', not the stack's: none recorded as
	// a stack flow (its replies would be sent to the stack).
	sfs, err := e.Maps().StackFlows().List()
	must(t, err)
	for _, f := range sfs {
		if f.Ifindex == idx && f.Peer.Addr().String() == b4.String() {
			t.Errorf("the hairpin flow was recorded as one the stack delivered: %+v", f)
		}
	}
	e.MustDel(b, "hpq-client")
	e.MustDel(a, "hpq")
	e.AssertNoHostPorts()
	e.AssertClean()
}

// TestBandwidthNeighbourEgress: neighbour requests are no way around a
// pod's egress limit either. A pod with a 1 Mbit/s egress limit floods
// requests for a next hop (which the from-pod program answers itself) from
// a raw socket for a second: ARP (IPv4) and neighbour solicitations from
// its global IPv6 address. What is answered stays within the limit, the
// rest is dropped and counted.
func TestBandwidthNeighbourEgress(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	a := e.NewPod()
	e.CleanupDel(a, "nbr")
	const rate = 1e6
	ra, err := e.AddBW(a, "nbr", bandwidthArgs(0, rate))
	if err != nil {
		t.Fatal(err)
	}
	a4, a6 := testenv.PodIPs(t, ra)
	_, idx := e.HostVeth("nbr")
	mac := podMACOf(t, a, "eth0")

	arp := []byte{0, 1, 8, 0, 6, 4, 0, 1}
	arp = append(append(arp, mac...), a4.To4()...)
	arp = append(append(arp, make([]byte, 6)...), net.ParseIP("10.250.0.254").To4()...)
	target := net.ParseIP("fd00:250::fe")
	ns6 := append([]byte{135, 0, 0, 0, 0, 0, 0, 0}, target...)
	ns6 = append(append(ns6, 1, 1), mac...)
	for _, c := range []struct {
		what  string
		frame []byte
	}{
		{"ARP", append(ethHeader(mac, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0x0806), arp...)},
		{"NS", ipv6Frame(mac, net.HardwareAddr{0x33, 0x33, 0xff, 0, 0, 0xfe}, a6, net.ParseIP("ff02::1:ff00:fe"), 255, nil, ns6)},
	} {
		time.Sleep(100 * time.Millisecond) // the bucket refills (50 ms)
		m := e.Maps()
		answered0 := counter(t, m, idx, maps.DirEgress, maps.ReasonNeighReply).Packets
		dropped0 := counter(t, m, idx, maps.DirEgress, maps.ReasonDropBandwidth).Packets
		var sent int
		var elapsed time.Duration
		must(t, a.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			to := &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}
			start := time.Now()
			for time.Since(start) < time.Second {
				if unix.Sendto(fd, c.frame, 0, to) == nil {
					sent++
				}
			}
			elapsed = time.Since(start)
			return nil
		}))
		answered := counter(t, m, idx, maps.DirEgress, maps.ReasonNeighReply).Packets - answered0
		dropped := counter(t, m, idx, maps.DirEgress, maps.ReasonDropBandwidth).Packets - dropped0
		// The rate over the flood and the 50 ms bucket, in frames.
		allowed := (rate/8*elapsed.Seconds() + rate/8*0.05) / float64(len(c.frame))
		t.Logf("%s flood: %d %d-byte requests in %v, %d answered (%.0f allowed by the limit), %d dropped",
			c.what, sent, len(c.frame), elapsed.Round(time.Millisecond), answered, allowed, dropped)
		if float64(sent) < 2*allowed {
			t.Fatalf("%s: the pod sent only %d requests: not enough to test the limit", c.what, sent)
		}
		if answered == 0 {
			t.Errorf("%s: no request answered", c.what)
		}
		if float64(answered) > 1.2*allowed {
			t.Errorf("%s: %d requests answered, the limit allows about %.0f: they escape the egress limit", c.what, answered, allowed)
		}
		if dropped == 0 {
			t.Errorf("%s: drop_bandwidth did not move over the limit:\n%s", c.what, dumpCounters(m, idx))
		}
	}
	e.MustDel(a, "nbr")
	e.AssertClean()
}
