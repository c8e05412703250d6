// kube-proxy's rules (iptables and nftables modes), as the Services tests load them.

package integration

import (
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// Kubernetes Services as kube-proxy programs them, in a test node's netns:
// the rules below have the shape kube-proxy's iptables mode (KUBE-SERVICES,
// KUBE-SVC-*, KUBE-SEP-*, KUBE-EXT-*, KUBE-NODEPORTS, KUBE-MARK-MASQ,
// KUBE-POSTROUTING, KUBE-FORWARD with its conntrack INVALID drop) and
// nftables mode (a kube-proxy table with a service-ips verdict map, service,
// endpoint and external chains, masquerade by mark) give them, written for
// these tests from that shape.

// svcPort is one port of a Service with one endpoint.
type svcPort struct {
	name      string // chain-safe name
	proto     string // "tcp" or "udp"
	clusterIP net.IP
	port      int
	nodePort  int  // 0: none
	local     bool // externalTrafficPolicy Local: external clients are not masqueraded
	// noDetectLocal: kube-proxy without a cluster CIDR (no local-traffic
	// detection) does not masquerade off-cluster clients of the ClusterIP,
	// so a node socket reaches the endpoint with its own address and port.
	noDetectLocal bool
	backend       net.IP
	target        int
}

// proxyMode is how a test installs the rules.
type proxyMode struct {
	name    string
	install func(t *testing.T, node ns.NetNS, fam int, cluster string, nodeIPs []net.IP, svcs []svcPort)
}

var proxyModes = []proxyMode{
	{"iptables-nft", func(t *testing.T, node ns.NetNS, fam int, cluster string, nodeIPs []net.IP, svcs []svcPort) {
		restore(t, node, map[int]string{4: "iptables-nft-restore", 6: "ip6tables-nft-restore"}[fam], iptablesRules(fam, cluster, svcs))
	}},
	{"iptables-legacy", func(t *testing.T, node ns.NetNS, fam int, cluster string, nodeIPs []net.IP, svcs []svcPort) {
		restore(t, node, map[int]string{4: "iptables-legacy-restore", 6: "ip6tables-legacy-restore"}[fam], iptablesRules(fam, cluster, svcs))
	}},
	{"nftables", func(t *testing.T, node ns.NetNS, fam int, cluster string, nodeIPs []net.IP, svcs []svcPort) {
		restore(t, node, "nft", nftRules(fam, cluster, nodeIPs, svcs), "-f", "-")
	}},
}

// restore feeds rules to a restore command in the node netns.
func restore(t *testing.T, node ns.NetNS, cmd, rules string, args ...string) {
	t.Helper()
	err := node.Do(func(ns.NetNS) error {
		c := exec.Command(cmd, args...)
		c.Stdin = strings.NewReader(rules)
		var out bytes.Buffer
		c.Stdout, c.Stderr = &out, &out
		if err := c.Run(); err != nil {
			return fmt.Errorf("%s: %v: %s\nrules:\n%s", cmd, err, out.String(), rules)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func hostPrefix(ip net.IP) string {
	if ip.To4() != nil {
		return ip.String() + "/32"
	}
	return ip.String() + "/128"
}

// dnatTo is the DNAT destination of an endpoint: 10.0.0.1:80 or [fd00::1]:80.
func dnatTo(ip net.IP, port int) string { return net.JoinHostPort(ip.String(), fmt.Sprint(port)) }

// iptablesRules is an iptables-restore input (filter and nat tables).
func iptablesRules(fam int, cluster string, svcs []svcPort) string {
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) }
	w("*filter")
	w(":KUBE-FORWARD - [0:0]")
	w(`-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`)
	w("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP")
	w(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT`)
	w(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`)
	w("COMMIT")
	w("*nat")
	for _, c := range []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"} {
		w(":%s - [0:0]", c)
	}
	for _, s := range svcs {
		w(":KUBE-SVC-%s - [0:0]", strings.ToUpper(s.name))
		w(":KUBE-SEP-%s - [0:0]", strings.ToUpper(s.name))
		if s.nodePort != 0 {
			w(":KUBE-EXT-%s - [0:0]", strings.ToUpper(s.name))
			if s.local {
				w(":KUBE-SVL-%s - [0:0]", strings.ToUpper(s.name))
			}
		}
	}
	w(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`)
	w("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000")
	w("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN")
	w("-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0")
	w(`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	for _, s := range svcs {
		n := strings.ToUpper(s.name)
		cip := hostPrefix(s.clusterIP)
		w("-A KUBE-SERVICES -d %s -p %s -m %s --dport %d -j KUBE-SVC-%s", cip, s.proto, s.proto, s.port, n)
		if !s.noDetectLocal {
			w("-A KUBE-SVC-%s ! -s %s -d %s -p %s -m %s --dport %d -j KUBE-MARK-MASQ", n, cluster, cip, s.proto, s.proto, s.port)
		}
		w("-A KUBE-SVC-%s -j KUBE-SEP-%s", n, n)
		// Hairpin: an endpoint reaching itself through the Service is masqueraded.
		w("-A KUBE-SEP-%s -s %s -j KUBE-MARK-MASQ", n, hostPrefix(s.backend))
		w("-A KUBE-SEP-%s -p %s -m %s -j DNAT --to-destination %s", n, s.proto, s.proto, dnatTo(s.backend, s.target))
		if s.nodePort == 0 {
			continue
		}
		w("-A KUBE-NODEPORTS -p %s -m %s --dport %d -j KUBE-EXT-%s", s.proto, s.proto, s.nodePort, n)
		if !s.local {
			w("-A KUBE-EXT-%s -j KUBE-MARK-MASQ", n)
			w("-A KUBE-EXT-%s -j KUBE-SVC-%s", n, n)
			continue
		}
		// externalTrafficPolicy Local: pods take the cluster path, the node's
		// own clients are masqueraded, external clients reach the local
		// endpoints with their address kept.
		w("-A KUBE-EXT-%s -s %s -j KUBE-SVC-%s", n, cluster, n)
		w("-A KUBE-EXT-%s -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ", n)
		w("-A KUBE-EXT-%s -m addrtype --src-type LOCAL -j KUBE-SVC-%s", n, n)
		w("-A KUBE-EXT-%s -j KUBE-SVL-%s", n, n)
		w("-A KUBE-SVL-%s -j KUBE-SEP-%s", n, n)
	}
	lo := "127.0.0.0/8"
	if fam == 6 {
		lo = "::1/128"
	}
	w(`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" ! -d %s -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`, lo)
	w("COMMIT")
	return b.String()
}

// nftRules is an nft -f input: a kube-proxy table of the family. Beyond
// kube-proxy's nftables mode, its forward chain drops conntrack INVALID
// packets as the iptables mode's KUBE-FORWARD does, so a flow that went
// half around the stack fails here too.
func nftRules(fam int, cluster string, nodeIPs []net.IP, svcs []svcPort) string {
	tf, ipk, addrT := "ip", "ip", "ipv4_addr"
	if fam == 6 {
		tf, ipk, addrT = "ip6", "ip6", "ipv6_addr"
	}
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) }
	w("add table %s kube-proxy", tf)
	w("add set %s kube-proxy nodeport-ips { type %s ; }", tf, addrT)
	w("add map %s kube-proxy service-ips { type %s . inet_proto . inet_service : verdict ; }", tf, addrT)
	w("add map %s kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; }", tf)
	for _, c := range []string{"mark-for-masquerade", "masquerading", "services"} {
		w("add chain %s kube-proxy %s", tf, c)
	}
	w("add chain %s kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }", tf)
	w("add chain %s kube-proxy nat-output { type nat hook output priority -100 ; }", tf)
	w("add chain %s kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }", tf)
	w("add chain %s kube-proxy filter-forward { type filter hook forward priority 0 ; }", tf)
	w("add rule %s kube-proxy mark-for-masquerade mark set mark or 0x4000", tf)
	w("add rule %s kube-proxy masquerading mark and 0x4000 == 0 return", tf)
	w("add rule %s kube-proxy masquerading mark set mark xor 0x4000", tf)
	w("add rule %s kube-proxy masquerading masquerade fully-random", tf)
	w("add rule %s kube-proxy nat-prerouting jump services", tf)
	w("add rule %s kube-proxy nat-output jump services", tf)
	w("add rule %s kube-proxy nat-postrouting jump masquerading", tf)
	w("add rule %s kube-proxy filter-forward ct state invalid drop", tf)
	w("add rule %s kube-proxy services %s daddr . meta l4proto . th dport vmap @service-ips", tf, ipk)
	w("add rule %s kube-proxy services %s daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports", tf, ipk)
	for _, ip := range nodeIPs {
		w("add element %s kube-proxy nodeport-ips { %s }", tf, ip)
	}
	for _, s := range svcs {
		svc, ep, ext := "service-"+s.name, "endpoint-"+s.name, "external-"+s.name
		w("add chain %s kube-proxy %s", tf, svc)
		w("add chain %s kube-proxy %s", tf, ep)
		if !s.noDetectLocal {
			w("add rule %s kube-proxy %s %s daddr %s %s saddr != %s jump mark-for-masquerade", tf, svc, ipk, s.clusterIP, ipk, cluster)
		}
		w("add rule %s kube-proxy %s numgen random mod 1 vmap { 0 : goto %s }", tf, svc, ep)
		w("add rule %s kube-proxy %s %s saddr %s jump mark-for-masquerade", tf, ep, ipk, s.backend)
		w("add rule %s kube-proxy %s meta l4proto %s dnat to %s", tf, ep, s.proto, dnatTo(s.backend, s.target))
		w("add element %s kube-proxy service-ips { %s . %s . %d : goto %s }", tf, s.clusterIP, s.proto, s.port, svc)
		if s.nodePort == 0 {
			continue
		}
		w("add chain %s kube-proxy %s", tf, ext)
		if s.local {
			w("add rule %s kube-proxy %s %s saddr %s goto %s", tf, ext, ipk, cluster, svc)
			w("add rule %s kube-proxy %s fib saddr type local jump mark-for-masquerade", tf, ext)
			w("add rule %s kube-proxy %s fib saddr type local goto %s", tf, ext, svc)
			w("add rule %s kube-proxy %s goto %s", tf, ext, ep)
		} else {
			w("add rule %s kube-proxy %s jump mark-for-masquerade", tf, ext)
			w("add rule %s kube-proxy %s goto %s", tf, ext, svc)
		}
		w("add element %s kube-proxy service-nodeports { %s . %d : goto %s }", tf, s.proto, s.nodePort, ext)
	}
	return b.String()
}

// routeVia adds a route to dst via gw in netns.
func routeVia(t *testing.T, netns ns.NetNS, dst string, gw net.IP) {
	t.Helper()
	err := netns.Do(func(ns.NetNS) error {
		r := &netlink.Route{Gw: gw}
		if dst != "" {
			_, n, err := net.ParseCIDR(dst)
			if err != nil {
				return err
			}
			r.Dst = n
		}
		return netlink.RouteAdd(r)
	})
	if err != nil {
		t.Fatalf("route %q via %s: %v", dst, gw, err)
	}
}
