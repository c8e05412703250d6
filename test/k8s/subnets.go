package main

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// -subnets: each node on its own subnet (node i on 10.255.(i-1).0/24 and,
// dual-stack, fd00:255:0:(i-1)::/64, each a bridge br<i-1> in the
// control-plane namespace), joined by a router namespace (.254 / ::fe on
// every subnet) that forwards between them and has no route to any pod
// CIDR: pods of different nodes reach each other only through the tunnel
// (the agent runs with -tunnel, vxlan by default), as on nodes in two racks
// or two cloud subnets (issue 24).
//
// The control-plane namespace has an address on every subnet (.1 / ::1) and
// does not forward (ip_forward and IPv6 forwarding off): it stands for a
// control-plane node, reaching each node and, through it, the node's pods
// (the API server's proxy and e2e.test need that, as a control plane that
// runs the CNI has it), but it is never a path between the nodes. Each node
// reaches the API server's address (on br0) through the control plane's
// address on its own subnet, so that traffic never crosses the router
// either: what crosses the router is node to node, and pods' traffic.

// numSubnets: one per node with -subnets, else one.
func (c *cluster) numSubnets() int {
	if c.o.subnets {
		return numNodes
	}
	return 1
}

// subnetPrefix: the first three octets of subnet sn ("10.255.<sn>").
func subnetPrefix(sn int) string { return fmt.Sprintf("%s.%d", fabricNet, sn) }

// subnetPrefix6: subnet sn's IPv6 /64 prefix, ending in "::" (subnet 0 is
// fabricPrefix6's /64).
func subnetPrefix6(sn int) string {
	if sn == 0 {
		return fabricPrefix6
	}
	return fmt.Sprintf("%s%x::", fabricNet6, sn)
}

// holders: the run's network-namespace holders (control plane, nodes and,
// with -subnets, the router).
func (c *cluster) holders() []*proc {
	hs := []*proc{c.cp}
	for _, n := range c.nodes {
		hs = append(hs, n.holder)
	}
	if c.router != nil {
		hs = append(hs, c.router)
	}
	return hs
}

// routerNetwork links the router namespace to every subnet's bridge and
// turns forwarding off in the control-plane namespace.
func (c *cluster) routerNetwork() error {
	for _, s := range [][]string{
		{"sysctl", "-qw", "net.ipv4.ip_forward=0"},
		{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=0"},
	} {
		if _, err := in(c.cp, false, s...); err != nil {
			return err
		}
	}
	pid := strconv.Itoa(c.router.cmd.Process.Pid)
	steps := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
	}
	for sn := 0; sn < c.numSubnets(); sn++ {
		cpEnd, rtEnd := fmt.Sprintf("v-router%d", sn), fmt.Sprintf("eth%d", sn)
		for _, s := range [][]string{
			{"ip", "link", "add", cpEnd, "type", "veth", "peer", "name", rtEnd, "netns", pid},
			{"ip", "link", "set", cpEnd, "master", fmt.Sprintf("br%d", sn), "up"},
		} {
			if _, err := in(c.cp, false, s...); err != nil {
				return err
			}
		}
		steps = append(steps,
			[]string{"ip", "addr", "add", subnetPrefix(sn) + ".254/24", "dev", rtEnd},
			[]string{"ip", "link", "set", rtEnd, "up"})
		if c.o.dualStack {
			steps = append(steps, []string{"ip", "addr", "add", subnetPrefix6(sn) + "fe/64", "dev", rtEnd, "nodad"})
		}
	}
	for _, s := range steps {
		if _, err := in(c.router, false, s...); err != nil {
			return err
		}
	}
	return nil
}

// subnetRoutes: node n's routes to the other subnets via the router, and to
// the API server's address via the control plane's address on n's subnet.
func (c *cluster) subnetRoutes(n *node) [][]string {
	if !c.o.subnets {
		return nil
	}
	var steps [][]string
	for sn := 0; sn < c.numSubnets(); sn++ {
		if sn == n.subnet {
			continue
		}
		steps = append(steps, []string{"ip", "route", "add", subnetPrefix(sn) + ".0/24", "via", subnetPrefix(n.subnet) + ".254"})
		if c.o.dualStack {
			steps = append(steps, []string{"ip", "-6", "route", "add", subnetPrefix6(sn) + "/64", "via", subnetPrefix6(n.subnet) + "fe"})
		}
	}
	if n.subnet != 0 {
		steps = append(steps, []string{"ip", "route", "add", c.cpIP + "/32", "via", subnetPrefix(n.subnet) + ".1"})
	}
	return steps
}

// checkSubnets proves the topology -subnets promises, by route lookups:
// the router reaches every node but no pod CIDR, the nodes reach each
// other through the router only, and the control plane does not forward.
func (c *cluster) checkSubnets() error {
	if !c.o.subnets {
		return nil
	}
	for _, n := range c.nodes {
		for _, cidr := range n.podCIDRs {
			ip, _, err := net.ParseCIDR(cidr)
			if err != nil {
				return err
			}
			if out, err := in(c.router, false, "ip", "route", "get", ip.String()); err == nil {
				return fmt.Errorf("the router has a route to %s's pod CIDR %s: %s", n.name, cidr, strings.TrimSpace(out))
			}
		}
		for _, m := range c.nodes {
			if m == n {
				continue
			}
			for _, a := range m.ips() {
				out, err := in(n.holder, false, "ip", "route", "get", a)
				if err != nil {
					return fmt.Errorf("%s has no route to %s's address %s: %w", n.name, m.name, a, err)
				}
				gw := subnetPrefix(n.subnet) + ".254"
				if strings.Contains(a, ":") {
					gw = subnetPrefix6(n.subnet) + "fe"
				}
				if !strings.Contains(out, " via "+gw+" ") {
					return fmt.Errorf("%s reaches %s's address %s other than via the router %s: %s", n.name, m.name, a, gw, strings.TrimSpace(out))
				}
			}
		}
	}
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		out, err := in(c.cp, false, "sysctl", "-n", k)
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != "0" {
			return fmt.Errorf("the control-plane namespace forwards (%s = %s): it would join the subnets", k, strings.TrimSpace(out))
		}
	}
	logf("subnets: %d nodes on %d subnets, reaching each other via the router only; the router has no route to any pod CIDR; the control plane does not forward",
		numNodes, c.numSubnets())
	return nil
}

// topology: the run's network, for its results.
func (o options) topology() string {
	t := "one subnet, host-gw"
	if o.subnets {
		t = fmt.Sprintf("%d subnets behind a router (no route to pod CIDRs)", numNodes)
	} else if o.tunnel != "" {
		t = "one subnet"
	}
	if o.tunnel != "" {
		t += ", tunnel " + o.tunnel
	}
	if o.dualStack {
		t += ", dual-stack"
	}
	return t
}
