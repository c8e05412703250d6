package endpoint

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Check verifies an attachment against prevResult, the result of its ADD:
// the host veth, its routes and programs, the map entries, each feature's
// part, and inside the pod the interface, its addresses, routes and rules.
// The error names the first thing that does not match.
func Check(n *Network, id ID, prev *current.Result, features []Feature) error {
	netns, err := OpenNetns(id.Netns)
	if err != nil {
		return err
	}
	defer netns.Close()

	var podIf *current.Interface
	for _, i := range prev.Interfaces {
		if i.Name == id.IfName && i.Sandbox != "" {
			podIf = i
		}
	}
	if podIf == nil {
		return checkError("prevResult has no interface %s in a sandbox", id.IfName)
	}
	if err := n.CheckDirs(); err != nil {
		return err
	}
	defer datapath.MarkBusy(n.PinDir)() // the agent's background work waits
	rec, _ := n.Store().Read(id.ContainerID, id.IfName)
	a := &Attachment{Net: n, ID: id, HostIf: state.HostIfName(id.ContainerID, id.IfName), IPs: prev.IPs, features: features}
	host, err := a.checkHost(rec)
	if err != nil {
		return err
	}
	if a.DP, err = datapath.Open(n.PinDir); err != nil {
		return Errorf(ErrUnavailable, "datapath at %s: %w", n.PinDir, err)
	}
	defer a.DP.Close()
	mapMAC, err := a.checkMaps()
	if err != nil {
		return err
	}
	for _, f := range features {
		if err := f.Check(a); err != nil {
			return err
		}
	}
	err = netns.Do(func(ns.NetNS) error {
		return a.checkPod(podIf, host, mapMAC, prev, rec)
	})
	if name := host.Attrs().Name; err == nil && name != a.HostIf {
		// Everything else is as ADD left it (the datapath goes by the
		// ifindex): the pod's traffic flows; the name does not match
		// ADD's result, and what goes by the name (the link pins, the
		// agent's status) is ours to find under it.
		return a.renamedError(name)
	}
	return err
}

// renamedError is CHECK's failure for the host veth renamed to name. Its
// advice, the rename back, works only with the old name free: when another
// link holds it (another tool's, made since), `ip link set` fails (File
// exists), so the message names that link.
func (a *Attachment) renamedError(name string) error {
	what := fmt.Sprintf("host veth %s was renamed to %s (ifindex %d, still the pod's: its routes, map entries and programs are in place and its traffic flows; DEL removes it)",
		a.HostIf, name, a.Ifindex)
	back := fmt.Sprintf("ip link set %s name %s", name, a.HostIf)
	if l, err := netlinksafe.LinkByName(a.HostIf); err == nil && l.Attrs().Index != a.Ifindex {
		return checkError("%s: its name is held by %s now: rename it back (%s) once that link no longer holds the name",
			what, holderOf(l.Attrs().Index), back)
	}
	return checkError("%s: rename it back (%s)", what, back)
}

// checkHost checks the host veth (up, its MTU) and the node's routes to
// the pod's addresses; it sets a.Ifindex. The link under the host veth's
// name is the attachment's veth only by the teardown's rule
// (replacedLink): another tool's link made under the name once the veth
// went is a veth gone, not a veth to judge.
func (a *Attachment) checkHost(rec *state.Record) (netlink.Link, error) {
	host, err := netlinksafe.LinkByName(a.HostIf)
	if renamed := a.renamedHost(host, err, rec); renamed != nil {
		host, err = renamed, nil // judged as the veth; Check names the rename last
	}
	if err != nil {
		return nil, checkError("host veth %s: %w", a.HostIf, err)
	}
	if replacedLink(host, rec, a.Net.Name, a.ID.ContainerID, a.ID.IfName) {
		was := "no record is left"
		if rec != nil {
			was = fmt.Sprintf("the record's is ifindex %d", rec.HostIfindex)
		}
		return nil, checkError("host veth %s is gone: the link under its name (ifindex %d, alias %q) is not the attachment's (%s)",
			a.HostIf, host.Attrs().Index, host.Attrs().Alias, was)
	}
	a.Ifindex = host.Attrs().Index
	if host.Attrs().Flags&net.FlagUp == 0 {
		return nil, checkError("host veth %s is down: the pod is cut off", a.HostIf)
	}
	if a.Net.MTU != 0 && host.Attrs().MTU != a.Net.MTU {
		return nil, checkError("host veth %s has MTU %d, the network's mtu is %d", a.HostIf, host.Attrs().MTU, a.Net.MTU)
	}
	for _, ipc := range a.IPs {
		if err := checkHostRoute(ipc.Address.IP, a.Ifindex, a.HostIf); err != nil {
			return nil, err
		}
	}
	return host, nil
}

// renamedHost is the attachment's host veth under another name (an
// operator's `ip link set NAME name ...`), as the teardown finds it
// (findByRecord): not under its name (named, err: the look by name), and
// the link at the record's ifindex is the veth renamed (renamedVeth) or
// the one the record names (recordedVeth: the alias changed too). nil
// otherwise.
func (a *Attachment) renamedHost(named netlink.Link, err error, rec *state.Record) netlink.Link {
	if rec == nil || rec.HostIfindex == 0 {
		return nil
	}
	var nf netlink.LinkNotFoundError
	switch {
	case err != nil && !errors.As(err, &nf):
		return nil
	case err == nil && (named.Attrs().Index == rec.HostIfindex || !replacedLink(named, rec, a.Net.Name, a.ID.ContainerID, a.ID.IfName)):
		return nil
	}
	l, lerr := netlink.LinkByIndex(rec.HostIfindex)
	if lerr != nil || l.Attrs().Name == a.HostIf {
		return nil
	}
	if renamedHostVeth(nil, l, rec, a.Net.Name) {
		return l
	}
	return nil
}

// checkMaps checks the maps' sizes, the programs attached, the link entry
// and the endpoint entries; it returns the pod's MAC as cni_links has it.
func (a *Attachment) checkMaps() (string, error) {
	if err := a.DP.Maps.CheckSizing(a.Net.sizing); err != nil {
		return "", ConfError("pinDir %s: %w", a.Net.PinDir, err)
	}
	if err := a.DP.Attached(a.Ifindex, a.HostIf); err != nil {
		return "", checkError("%w", err)
	}
	li, err := a.DP.Maps.Links().Lookup(a.Ifindex)
	if err != nil {
		return "", checkError("map cni_links has no entry for %s (ifindex %d): %v", a.HostIf, a.Ifindex, notExist(err))
	}
	for _, ip := range a.PodIPs() {
		e, err := a.DP.Maps.Endpoints().Lookup(ip)
		if err != nil {
			return "", checkError("map cni_endpoints has no entry for %s: %v", ip, notExist(err))
		}
		if int(e.Ifindex) != a.Ifindex {
			return "", checkError("map cni_endpoints sends %s to ifindex %d, not %s (%d)", ip, e.Ifindex, a.HostIf, a.Ifindex)
		}
	}
	return net.HardwareAddr(li.Mac[:]).String(), nil
}

// checkPod checks the pod's side, in the calling thread's netns (the
// pod's): its interface (MAC, up, MTU, peer), addresses, routes and table.
func (a *Attachment) checkPod(podIf *current.Interface, host netlink.Link, mapMAC string, prev *current.Result, rec *state.Record) error {
	id := a.ID
	l, err := netlinksafe.LinkByName(id.IfName)
	if err != nil {
		return checkError("interface %s in %s: %w", id.IfName, id.Netns, err)
	}
	at := l.Attrs()
	if at.HardwareAddr.String() != mapMAC {
		return checkError("interface %s has MAC %s, the datapath delivers to %s (cni_links of %s): the pod has not sent from its new MAC yet",
			id.IfName, at.HardwareAddr, mapMAC, a.HostIf)
	}
	if podIf.Mac != "" && at.HardwareAddr.String() != podIf.Mac {
		return checkError("interface %s has MAC %s, prevResult says %s", id.IfName, at.HardwareAddr, podIf.Mac)
	}
	if at.Flags&net.FlagUp == 0 {
		return checkError("interface %s in %s is down", id.IfName, id.Netns)
	}
	if at.MTU != host.Attrs().MTU {
		return checkError("interface %s has MTU %d, its host veth %s %d: packets between them would be dropped", id.IfName, at.MTU, a.HostIf, host.Attrs().MTU)
	}
	if at.ParentIndex != a.Ifindex {
		return checkError("interface %s is not the peer of host veth %s", id.IfName, a.HostIf)
	}
	if err := checkPodAddrs(l, prev.IPs); err != nil {
		return err
	}
	if err := checkPodRoutes(prev.Routes); err != nil {
		return err
	}
	if rec != nil && rec.PodTable == 0 {
		return nil // added by a build before per-interface tables
	}
	return checkPodTable(id.IfName, at.Index, prev.IPs)
}

// checkPodRoutes: every route of prevResult is in the pod's main table
// (through its gateway when it names one). Ours, not plugins' pkg/ip: that
// package pulls iptables and nftables helpers into the plugin, whose
// package initialisation every ADD and DEL paid for (issue 30).
func checkPodRoutes(routes []*types.Route) error {
	for _, r := range routes {
		family := netlink.FAMILY_V4
		if r.Dst.IP.To4() == nil {
			if len(r.Dst.IP) != net.IPv6len {
				return checkError("prevResult route %v has no valid destination", r)
			}
			family = netlink.FAMILY_V6
		}
		find, filter := &netlink.Route{Dst: &r.Dst, Gw: r.GW}, netlink.RT_FILTER_DST
		if ones, _ := r.Dst.Mask.Size(); ones == 0 {
			find = &netlink.Route{} // the kernel reports a default route without a destination
		} else if r.GW != nil {
			filter |= netlink.RT_FILTER_GW
		}
		found, err := netlinksafe.RouteListFiltered(family, find, filter)
		if err != nil {
			return checkError("list routes for %s: %w", r.Dst.String(), err)
		}
		if len(found) == 0 {
			return checkError("route %s via %v from prevResult not found in the pod's routing table", r.Dst.String(), r.GW)
		}
	}
	return nil
}

// checkPodAddrs: every address of prevResult is on the pod's interface. Not
// ip.ValidateExpectedInterfaceIPs: it wants the prefix route that ADD
// deliberately leaves out (all traffic goes via the gateway).
func checkPodAddrs(l netlink.Link, ips []*current.IPConfig) error {
	addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return checkError("list addresses of %s: %w", l.Attrs().Name, err)
	}
	for _, ipc := range ips {
		found := false
		for _, ad := range addrs {
			if ad.IPNet.String() == ipc.Address.String() {
				found = true
				break
			}
		}
		if !found {
			return checkError("address %s is missing from %s", ipc.Address.String(), l.Attrs().Name)
		}
	}
	return nil
}

// checkHostRoute: the node routes a pod address to its host veth, and only there.
func checkHostRoute(ip net.IP, ifindex int, hostIf string) error {
	bits, fam := 128, netlink.FAMILY_V6
	if isV4(ip) {
		bits, fam = 32, netlink.FAMILY_V4
	}
	dst := &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}
	routes, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
	if err != nil {
		return checkError("list the node's routes to %s: %w", dst, err)
	}
	if len(routes) == 0 {
		return checkError("the node has no route to %s (host veth %s): the pod is unreachable", dst, hostIf)
	}
	for _, r := range routes {
		if r.LinkIndex != ifindex {
			return checkError("the node routes %s to %s, not to host veth %s", dst, holderOf(r.LinkIndex), hostIf)
		}
	}
	return nil
}

// checkPodTable: the interface's own table has its default routes and every
// address has its rule (see configurePod), in the calling thread's netns.
func checkPodTable(ifname string, ifindex int, ips []*current.IPConfig) error {
	table := podTable(ifindex)
	for _, ipc := range ips {
		want := podRule(ipc.Address.IP, table)
		rules, err := netlinksafe.RuleListFiltered(want.Family, &netlink.Rule{Table: table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return checkError("list rules: %w", err)
		}
		found := false
		for _, r := range rules {
			found = found || (r.Src != nil && r.Src.String() == want.Src.String())
		}
		if !found {
			return checkError("rule \"from %s lookup %d\" of %s is missing: replies from %s would leave by another interface", want.Src, table, ifname, ipc.Address.IP)
		}
		routes, err := netlinksafe.RouteListFiltered(want.Family, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return checkError("list routes of table %d: %w", table, err)
		}
		found = false
		for _, r := range routes {
			found = found || (r.LinkIndex == ifindex && (r.Dst == nil || isDefault(r.Dst)))
		}
		if !found {
			return checkError("table %d of %s has no default route for %s", table, ifname, ipc.Address.IP)
		}
	}
	return nil
}
