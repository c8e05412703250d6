// attack19: a host on a node link that is no uplink (an Ethernet link with
// no node address: an unnumbered BGP link, a storage or management network
// used for L2 only; from_uplink is attached only to links holding a node
// address) forges the source of a packet into an isolated pod: the node's
// address (whose traffic always passes into pods), or the address of a pod
// the policy admits. from_uplink's checks against exactly these forgeries
// do not run there; does anything else stop them?

package integration

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

var (
	sideFarIP = map[int]net.IP{4: net.ParseIP("203.0.113.2").To4(), 6: net.ParseIP("fd00:203::2")}
	sideLL    = map[string]net.IP{"node": net.ParseIP("fe80::1"), "far": net.ParseIP("fe80::2")}
)

// plugSideLink links the node (side0: no address but fe80::1) to a new
// host far (203.0.113.2/24, fd00:203::2/64, fe80::2), the pod subnets routed
// from far over the link, far's subnets from the node.
func plugSideLink(t *testing.T, h *hpEnv) ns.NetNS {
	t.Helper()
	far := testenv.NewNS(t)
	ll := func(l netlink.Link, ip net.IP) error {
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD})
	}
	must(t, h.InNode(func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "side0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(far.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		l, err := netlink.LinkByName("side0")
		if err != nil {
			return err
		}
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/side0/addr_gen_mode", []byte("1"), 0o644); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		if err := ll(l, sideLL["node"]); err != nil {
			return err
		}
		if err := os.WriteFile("/proc/sys/net/ipv4/conf/side0/proxy_arp", []byte("1"), 0o644); err != nil {
			return err
		}
		for _, c := range []string{"203.0.113.0/24", "fd00:203::/64"} {
			_, dst, _ := net.ParseCIDR(c)
			r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst}
			if dst.IP.To4() == nil {
				r.Gw = sideLL["far"]
			}
			if err := netlink.RouteAdd(r); err != nil {
				return err
			}
		}
		return nil
	}))
	must(t, far.Do(func(ns.NetNS) error {
		if err := linksUp("lo", "eth0"); err != nil {
			return err
		}
		l, _ := netlink.LinkByName("eth0")
		for _, a := range []string{sideFarIP[4].String() + "/24", sideFarIP[6].String() + "/64"} {
			ad, _ := netlink.ParseAddr(a)
			ad.Flags = unix.IFA_F_NODAD
			if err := netlink.AddrAdd(l, ad); err != nil {
				return err
			}
		}
		if err := ll(l, sideLL["far"]); err != nil {
			return err
		}
		_, d4, _ := net.ParseCIDR(testenv.PodSubnet4)
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: d4}); err != nil {
			return err
		}
		_, d6, _ := net.ParseCIDR(testenv.PodSubnet6)
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: d6, Gw: sideLL["node"]})
	}))
	return far
}

// TestAttack19ForgedSourceFromSideLink: b admits UDP and TCP from pod a
// only (and, as every pod, the node). far, a host behind side0, sends b UDP
// datagrams with its own source (control: denied), with a's address and
// with the node's address as source, IPv4 and IPv6. b's server answers
// whoever the source says: a listener there on the forged port tells
// whether b took the datagram. None may. The node's IPv4 rp_filter is
// loose (2).
func TestAttack19ForgedSourceFromSideLink(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	p.apply(t, "a", policy.Endpoint{})
	p.apply(t, "h", policy.Endpoint{})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(allowAll(host(ip("a", 4))), allowAll(host(ip("a", 6))))})
	far := plugSideLink(t, p.hpEnv)
	const port = 5555
	// IPv4's reverse-path filter, loose as most distributions set it: it
	// stops the IPv4 forgeries here. A new netns has it off, and then the
	// datagram forged as pod a got into b over IPv4 too. IPv6 has none.
	must(t, p.InNode(func() error {
		for _, c := range []string{"all", "side0"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+c+"/rp_filter", []byte("2"), 0o644); err != nil {
				return err
			}
		}
		return nil
	}))
	for _, fam := range []int{4, 6} {
		reach(t, far, "udp", ip("h", fam), 80, "h") // the path works
		blocked(t, far, "udp", ip("b", fam), 8080)  // far's own address: denied
		for _, f := range []struct {
			name  string
			src   net.IP
			owner ns.NetNS
		}{{"pod a", ip("a", fam), p.a}, {"the node", nodeIP[fam], p.Node}} {
			var ln *net.UDPConn
			must(t, f.owner.Do(func(ns.NetNS) error {
				var err error
				ln, err = net.ListenUDP("udp", &net.UDPAddr{IP: f.src, Port: port})
				return err
			}))
			for i := 0; i < 3; i++ {
				sendForged(t, far, &net.UDPAddr{IP: f.src, Port: port}, &net.UDPAddr{IP: ip("b", fam), Port: 8080}, "forged")
			}
			ln.SetReadDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 512)
			if n, _, err := ln.ReadFromUDP(buf); err == nil {
				t.Errorf("IPv%d: far (behind side0, no uplink) forged %s's address %s: b took the datagram and answered %q", fam, f.name, f.src, buf[:n])
			}
			ln.Close()
		}
	}
}
