package integration

import (
	"net"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestPolicyEgressLeavingByNonUplink: from_container defers a denied
// packet to a destination that is no pod's and no node address's to the
// judgement after the stack, in to_uplink. The node hooks attach to_uplink
// only to uplinks: Ethernet links holding a node address. A route through
// any other link (a WireGuard or IPIP tunnel between nodes, a link without
// an address, one with only an IPv4 link-local address) leaves without a
// second judgement: a pod denied all egress reaches what lies behind it.
func TestPolicyEgressLeavingByNonUplink(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	a := h.NewPod()
	h.CleanupDel(a, "a")
	h.Add(a, "a")
	_, idx := h.HostVeth("a")
	far := testenv.NewNS(t)
	farIP := net.ParseIP("203.0.113.2").To4()
	must(t, h.InNode(func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "side0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(far.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		l, err := netlink.LinkByName("side0")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		// The far host's replies to pods: the node answers its ARP.
		if err := os.WriteFile("/proc/sys/net/ipv4/conf/side0/proxy_arp", []byte("1"), 0o644); err != nil {
			return err
		}
		_, dst, _ := net.ParseCIDR("203.0.113.0/24")
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst})
	}))
	must(t, far.Do(func(ns.NetNS) error {
		if err := linksUp("lo", "eth0"); err != nil {
			return err
		}
		l, _ := netlink.LinkByName("eth0")
		ad, _ := netlink.ParseAddr(farIP.String() + "/24")
		if err := netlink.AddrAdd(l, ad); err != nil {
			return err
		}
		_, dst, _ := net.ParseCIDR(testenv.PodSubnet4)
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst})
	}))
	serve(t, far, 7000, "far")
	// Open, the pod reaches it (the path works).
	if err := h.Maps().Policy().Writer().Apply(uint32(idx), policy.Endpoint{}); err != nil {
		t.Fatal(err)
	}
	reach(t, a, "tcp", farIP, 7000, "far")
	if err := h.Maps().Policy().Writer().Apply(uint32(idx), policy.Endpoint{Egress: isolated()}); err != nil {
		t.Fatal(err)
	}
	blocked(t, a, "tcp", farIP, 7000)
	blocked(t, a, "udp", farIP, 7000)
	blocked(t, a, "tcp", remoteIP4, 7000) // by the uplink: judged there
}
