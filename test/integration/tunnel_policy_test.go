package integration

import (
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// startTunAgents runs the agent on every node of the lab with the tunnel
// (args added) and waits for its four routes (two peers, two families).
// It returns the agents, by node.
func startTunAgents(t *testing.T, lab *tunLab, args ...string) []*testenv.AgentProc {
	t.Helper()
	var procs []*testenv.AgentProc
	for i, e := range lab.nodes {
		dir := e.WriteConfDir()
		procs = append(procs, e.StartAgent(dir, append(append(lab.agentArgs(e), "--tunnel", "vxlan", "--metrics-addr", ""), args...)...))
		var out string
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			e.InNode(func() error {
				b, _ := exec.Command("ip", "-d", "route", "show", "proto", "199").CombinedOutput()
				b6, _ := exec.Command("ip", "-6", "-d", "route", "show", "proto", "199").CombinedOutput()
				out = string(b) + string(b6)
				return nil
			})
			if strings.Count(out, "\n") == 4 {
				break
			}
		}
		if n := strings.Count(out, "\n"); n != 4 {
			t.Fatalf("node %d: %d tunnel routes, want 4:\n%s", i+1, n, out)
		}
		_, mtu, _ := tunDevice(t, e)
		e.Extra["mtu"] = mtu
	}
	return procs
}

// TestTunnelPolicyEgress: a pod's egress NetworkPolicy holds for what it
// sends into the tunnel. from_container defers a denial to a destination
// that is no pod of its node (the stack may DNAT it) and the judgement
// after the stack ran only on uplinks (to_uplink) and host veths
// (to_container): a pod denied all egress reached pods of other nodes
// through ebpf-tun. The tunnel device's egress program (cni_to_tunnel)
// judges it now; an allowed peer still works, and so do replies to flows
// a peer opened.
func TestTunnelPolicyEgress(t *testing.T) {
	lab := newTunLab(t)
	n1, n2, n3 := lab.nodes[0], lab.nodes[1], lab.nodes[2]
	n1.Extra["networkPolicy"] = true
	startTunAgents(t, lab) // not hybrid: every other node through the tunnel

	a, ra := n1.RunPod("pa")
	b, rb := n2.RunPod("pb")
	c, rc := n3.RunPod("pc")
	a4, a6 := testenv.PodIPs(t, ra)
	b4, b6 := testenv.PodIPs(t, rb)
	c4, c6 := testenv.PodIPs(t, rc)
	_, idx := n1.HostVeth("pa")
	serve(t, a, 7002, "a")
	serve(t, b, 7001, "b")
	serve(t, c, 7001, "c")
	pw := n1.Maps().Policy().Writer()
	// kube-proxy on node 1: a ClusterIP for each of b and c. A ClusterIP
	// is routed by the default route (the uplink): from_container defers
	// a denial of it, the stack DNATs it into the tunnel.
	proxyModes[0].install(t, n1.Node, 4, tunCluster, []net.IP{tunNode[0]}, []svcPort{
		{name: "tunb", proto: "tcp", clusterIP: svcWeb[4], port: 80, backend: b4, target: 7001},
		{name: "tunc", proto: "tcp", clusterIP: svcLocal[4], port: 80, backend: c4, target: 7001},
	})

	// Open: both peers answer through the tunnel (the path works).
	if err := pw.Apply(uint32(idx), policy.Endpoint{}); err != nil {
		t.Fatal(err)
	}
	_, _, tx0 := tunDevice(t, n1)
	for _, ip := range []net.IP{b4, b6} {
		reach(t, a, "tcp", ip, 7001, "b")
	}
	for _, ip := range []net.IP{c4, c6} {
		reach(t, a, "tcp", ip, 7001, "c")
	}
	reach(t, a, "tcp", svcWeb[4], 80, "b")
	reach(t, a, "tcp", svcLocal[4], 80, "c")
	if _, _, tx := tunDevice(t, n1); tx == tx0 {
		t.Fatalf("node 1 sent nothing into the tunnel for its pod's connections to other nodes")
	}

	// Isolated for egress, only b allowed: c is out of reach, IPv4 and
	// IPv6, TCP, UDP and ping; b is not.
	if err := pw.Apply(uint32(idx), policy.Endpoint{Egress: isolated(
		allowAll(prefix(b4.String()+"/32")), allowAll(prefix(b6.String()+"/128")))}); err != nil {
		t.Fatal(err)
	}
	drops0 := counter(t, n1.Maps(), idx, maps.DirEgress, maps.ReasonDropPolicy).Packets
	for _, ip := range []net.IP{c4, c6} {
		blocked(t, a, "tcp", ip, 7001)
		blocked(t, a, "udp", ip, 7001)
		if err := testenv.Ping(a, ip, 1); err == nil {
			t.Errorf("a pod denied all egress but to %s pinged %s through the tunnel", b4, ip)
		}
	}
	for _, ip := range []net.IP{b4, b6} {
		reach(t, a, "tcp", ip, 7001, "b")
		reach(t, a, "udp", ip, 7001, "b")
	}
	// Through a Service: judged after the DNAT, on the tunnel device.
	reach(t, a, "tcp", svcWeb[4], 80, "b")
	blocked(t, a, "tcp", svcLocal[4], 80)
	// Replies to what peers open pass into the tunnel: the flow is the
	// peer's (ingress is open).
	for _, ip := range []net.IP{a4, a6} {
		reach(t, c, "tcp", ip, 7002, "a")
		reach(t, c, "udp", ip, 7002, "a")
	}
	// The drops are counted against the pod, as egress policy drops.
	if d := counter(t, n1.Maps(), idx, maps.DirEgress, maps.ReasonDropPolicy).Packets; d <= drops0 {
		t.Errorf("a's drop_policy egress counter stayed at %d", d)
	}
}

// vethTo adds, in the current netns, the veth name whose peer peerName is
// in peerNS, and returns name's link.
func vethTo(name, peerName string, peerNS ns.NetNS) (netlink.Link, error) {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peerName, PeerNamespace: netlink.NsFd(int(peerNS.Fd()))}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, err
	}
	return netlink.LinkByName(name)
}

// TestPolicyEgressLeavingByNonUplink6: TestPolicyEgressLeavingByNonUplink
// for IPv6, through a link holding no address but its link-local one (no
// uplink: to_uplink is not attached there). A pod denied all egress
// reaches nothing behind it; open, it does (the path works).
func TestPolicyEgressLeavingByNonUplink6(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	a := h.NewPod()
	h.CleanupDel(a, "a")
	h.Add(a, "a")
	_, idx := h.HostVeth("a")
	far := testenv.NewNS(t)
	farIP := net.ParseIP("2001:db8:77::2")
	noDAD := func(dev string) error {
		return tunSysctl("net.ipv6.conf."+dev+".accept_dad", "0")
	}
	var gw net.IP
	must(t, h.InNode(func() error {
		l, err := vethTo("side6", "eth0", far)
		if err != nil {
			return err
		}
		if err := noDAD("side6"); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		_, dst, _ := net.ParseCIDR("2001:db8:77::/64")
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst}); err != nil {
			return err
		}
		// A link-local address of its own (the kernel's comes with the
		// peer's carrier): the far host's gateway.
		ll, _ := netlink.ParseAddr("fe80::77:1/64")
		ll.Flags = unix.IFA_F_NODAD
		gw = ll.IP
		return netlink.AddrAdd(l, ll)
	}))
	must(t, far.Do(func(ns.NetNS) error {
		for _, n := range []string{"lo", "eth0"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if n == "eth0" {
				if err := noDAD(n); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		l, _ := netlink.LinkByName("eth0")
		ad, _ := netlink.ParseAddr(farIP.String() + "/64")
		ad.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(l, ad); err != nil {
			return err
		}
		_, dst, _ := net.ParseCIDR(testenv.PodSubnet6)
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: gw})
	}))
	serve(t, far, 7000, "far")
	if err := h.Maps().Policy().Writer().Apply(uint32(idx), policy.Endpoint{}); err != nil {
		t.Fatal(err)
	}
	reach(t, a, "tcp", farIP, 7000, "far")
	reach(t, a, "udp", farIP, 7000, "far")
	before := counter(t, h.Maps(), idx, maps.DirEgress, maps.ReasonDropPolicy).Packets
	if err := h.Maps().Policy().Writer().Apply(uint32(idx), policy.Endpoint{Egress: isolated()}); err != nil {
		t.Fatal(err)
	}
	blocked(t, a, "tcp", farIP, 7000)
	blocked(t, a, "udp", farIP, 7000)
	if err := testenv.Ping(a, farIP, 1); err == nil {
		t.Errorf("a pod denied all egress pinged %s behind a non-uplink link", farIP)
	}
	blocked(t, a, "tcp", remoteIP6, 7000) // by the uplink: judged there
	if d := counter(t, h.Maps(), idx, maps.DirEgress, maps.ReasonDropPolicy).Packets; d <= before {
		t.Errorf("a's drop_policy egress counter stayed at %d", d)
	}
	// Allowed again, to the far host only: reached; the pod's address is
	// its own (no masquerade on this link).
	if err := h.Maps().Policy().Writer().Apply(uint32(idx), policy.Endpoint{Egress: isolated(allowAll(prefix(farIP.String() + "/128")))}); err != nil {
		t.Fatal(err)
	}
	reach(t, a, "tcp", farIP, 7000, "far")
}
