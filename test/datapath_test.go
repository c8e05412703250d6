package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/cni"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// ---- helpers of this file --------------------------------------------------

// hostVeth returns the name and node-netns ifindex of a pod's host veth.
func (e *env) hostVeth(containerID string) (string, int) {
	e.t.Helper()
	name := cni.HostIfName(containerID, "eth0")
	return name, e.hostIfindex(name)
}

// counter returns one counter of a host veth (zero when absent).
func counter(t *testing.T, m *maps.Maps, ifindex int, dir maps.Dir, reason maps.Reason) maps.Counter {
	t.Helper()
	cs, err := m.Counters(ifindex)
	if err != nil {
		t.Fatalf("read counters of ifindex %d: %v", ifindex, err)
	}
	return cs[maps.CounterKey{Dir: dir, Reason: reason}]
}

// dumpCounters renders every counter of a host veth for failure messages.
func dumpCounters(m *maps.Maps, ifindex int) string {
	cs, err := m.Counters(ifindex)
	if err != nil {
		return err.Error()
	}
	var parts []string
	for k, c := range cs {
		parts = append(parts, fmt.Sprintf("%s/%s=%dp,%dB", k.Dir, k.Reason, c.Packets, c.Bytes))
	}
	return strings.Join(parts, " ")
}

// pingExpectFail pings and returns an error if any echo is answered.
func pingExpectFail(netns ns.NetNS, ip net.IP, count int) error {
	return netns.Do(func(ns.NetNS) error {
		args := []string{"-c", fmt.Sprint(count), "-i", "0.2", "-W", "1", ip.String()}
		if ip.To4() == nil {
			args = append([]string{"-6"}, args...)
		}
		out, err := exec.Command("ping", args...).CombinedOutput()
		if err == nil {
			return fmt.Errorf("ping %s succeeded, want no replies:\n%s", ip, out)
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			// 1 is "no reply"; anything else is ping failing for another reason.
			return fmt.Errorf("ping %s: %v (want exit status 1, no reply)\n%s", ip, err, out)
		}
		return nil
	})
}

// pingFrom pings from a given source address.
func pingFrom(netns ns.NetNS, src, ip net.IP, count int) error {
	return netns.Do(func(ns.NetNS) error {
		args := []string{"-c", fmt.Sprint(count), "-i", "0.2", "-W", "2", "-I", src.String(), ip.String()}
		if ip.To4() == nil {
			args = append([]string{"-6"}, args...)
		}
		out, err := exec.Command("ping", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping -I %s %s: %v\n%s", src, ip, err, out)
		}
		return nil
	})
}

// pingDF pings with a payload of size bytes and fragmentation prohibited.
func pingDF(netns ns.NetNS, ip net.IP, size int) error {
	return netns.Do(func(ns.NetNS) error {
		args := []string{"-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", fmt.Sprint(size), ip.String()}
		if ip.To4() == nil {
			args = append([]string{"-6"}, args...)
		}
		out, err := exec.Command("ping", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping -M do -s %d %s: %v\n%s", size, ip, err, out)
		}
		return nil
	})
}

// podAddrAdd adds an extra address to eth0 inside a pod, as a malicious
// workload with CAP_NET_ADMIN in its netns could.
func podAddrAdd(t *testing.T, pod ns.NetNS, cidr string) {
	t.Helper()
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			return err
		}
		a.Flags = unix.IFA_F_NODAD | unix.IFA_F_NOPREFIXROUTE
		return netlink.AddrAdd(l, a)
	})
	if err != nil {
		t.Fatalf("add %s to pod eth0: %v", cidr, err)
	}
}

// udpSocket opens a UDP socket in netns bound to ip (port 0).
func udpSocket(t *testing.T, netns ns.NetNS, ip net.IP) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := netns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip})
		return err
	})
	if err != nil {
		t.Fatalf("UDP socket on %s: %v", ip, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// udpReceived reads from ln until a datagram carrying marker arrives (or the
// deadline passes), then drains stragglers briefly, and returns the payloads
// seen. Datagrams sent before the marker over the same path are queued ahead
// of it, so waiting for the marker bounds the wait without a long sleep.
func udpReceived(ln *net.UDPConn, marker string) (got []string, sawMarker bool) {
	buf := make([]byte, 2048)
	ln.SetReadDeadline(time.Now().Add(3 * time.Second))
	for !sawMarker {
		n, _, err := ln.ReadFromUDP(buf)
		if err != nil {
			return got, false
		}
		got = append(got, string(buf[:n]))
		sawMarker = string(buf[:n]) == marker
	}
	ln.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	for {
		n, _, err := ln.ReadFromUDP(buf)
		if err != nil {
			return got, sawMarker
		}
		got = append(got, string(buf[:n]))
	}
}

// resultIPs returns the IPv4 and IPv6 addresses of a result; either may be nil.
func resultIPs(r *current.Result) (v4, v6 net.IP) {
	for _, ipc := range r.IPs {
		if ipc.Address.IP.To4() != nil {
			v4 = ipc.Address.IP
		} else {
			v6 = ipc.Address.IP
		}
	}
	return v4, v6
}

// delV deletes with the conflist at the CNI version the attachment was added with.
func (e *env) delV(version string, pod ns.NetNS, containerID, ifname string) error {
	return e.inNode(func() error {
		return e.cni.DelNetworkList(context.Background(), e.confList(version), e.rt(pod, containerID, ifname))
	})
}

// checkV runs CHECK with the conflist at the given CNI version.
func (e *env) checkV(version string, pod ns.NetNS, containerID, ifname string) error {
	return e.inNode(func() error {
		return e.cni.CheckNetworkList(context.Background(), e.confList(version), e.rt(pod, containerID, ifname))
	})
}

// addK8s adds a pod at CNI 1.1.0 with the CNI_ARGS a kubelet passes.
func (e *env) addK8s(pod ns.NetNS, containerID, podNS, podName string) *current.Result {
	e.t.Helper()
	rt := e.rt(pod, containerID, "eth0")
	rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", podNS}, {"K8S_POD_NAME", podName}}
	var res types.Result
	err := e.inNode(func() error {
		var err error
		res, err = e.cni.AddNetworkList(context.Background(), e.confList("1.1.0"), rt)
		return err
	})
	if err != nil {
		e.t.Fatalf("ADD %s: %v", containerID, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		e.t.Fatalf("ADD %s result: %v", containerID, err)
	}
	return r
}

// mustDel deletes a pod and fails the test on error.
func (e *env) mustDel(pod ns.NetNS, containerID string) {
	e.t.Helper()
	if err := e.del(pod, containerID, "eth0"); err != nil {
		e.t.Fatalf("DEL %s: %v", containerID, err)
	}
}

// cleanupDel registers a best-effort DEL so a failing test leaves nothing
// attached; DEL is idempotent, so it is harmless after the test's own DEL.
func (e *env) cleanupDel(pod ns.NetNS, containerID string) {
	e.t.Cleanup(func() { _ = e.del(pod, containerID, "eth0") })
}

// podLink runs f on the pod's eth0.
func podLink(t *testing.T, pod ns.NetNS, f func(l netlink.Link) error) {
	t.Helper()
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return f(l)
	})
	if err != nil {
		t.Fatalf("pod eth0: %v", err)
	}
}

// podNeighs returns the neighbour entries of the pod's eth0, both families.
func podNeighs(t *testing.T, pod ns.NetNS) []netlink.Neigh {
	t.Helper()
	var out []netlink.Neigh
	podLink(t, pod, func(l netlink.Link) error {
		var err error
		out, err = netlink.NeighList(l.Attrs().Index, netlink.FAMILY_ALL)
		return err
	})
	return out
}

// neighState names a neighbour state for failure messages.
func neighState(s int) string {
	switch s {
	case netlink.NUD_INCOMPLETE:
		return "INCOMPLETE"
	case netlink.NUD_REACHABLE:
		return "REACHABLE"
	case netlink.NUD_STALE:
		return "STALE"
	case netlink.NUD_FAILED:
		return "FAILED"
	case netlink.NUD_NOARP:
		return "NOARP"
	case netlink.NUD_PERMANENT:
		return "PERMANENT"
	}
	return fmt.Sprintf("state%#x", s)
}

// ---- tests -----------------------------------------------------------------

// TestDatapathPodToPod proves same-node pod-to-pod traffic over both families
// and that it takes the bpf_redirect_peer short cut, counted on both veths.
func TestDatapathPodToPod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, b := e.newPod(), e.newPod()
	e.cleanupDel(a, "pod-a")
	e.cleanupDel(b, "pod-b")
	ra := e.add(a, "pod-a")
	rb := e.add(b, "pod-b")
	a4, a6 := podIPs(t, ra)
	b4, b6 := podIPs(t, rb)
	_, aIdx := e.hostVeth("pod-a")
	_, bIdx := e.hostVeth("pod-b")
	m := e.maps()

	const size = 4 << 20
	for _, dst := range []net.IP{b4, b6} {
		if err := ping(a, dst, 3); err != nil {
			t.Fatal(err)
		}
		if err := tcpTransfer(a, b, dst, size); err != nil {
			t.Fatalf("TCP a->b %s: %v", dst, err)
		}
	}
	for _, dst := range []net.IP{a4, a6} {
		if err := ping(b, dst, 2); err != nil {
			t.Fatal(err)
		}
	}

	aOut := counter(t, m, aIdx, maps.DirEgress, maps.ReasonRedirect)
	bIn := counter(t, m, bIdx, maps.DirIngress, maps.ReasonRedirect)
	bOut := counter(t, m, bIdx, maps.DirEgress, maps.ReasonRedirect)
	aIn := counter(t, m, aIdx, maps.DirIngress, maps.ReasonRedirect)
	// Two transfers of size bytes went a->b: every byte must have been redirected.
	if aOut.Packets == 0 || aOut.Bytes < 2*size {
		t.Errorf("pod-a egress redirect = %+v, want >= %d bytes\n  a: %s", aOut, 2*size, dumpCounters(m, aIdx))
	}
	if bIn.Packets == 0 || bIn.Bytes < 2*size {
		t.Errorf("pod-b ingress redirect = %+v, want >= %d bytes\n  b: %s", bIn, 2*size, dumpCounters(m, bIdx))
	}
	// What one side redirected out is exactly what the other saw redirected in.
	if aOut != bIn {
		t.Errorf("pod-a egress redirect %+v != pod-b ingress redirect %+v", aOut, bIn)
	}
	// Replies and b's pings went the other way.
	if bOut.Packets == 0 || aIn.Packets == 0 {
		t.Errorf("reverse direction not redirected: pod-b egress %+v, pod-a ingress %+v", bOut, aIn)
	}
	if bOut != aIn {
		t.Errorf("pod-b egress redirect %+v != pod-a ingress redirect %+v", bOut, aIn)
	}
	for _, idx := range []int{aIdx, bIdx} {
		cs, _ := m.Counters(idx)
		for k, c := range cs {
			if k.Reason.IsDrop() {
				t.Errorf("ifindex %d dropped legit traffic: %s/%s = %+v", idx, k.Dir, k.Reason, c)
			}
		}
	}

	e.mustDel(a, "pod-a")
	e.mustDel(b, "pod-b")
	e.assertClean()
}

// TestDatapathNodeToPod proves node <-> pod traffic both ways over both
// families: it leaves through the kernel stack (forward) in both directions.
func TestDatapathNodeToPod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.newPod()
	e.cleanupDel(p, "pod")
	r := e.add(p, "pod")
	p4, p6 := podIPs(t, r)
	_, idx := e.hostVeth("pod")
	m := e.maps()

	const size = 2 << 20
	for _, c := range []struct{ pod, node net.IP }{{p4, nodeIP4}, {p6, nodeIP6}} {
		if err := ping(e.node, c.pod, 2); err != nil {
			t.Errorf("node -> pod: %v", err)
		}
		if err := ping(p, c.node, 2); err != nil {
			t.Errorf("pod -> node: %v", err)
		}
		if err := tcpTransfer(e.node, p, c.pod, size); err != nil {
			t.Errorf("TCP node -> pod %s: %v", c.pod, err)
		}
		if err := tcpTransfer(p, e.node, c.node, size); err != nil {
			t.Errorf("TCP pod -> node %s: %v", c.node, err)
		}
	}
	out := counter(t, m, idx, maps.DirEgress, maps.ReasonForward)
	in := counter(t, m, idx, maps.DirIngress, maps.ReasonForward)
	if out.Bytes < 2*size {
		t.Errorf("egress forward = %+v, want >= %d bytes (pod->node transfers)\n  %s", out, 2*size, dumpCounters(m, idx))
	}
	if in.Bytes < 2*size {
		t.Errorf("ingress forward = %+v, want >= %d bytes (node->pod transfers)\n  %s", in, 2*size, dumpCounters(m, idx))
	}
	if c := counter(t, m, idx, maps.DirEgress, maps.ReasonRedirect); c.Packets != 0 {
		t.Errorf("node-bound traffic was redirected: %+v", c)
	}

	e.mustDel(p, "pod")
	e.assertClean()
}

// TestDatapathAntiSpoofIP sends UDP from inside a pod with source addresses
// that are not the pod's: a foreign address and another pod's address, over
// both families. None may reach the node; all are counted as drop_spoof_ip;
// the pod's own traffic still flows.
func TestDatapathAntiSpoofIP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, b := e.newPod(), e.newPod()
	e.cleanupDel(a, "pod-a")
	e.cleanupDel(b, "pod-b")
	ra := e.add(a, "pod-a")
	rb := e.add(b, "pod-b")
	a4, a6 := podIPs(t, ra)
	b4, b6 := podIPs(t, rb)
	_, aIdx := e.hostVeth("pod-a")
	m := e.maps()

	cases := []struct {
		name        string
		spoof, real net.IP
		node        net.IP
		addr        string // to add to the pod's eth0 first; "" when already there
	}{
		{"v4 foreign", net.ParseIP("10.250.0.200"), a4, nodeIP4, "10.250.0.200/32"},
		{"v4 other pod", b4, a4, nodeIP4, b4.String() + "/32"},
		{"v6 foreign", net.ParseIP("fd00:250::200"), a6, nodeIP6, "fd00:250::200/128"},
		{"v6 other pod", b6, a6, nodeIP6, b6.String() + "/128"},
	}
	const n = 20
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			podAddrAdd(t, a, c.addr)
			ln := udpSocket(t, e.node, c.node)
			dst := ln.LocalAddr().(*net.UDPAddr)
			spoofed := udpSocket(t, a, c.spoof)
			legit := udpSocket(t, a, c.real)

			before := counter(t, m, aIdx, maps.DirEgress, maps.ReasonDropSpoofIP)
			for i := 0; i < n; i++ {
				if _, err := spoofed.WriteToUDP([]byte("spoof"), dst); err != nil {
					t.Fatalf("send spoofed datagram: %v", err)
				}
			}
			if _, err := legit.WriteToUDP([]byte("legit"), dst); err != nil {
				t.Fatalf("send legit datagram: %v", err)
			}
			got, sawMarker := udpReceived(ln, "legit")
			if !sawMarker {
				t.Errorf("legit datagram from %s after the spoofed ones never reached the node (got %q)\n  %s",
					c.real, got, dumpCounters(m, aIdx))
			}
			for _, g := range got {
				if g != "legit" {
					t.Errorf("node received a datagram with spoofed source %s: %q", c.spoof, g)
					break
				}
			}
			after := counter(t, m, aIdx, maps.DirEgress, maps.ReasonDropSpoofIP)
			if after.Packets-before.Packets < n {
				t.Errorf("drop_spoof_ip grew by %d, want >= %d\n  %s", after.Packets-before.Packets, n, dumpCounters(m, aIdx))
			}
			// Explicit source: with a second address on eth0 the kernel may
			// pick the spoofed one for an unbound socket.
			if err := pingFrom(a, c.real, c.node, 2); err != nil {
				t.Errorf("legit traffic after spoofing: %v", err)
			}
		})
	}
	// The spoofed pod-b addresses must not have diverted pod-b's traffic.
	if err := ping(e.node, b4, 1); err != nil {
		t.Error(err)
	}
	if err := ping(e.node, b6, 1); err != nil {
		t.Error(err)
	}

	e.mustDel(a, "pod-a")
	e.mustDel(b, "pod-b")
	e.assertClean()
}

// TestDatapathMACLearned changes the pod's MAC, first leaving the kernel to
// re-resolve the gateway (a MAC change flushes every neighbour of the device,
// PERMANENT ones included), then with the gateway neighbours put back. On a
// veth the MAC authenticates nothing (the source IP is checked against the
// interface), so the datapath follows it: nothing is dropped as
// drop_spoof_mac and the links entry holds the pod's current MAC. (Issue 12
// replaced the drop: a chained tuning plugin cut pods off; see
// TestIntegrityMACChange.)
func TestDatapathMACLearned(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.newPod()
	e.cleanupDel(p, "pod")
	e.add(p, "pod")
	_, idx := e.hostVeth("pod")
	m := e.maps()

	var orig net.HardwareAddr
	podLink(t, p, func(l netlink.Link) error { orig = l.Attrs().HardwareAddr; return nil })
	var gwNeighs []netlink.Neigh
	for _, n := range podNeighs(t, p) {
		if n.State == netlink.NUD_PERMANENT {
			gwNeighs = append(gwNeighs, n)
		}
	}
	if len(gwNeighs) != 2 {
		t.Fatalf("pod has permanent neighbours %v, want one gateway per family", gwNeighs)
	}
	setMAC := func(mac net.HardwareAddr, restoreNeighs bool) {
		t.Helper()
		podLink(t, p, func(l netlink.Link) error {
			if err := netlink.LinkSetHardwareAddr(l, mac); err != nil {
				return err
			}
			if restoreNeighs {
				for _, n := range gwNeighs {
					if err := netlink.NeighSet(&n); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	learned := func() string {
		li, err := m.LookupLink(idx)
		if err != nil {
			return err.Error()
		}
		return net.HardwareAddr(li.Mac[:]).String()
	}
	first := net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x20, 0x30}
	second := net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x20, 0x31}
	for _, c := range []struct {
		mac     net.HardwareAddr
		restore bool
	}{{first, false}, {second, true}, {orig, true}} {
		setMAC(c.mac, c.restore)
		for _, ip := range []net.IP{nodeIP4, nodeIP6} {
			if err := ping(p, ip, 2); err != nil {
				t.Errorf("MAC %s (gateway neighbours restored: %v): %v\n  %s", c.mac, c.restore, err, dumpCounters(m, idx))
			}
		}
		if got := learned(); got != c.mac.String() {
			t.Errorf("cni_links holds %s, the pod has %s", got, c.mac)
		}
	}
	if got := counter(t, m, idx, maps.DirEgress, maps.ReasonDropSpoofMAC).Packets; got != 0 {
		t.Errorf("drop_spoof_mac counted %d packets of a pod that only changed its MAC", got)
	}

	e.mustDel(p, "pod")
	e.assertClean()
}

// TestDatapathGatewayResolvable: a pod whose neighbour table lost the static
// gateway entries must still reach the node by resolving the gateway the
// result names with ARP (IPv4) and neighbour discovery (IPv6), as any IP host
// (or a VM runtime that configures a guest from the CNI result) does. The
// kernel flushes every neighbour of a device, PERMANENT ones included, when
// its MAC changes; changing it and changing it back is the trigger here.
func TestDatapathGatewayResolvable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.newPod()
	e.cleanupDel(p, "pod")
	e.add(p, "pod")

	podLink(t, p, func(l netlink.Link) error {
		orig := l.Attrs().HardwareAddr
		tmp := append(net.HardwareAddr(nil), orig...)
		tmp[5] ^= 0x01
		if err := netlink.LinkSetHardwareAddr(l, tmp); err != nil {
			return err
		}
		return netlink.LinkSetHardwareAddr(l, orig)
	})
	for _, n := range podNeighs(t, p) {
		if n.State == netlink.NUD_PERMANENT {
			t.Logf("note: permanent neighbour %s survived the MAC change", n.IP)
		}
	}
	_, idx := e.hostVeth("pod")
	m := e.maps()
	for _, ip := range []net.IP{nodeIP4, nodeIP6} {
		if err := ping(p, ip, 2); err != nil {
			var ns []string
			for _, n := range podNeighs(t, p) {
				ns = append(ns, fmt.Sprintf("%s %s %s", n.IP, neighState(n.State), n.HardwareAddr))
			}
			t.Errorf("pod with its own MAC cannot reach the node once its gateway neighbour is gone: %v"+
				"\n  pod neighbours: %s\n  host veth counters: %s", err, strings.Join(ns, "; "), dumpCounters(m, idx))
		}
	}

	e.mustDel(p, "pod")
	e.assertClean()
}

// TestDatapathCNIVersions runs ADD, CHECK and DEL at every supported spec
// version and checks the result is in that version's format and the pod works.
func TestDatapathCNIVersions(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			p := e.newPod()
			id := "pod-" + strings.ReplaceAll(v, ".", "")
			t.Cleanup(func() { _ = e.delV(v, p, id, "eth0") })
			res, err := e.addV(v, p, id, "eth0")
			if err != nil {
				t.Fatalf("ADD at %s: %v", v, err)
			}
			if res.Version() != v {
				t.Fatalf("result version %q, want %q", res.Version(), v)
			}

			type iface struct{ name, mac, sandbox string }
			type ipc struct {
				addr    net.IPNet
				gw      net.IP
				iface   *int
				version string
			}
			var ifs []iface
			var ips []ipc
			var routes []*types.Route
			switch r := res.(type) {
			case *types040.Result:
				if v == "1.0.0" || v == "1.1.0" {
					t.Fatalf("result of %s is %T", v, res)
				}
				for _, i := range r.Interfaces {
					ifs = append(ifs, iface{i.Name, i.Mac, i.Sandbox})
				}
				for _, i := range r.IPs {
					ips = append(ips, ipc{i.Address, i.Gateway, i.Interface, i.Version})
				}
				routes = r.Routes
			case *current.Result:
				if v != "1.0.0" && v != "1.1.0" {
					t.Fatalf("result of %s is %T", v, res)
				}
				for _, i := range r.Interfaces {
					ifs = append(ifs, iface{i.Name, i.Mac, i.Sandbox})
				}
				for _, i := range r.IPs {
					ips = append(ips, ipc{i.Address, i.Gateway, i.Interface, ""})
				}
				routes = r.Routes
			default:
				t.Fatalf("result of %s has unexpected type %T", v, res)
			}

			hostIf := cni.HostIfName(id, "eth0")
			if len(ifs) != 2 || ifs[0].name != hostIf || ifs[0].sandbox != "" ||
				ifs[1].name != "eth0" || ifs[1].sandbox != p.Path() {
				t.Fatalf("interfaces = %+v, want [%s (host), eth0 in %s]", ifs, hostIf, p.Path())
			}
			var podMAC net.HardwareAddr
			var podAddrs []netlink.Addr
			err = p.Do(func(ns.NetNS) error {
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				podMAC = l.Attrs().HardwareAddr
				podAddrs, err = netlink.AddrList(l, netlink.FAMILY_ALL)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if ifs[1].mac != podMAC.String() {
				t.Errorf("result pod MAC %s, eth0 has %s", ifs[1].mac, podMAC)
			}
			if len(ips) != 2 {
				t.Fatalf("ips = %+v, want one IPv4 and one IPv6", ips)
			}
			var v4, v6 net.IP
			for _, c := range ips {
				is4 := c.addr.IP.To4() != nil
				if is4 {
					v4 = c.addr.IP
				} else {
					v6 = c.addr.IP
				}
				if c.iface == nil || *c.iface != 1 {
					t.Errorf("ip %s: interface index %v, want 1 (eth0)", c.addr.String(), c.iface)
				}
				if c.gw == nil {
					t.Errorf("ip %s: no gateway", c.addr.String())
				}
				if strings.HasPrefix(v, "0.") {
					want := "6"
					if is4 {
						want = "4"
					}
					if c.version != want {
						t.Errorf("ip %s: version %q, want %q", c.addr.String(), c.version, want)
					}
				}
				found := false
				for _, a := range podAddrs {
					if a.IP.Equal(c.addr.IP) && a.Mask.String() == c.addr.Mask.String() {
						found = true
					}
				}
				if !found {
					t.Errorf("result address %s is not on the pod's eth0 (%v)", c.addr.String(), podAddrs)
				}
			}
			if v4 == nil || v6 == nil {
				t.Fatalf("ips = %+v, want one IPv4 and one IPv6", ips)
			}
			var def4, def6 bool
			for _, r := range routes {
				if ones, _ := r.Dst.Mask.Size(); ones == 0 {
					if r.Dst.IP.To4() != nil {
						def4 = true
					} else {
						def6 = true
					}
				}
			}
			if !def4 || !def6 {
				t.Errorf("routes %v lack a default route per family", routes)
			}

			for _, ip := range []net.IP{nodeIP4, nodeIP6} {
				if err := ping(p, ip, 2); err != nil {
					t.Error(err)
				}
			}
			if v != "0.3.0" && v != "0.3.1" {
				if err := e.checkV(v, p, id, "eth0"); err != nil {
					t.Errorf("CHECK at %s: %v", v, err)
				}
			}
			if err := e.delV(v, p, id, "eth0"); err != nil {
				t.Fatalf("DEL at %s: %v", v, err)
			}
			e.assertClean()
		})
	}
}

// TestDatapathAttachModeTC forces clsact + cls_bpf instead of tcx.
func TestDatapathAttachModeTC(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.extra = map[string]any{"attachMode": "tc"}
	a, b := e.newPod(), e.newPod()
	e.cleanupDel(a, "pod-a")
	e.cleanupDel(b, "pod-b")
	e.add(a, "pod-a")
	rb := e.add(b, "pod-b")
	b4, b6 := podIPs(t, rb)

	for _, id := range []string{"pod-a", "pod-b"} {
		name := cni.HostIfName(id, "eth0")
		err := e.inNode(func() error {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			qs, err := netlink.QdiscList(l)
			if err != nil {
				return err
			}
			clsact := false
			for _, q := range qs {
				if q.Type() == "clsact" {
					clsact = true
				}
			}
			if !clsact {
				return fmt.Errorf("%s has no clsact qdisc (qdiscs %v)", name, qs)
			}
			for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
				fs, err := netlink.FilterList(l, parent)
				if err != nil {
					return fmt.Errorf("list filters of %s parent %x: %w", name, parent, err)
				}
				var bpf []*netlink.BpfFilter
				for _, f := range fs {
					if bf, ok := f.(*netlink.BpfFilter); ok {
						bpf = append(bpf, bf)
					}
				}
				if len(bpf) != 1 || !bpf[0].DirectAction || bpf[0].Id == 0 {
					return fmt.Errorf("%s parent %x: bpf filters %+v, want one direct-action filter", name, parent, bpf)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if pins, _ := os.ReadDir(filepath.Join(e.pinDir, "links")); len(pins) != 0 {
		t.Errorf("tc mode pinned tcx links: %v", pins)
	}

	for _, ip := range []net.IP{b4, b6} {
		if err := ping(a, ip, 2); err != nil {
			t.Error(err)
		}
	}
	if err := ping(a, nodeIP4, 1); err != nil {
		t.Error(err)
	}
	m := e.maps()
	_, aIdx := e.hostVeth("pod-a")
	if c := counter(t, m, aIdx, maps.DirEgress, maps.ReasonRedirect); c.Packets == 0 {
		t.Errorf("tc mode: no redirect counted on pod-a's veth: %s", dumpCounters(m, aIdx))
	}
	if c := counter(t, m, aIdx, maps.DirIngress, maps.ReasonForward); c.Packets == 0 {
		t.Errorf("tc mode: egress filter never ran on pod-a's veth: %s", dumpCounters(m, aIdx))
	}

	e.mustDel(a, "pod-a")
	e.mustDel(b, "pod-b")
	e.assertClean()
}

// TestDatapathMTU sets mtu 1400: both veth ends carry it and full-size
// unfragmentable packets cross pod to pod.
func TestDatapathMTU(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.extra = map[string]any{"mtu": 1400}
	a, b := e.newPod(), e.newPod()
	e.cleanupDel(a, "pod-a")
	e.cleanupDel(b, "pod-b")
	ra := e.add(a, "pod-a")
	rb := e.add(b, "pod-b")
	b4, b6 := podIPs(t, rb)

	for _, c := range []struct {
		id  string
		pod ns.NetNS
		res *current.Result
	}{{"pod-a", a, ra}, {"pod-b", b, rb}} {
		name := cni.HostIfName(c.id, "eth0")
		var hostMTU, podMTU int
		e.inNode(func() error {
			l, err := netlink.LinkByName(name)
			if err == nil {
				hostMTU = l.Attrs().MTU
			}
			return err
		})
		c.pod.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("eth0")
			if err == nil {
				podMTU = l.Attrs().MTU
			}
			return err
		})
		if hostMTU != 1400 || podMTU != 1400 {
			t.Errorf("%s: host veth MTU %d, pod eth0 MTU %d, want 1400 both", c.id, hostMTU, podMTU)
		}
		for _, i := range c.res.Interfaces {
			if i.Name == "eth0" && i.Mtu != 1400 {
				t.Errorf("%s: result reports eth0 mtu %d, want 1400", c.id, i.Mtu)
			}
		}
	}
	// 1400 - 20 (IPv4) - 8 (ICMP) and 1400 - 40 (IPv6) - 8.
	if err := pingDF(a, b4, 1400-28); err != nil {
		t.Error(err)
	}
	if err := pingDF(a, b6, 1400-48); err != nil {
		t.Error(err)
	}

	e.mustDel(a, "pod-a")
	e.mustDel(b, "pod-b")
	e.assertClean()
}

// TestDatapathSingleStack runs with IPv4-only and IPv6-only IPAM.
func TestDatapathSingleStack(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		subnet string
		v4     bool
	}{{"ipv4-only", podSubnet4, true}, {"ipv6-only", podSubnet6, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.ipam = map[string]any{
				"type":    "host-local",
				"dataDir": e.dataDir,
				"ranges":  [][]map[string]string{{{"subnet": c.subnet}}},
			}
			a, b := e.newPod(), e.newPod()
			e.cleanupDel(a, "pod-a")
			e.cleanupDel(b, "pod-b")
			ra := e.add(a, "pod-a")
			rb := e.add(b, "pod-b")
			for _, r := range []*current.Result{ra, rb} {
				v4, v6 := resultIPs(r)
				if len(r.IPs) != 1 || (c.v4 && v4 == nil) || (!c.v4 && v6 == nil) {
					t.Fatalf("result IPs %v, want a single %s address", r.IPs, c.name)
				}
			}
			// The pod has no address and no default route of the other family.
			other := netlink.FAMILY_V6
			if !c.v4 {
				other = netlink.FAMILY_V4
			}
			a.Do(func(ns.NetNS) error {
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					t.Error(err)
					return nil
				}
				addrs, _ := netlink.AddrList(l, other)
				for _, ad := range addrs {
					if ad.IP.IsGlobalUnicast() {
						t.Errorf("pod has unexpected address %s", ad.IPNet)
					}
				}
				routes, _ := netlink.RouteList(l, other)
				for _, r := range routes {
					if r.Dst == nil || r.Gw != nil {
						t.Errorf("pod has unexpected route %s", r)
					}
				}
				return nil
			})

			b4, b6 := resultIPs(rb)
			dst, node := b4, nodeIP4
			if !c.v4 {
				dst, node = b6, nodeIP6
			}
			if err := ping(a, dst, 2); err != nil {
				t.Error(err)
			}
			if err := ping(a, node, 2); err != nil {
				t.Error(err)
			}
			a4, a6 := resultIPs(ra)
			if c.v4 {
				if err := ping(e.node, a4, 1); err != nil {
					t.Error(err)
				}
			} else if err := ping(e.node, a6, 1); err != nil {
				t.Error(err)
			}
			if err := tcpTransfer(a, b, dst, 1<<20); err != nil {
				t.Error(err)
			}

			e.mustDel(a, "pod-a")
			e.mustDel(b, "pod-b")
			e.assertClean()
		})
	}
}

// TestDatapathAgentDump runs `ebpf-agent dump endpoints` against a node with
// two pods that exchanged traffic.
func TestDatapathAgentDump(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, b := e.newPod(), e.newPod()
	e.cleanupDel(a, "pod-a")
	e.cleanupDel(b, "pod-b")
	ra := e.addK8s(a, "pod-a", "default", "web-a")
	rb := e.addK8s(b, "pod-b", "default", "web-b")
	a4, a6 := podIPs(t, ra)
	b4, b6 := podIPs(t, rb)
	for _, ip := range []net.IP{b4, b6, nodeIP4, nodeIP6} {
		if err := ping(a, ip, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, ip := range []net.IP{a4, a6, nodeIP4, nodeIP6} {
		if err := ping(b, ip, 1); err != nil {
			t.Fatal(err)
		}
	}

	dump := func(args ...string) []byte {
		t.Helper()
		var out []byte
		err := e.inNode(func() error {
			cmd := exec.Command(filepath.Join(binDir, "ebpf-agent"), append([]string{"dump", "endpoints",
				"--pin-dir", e.pinDir, "--state-dir", e.stateDir}, args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			var err error
			out, err = cmd.Output()
			if err != nil {
				return fmt.Errorf("ebpf-agent dump endpoints %v: %v\n%s", args, err, stderr.Bytes())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	var rows []agent.EndpointRow
	js := dump("-o", "json")
	if err := json.Unmarshal(js, &rows); err != nil {
		t.Fatalf("decode dump JSON: %v\n%s", err, js)
	}
	if len(rows) != 4 {
		t.Errorf("dump has %d rows, want 4 (two IPs per pod):\n%s", len(rows), js)
	}
	byIP := map[string]agent.EndpointRow{}
	for _, r := range rows {
		byIP[r.IP] = r
	}
	for _, c := range []struct {
		id, pod string
		res     *current.Result
		ips     []net.IP
	}{{"pod-a", "default/web-a", ra, []net.IP{a4, a6}}, {"pod-b", "default/web-b", rb, []net.IP{b4, b6}}} {
		name, idx := e.hostVeth(c.id)
		var podMAC, hostMAC string
		for _, i := range c.res.Interfaces {
			if i.Name == "eth0" {
				podMAC = i.Mac
			} else {
				hostMAC = i.Mac
			}
		}
		for _, ip := range c.ips {
			r, ok := byIP[ip.String()]
			if !ok {
				t.Errorf("%s: IP %s missing from dump:\n%s", c.id, ip, js)
				continue
			}
			if r.Interface != name || r.Ifindex != uint32(idx) {
				t.Errorf("%s %s: interface %q ifindex %d, want %q %d", c.id, ip, r.Interface, r.Ifindex, name, idx)
			}
			if r.Container != c.id || r.Pod != c.pod {
				t.Errorf("%s %s: container %q pod %q, want %q %q", c.id, ip, r.Container, r.Pod, c.id, c.pod)
			}
			if r.PodMAC != podMAC || r.HostMAC != hostMAC {
				t.Errorf("%s %s: MACs pod %s host %s, want %s %s", c.id, ip, r.PodMAC, r.HostMAC, podMAC, hostMAC)
			}
			if r.TxPackets == 0 || r.RxPackets == 0 || r.TxBytes == 0 || r.RxBytes == 0 {
				t.Errorf("%s %s: tx %d/%d rx %d/%d, want traffic both ways", c.id, ip, r.TxPackets, r.TxBytes, r.RxPackets, r.RxBytes)
			}
			for k, v := range r.Drops {
				if v != 0 {
					t.Errorf("%s %s: drops %s=%d, want none", c.id, ip, k, v)
				}
			}
		}
	}

	table := string(dump())
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	if len(lines) != 5 {
		t.Errorf("table has %d lines, want header + 4:\n%s", len(lines), table)
	}
	if f := strings.Fields(lines[0]); len(f) == 0 || f[0] != "IP" || !strings.Contains(lines[0], "INTERFACE") ||
		!strings.Contains(lines[0], "RX PKTS") || !strings.Contains(lines[0], "TX PKTS") {
		t.Errorf("table header %q, want IP ... INTERFACE ... RX PKTS ... TX PKTS", lines[0])
	}
	for _, ip := range []net.IP{a4, a6, b4, b6} {
		found := false
		for _, l := range lines[1:] {
			if f := strings.Fields(l); len(f) > 0 && f[0] == ip.String() {
				found = true
				if !strings.Contains(l, "default/web-") {
					t.Errorf("table row of %s lacks the pod name: %q", ip, l)
				}
			}
		}
		if !found {
			t.Errorf("table lacks a row for %s:\n%s", ip, table)
		}
	}

	e.mustDel(a, "pod-a")
	e.mustDel(b, "pod-b")
	e.assertClean()
}

// TestDatapathDelUnderTraffic deletes pods while packets flow to and from
// them over both families: pod -> node, node -> pod (kernel stack) and a peer
// pod -> pod (bpf_redirect_peer, counted for the destination by the peer's
// program). DEL must still leave no trace of the pod, counters included.
// Several rounds, as the window is a race.
func TestDatapathDelUnderTraffic(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	peer := e.newPod()
	e.cleanupDel(peer, "peer")
	e.add(peer, "peer")
	fromPeer := udpSocket(t, peer, nil)
	fromNode := udpSocket(t, e.node, nil)
	m := e.maps()

	for round := 0; round < 5; round++ {
		id := fmt.Sprintf("pod-%d", round)
		p := e.newPod()
		e.cleanupDel(p, id)
		r := e.add(p, id)
		p4, p6 := podIPs(t, r)
		hostIf, idx := e.hostVeth(id)
		fromPod := udpSocket(t, p, nil)

		stop := make(chan struct{})
		done := make(chan int, 1)
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					done <- n
					return
				default:
				}
				fromPod.WriteToUDP([]byte("x"), &net.UDPAddr{IP: nodeIP4, Port: 9})
				fromPod.WriteToUDP([]byte("x"), &net.UDPAddr{IP: nodeIP6, Port: 9})
				fromNode.WriteToUDP([]byte("y"), &net.UDPAddr{IP: p4, Port: 9})
				fromNode.WriteToUDP([]byte("y"), &net.UDPAddr{IP: p6, Port: 9})
				fromPeer.WriteToUDP([]byte("z"), &net.UDPAddr{IP: p4, Port: 9})
				fromPeer.WriteToUDP([]byte("z"), &net.UDPAddr{IP: p6, Port: 9})
				n++
			}
		}()
		// Wait until every kind of traffic is seen on the pod's veth.
		deadline := time.Now().Add(2 * time.Second)
		for {
			cs, _ := m.Counters(idx)
			if cs[maps.CounterKey{Dir: maps.DirEgress, Reason: maps.ReasonForward}].Packets > 0 &&
				cs[maps.CounterKey{Dir: maps.DirIngress, Reason: maps.ReasonForward}].Packets > 0 &&
				cs[maps.CounterKey{Dir: maps.DirIngress, Reason: maps.ReasonRedirect}].Packets > 0 {
				break
			}
			if time.Now().After(deadline) {
				close(stop)
				<-done
				t.Fatalf("round %d: traffic not flowing before DEL: %s", round, dumpCounters(m, idx))
			}
			time.Sleep(10 * time.Millisecond)
		}
		err := e.del(p, id, "eth0")
		close(stop)
		sent := <-done
		if err != nil {
			t.Fatalf("DEL %s under traffic: %v", id, err)
		}
		all, _ := m.AllCounters()
		if cs, ok := all[uint32(idx)]; ok {
			var parts []string
			for k, c := range cs {
				parts = append(parts, fmt.Sprintf("%s/%s=%dp", k.Dir, k.Reason, c.Packets))
			}
			t.Errorf("round %d: after DEL of %s (host ifindex %d, %d send rounds during the test) the counters map still holds %s",
				round, id, idx, sent, strings.Join(parts, " "))
		}
		// Everything else of this pod is gone too (the peer stays).
		var left []string
		for _, l := range e.leftovers() {
			// Addresses and indexes must match whole ("ifindex 3" is not "ifindex 30").
			for _, mark := range []string{" " + p4.String(), " " + p6.String(),
				fmt.Sprintf("ifindex %d", idx), fmt.Sprintf("links map entry %d", idx)} {
				if hasToken(l, mark) {
					left = append(left, l)
					break
				}
			}
			if strings.Contains(l, hostIf) || strings.Contains(l, id+"_") {
				left = append(left, l)
			}
		}
		if len(left) > 0 {
			t.Fatalf("round %d: DEL of %s under traffic left:\n  %s", round, id, strings.Join(left, "\n  "))
		}
	}
	e.mustDel(peer, "peer")
	e.assertClean()
}

// hasToken reports whether mark occurs in s not followed by another digit or
// address character ("ifindex 3" must not match "ifindex 30", nor 10.0.0.1 10.0.0.12).
func hasToken(s, mark string) bool {
	for i := 0; ; {
		j := strings.Index(s[i:], mark)
		if j < 0 {
			return false
		}
		end := i + j + len(mark)
		if end == len(s) || !strings.ContainsRune("0123456789abcdef:.", rune(s[end])) {
			return true
		}
		i = i + j + 1
	}
}
