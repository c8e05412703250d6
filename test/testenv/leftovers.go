package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Leftovers lists every trace of ebpf-cni in the env: veths, routes to pods,
// IPAM reservations, map entries, link pins and state records.
func (e *Env) Leftovers() []string {
	e.T.Helper()
	var out []string
	e.InNode(func() error {
		links, _ := netlink.LinkList()
		for _, l := range links {
			if n := l.Attrs().Name; strings.HasPrefix(n, state.HostIfPrefix) || strings.HasPrefix(n, state.HandedOffPrefix) {
				out = append(out, "link "+n)
			}
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			routes, _ := netlink.RouteList(nil, fam)
			for _, r := range routes {
				if r.Dst == nil {
					continue
				}
				for _, s := range []string{PodSubnet4, PodSubnet6} {
					_, sn, _ := net.ParseCIDR(s)
					if sn.Contains(r.Dst.IP) {
						out = append(out, "route "+r.Dst.String())
					}
				}
			}
		}
		return nil
	})
	ents, _ := os.ReadDir(filepath.Join(e.DataDir, e.Name))
	for _, en := range ents {
		if net.ParseIP(en.Name()) != nil {
			out = append(out, "ipam reservation "+en.Name())
		}
	}
	if m, err := datapath.OpenMaps(e.PinDir); err == nil {
		eps, _ := m.Endpoints().List()
		for _, ep := range eps {
			out = append(out, "endpoint map entry "+ep.IP.String())
		}
		links, _ := m.Links().Ifindexes()
		for _, k := range links {
			out = append(out, fmt.Sprintf("links map entry %d", k))
		}
		all, _ := m.Stats().All()
		for idx := range all {
			out = append(out, fmt.Sprintf("counters of ifindex %d", idx))
		}
		lims, _ := m.Bandwidth().ListLimits()
		for _, l := range lims {
			out = append(out, fmt.Sprintf("%s limit of ifindex %d", l.Dir, l.Ifindex))
		}
		// The agent's cluster CIDRs are its own (--cluster-cidrs, every
		// node's from the Node objects or --peers), not a pod's: only
		// the attachments' uses are leftovers of DEL.
		users, _ := m.Masq().ClusterCIDRUsers()
		agents, _ := m.Masq().ClusterCIDRsOf(datapath.AgentCIDROwner)
		cidrs, _ := m.Masq().ClusterCIDRs()
		for _, c := range cidrs {
			if !agents[c] || users[c] > 1 {
				out = append(out, "cluster CIDR "+c.String())
			}
		}
		for c, n := range users {
			if agents[c] {
				n--
			}
			if n > 0 {
				out = append(out, fmt.Sprintf("%d users of cluster CIDR %s", n, c))
			}
		}
		parts, _ := m.StackFlows().Parts()
		for _, idx := range parts {
			out = append(out, fmt.Sprintf("%s%d", StackFlowTableLeftover, idx))
		}
		nss, _ := m.Bandwidth().ListNetns()
		for cookie, v := range nss {
			if v.Flags&maps.FlagNetnsNode == 0 { // the node's own entry stays with the node
				out = append(out, fmt.Sprintf("netns entry %d", cookie))
			}
		}
		m.Close()
	}
	// Host veths' links; the node's (node/) outlive pods.
	for _, p := range datapath.VethLinkPins(e.PinDir) {
		out = append(out, "link pin "+filepath.Base(p.Path))
	}
	recs, _ := os.ReadDir(filepath.Join(e.StateDir, e.Name))
	for _, r := range recs {
		out = append(out, "state record "+r.Name())
	}
	return out
}

// AssertClean fails the test if anything of ebpf-cni is left. Veths a DEL
// handed off to a running agent (and their pins) are given HandOffWait
// to go: the agent deletes them when no verb runs.
func (e *Env) AssertClean() {
	e.T.Helper()
	l := e.Leftovers()
	for deadline := time.Now().Add(HandOffWait); len(l) > 0 && onlyHandedOff(l) && time.Now().Before(deadline); l = e.Leftovers() {
		time.Sleep(20 * time.Millisecond)
	}
	if len(l) > 0 {
		e.T.Fatalf("state left behind:\n  %s", strings.Join(l, "\n  "))
	}
}

// HandOffWait bounds how long a running agent may take to delete the veths
// DEL handed off (each deletion waits for a moment without a verb, then
// out RCU grace periods).
const HandOffWait = 10 * time.Second

// StackFlowTableLeftover starts the leftover line of a pod's own
// stack-flow table (cni_stack_flow_parts).
const StackFlowTableLeftover = "stack-flow table of ifindex "

// onlyHandedOff tells whether every leftover is a handed-off veth or pin,
// or a stack-flow table (DEL leaves a handed-off pod's to the agent).
func onlyHandedOff(l []string) bool {
	for _, s := range l {
		if !strings.HasPrefix(s, "link "+state.HandedOffPrefix) && !strings.HasPrefix(s, "link pin "+state.HandedOffPrefix) &&
			!strings.HasPrefix(s, StackFlowTableLeftover) {
			return false
		}
	}
	return true
}

// HostPortLeftovers lists hostPort state of the env that DEL should remove.
func (e *Env) HostPortLeftovers() []string {
	m, err := datapath.OpenMaps(e.PinDir)
	if err != nil {
		return nil
	}
	defer m.Close()
	var out []string
	hps, _ := m.HostPorts().List()
	for _, h := range hps {
		out = append(out, "hostport "+h.Listen())
	}
	flows, _ := m.HostPorts().ListCT()
	for _, f := range flows {
		out = append(out, fmt.Sprintf("ct %s -> %s -> %s", f.Client, f.Dialled, f.Pod))
	}
	socks, _ := m.HostPorts().ListSockRNAT()
	for _, s := range socks {
		out = append(out, fmt.Sprintf("sock rnat %d %s -> %s", s.Cookie, s.Dialled, s.Pod))
	}
	return out
}

func (e *Env) AssertNoHostPorts() {
	e.T.Helper()
	if l := e.HostPortLeftovers(); len(l) > 0 {
		e.T.Fatalf("hostPort state left behind:\n  %s", strings.Join(l, "\n  "))
	}
}

// Attachment is what a test remembers of one ADD to look for its traces later.
type Attachment struct {
	Pod     ns.NetNS
	ID      string
	IfName  string
	HostIf  string
	Ifindex int
	IPs     []net.IP
}

// AddAttachment adds a pod and remembers everything needed to find its traces.
func (e *Env) AddAttachment(pod ns.NetNS, containerID string) *Attachment {
	e.T.Helper()
	r := e.Add(pod, containerID)
	a := &Attachment{Pod: pod, ID: containerID, IfName: "eth0", HostIf: state.HostIfName(containerID, "eth0")}
	a.Ifindex = e.HostIfindex(a.HostIf)
	for _, ipc := range r.IPs {
		a.IPs = append(a.IPs, ipc.Address.IP)
	}
	return a
}

// NodeLinkExists reports whether a link of that name exists in the node netns.
func (e *Env) NodeLinkExists(name string) bool {
	found := false
	e.InNode(func() error {
		_, err := netlink.LinkByName(name)
		found = err == nil
		return nil
	})
	return found
}

// ReservationsOf lists host-local reservation files held by a container ID
// (host-local writes "<containerID>\r\n<ifname>" into the file named by the IP).
func (e *Env) ReservationsOf(containerID string) []string {
	var out []string
	dir := filepath.Join(e.DataDir, e.Name)
	ents, _ := os.ReadDir(dir)
	for _, en := range ents {
		if net.ParseIP(en.Name()) == nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, en.Name()))
		if err != nil {
			continue
		}
		if first, _, _ := strings.Cut(string(b), "\n"); strings.TrimSpace(first) == containerID {
			out = append(out, en.Name())
		}
	}
	return out
}

// RecordPath is where ADD keeps the state record of an attachment.
func (e *Env) RecordPath(containerID, ifname string) string {
	return e.Store().Path(containerID, ifname)
}

// Traces lists everything of one attachment still present on the node: its
// host veth, link pins, state record, IPAM reservations (by IP and by owner),
// endpoint map entries (by IP and by ifindex), links map entry and counters.
func (e *Env) Traces(a *Attachment) []string {
	e.T.Helper()
	var out []string
	if e.NodeLinkExists(a.HostIf) {
		out = append(out, "host veth "+a.HostIf)
	}
	for _, dir := range []string{"ingress", "egress"} {
		p := datapath.LinkPinPath(e.PinDir, a.HostIf, dir)
		if _, err := os.Stat(p); err == nil {
			out = append(out, "link pin "+p)
		}
	}
	if _, err := os.Stat(e.RecordPath(a.ID, a.IfName)); err == nil {
		out = append(out, "state record of "+a.ID)
	}
	for _, ip := range a.IPs {
		if _, err := os.Stat(filepath.Join(e.DataDir, e.Name, ip.String())); err == nil {
			out = append(out, "ipam reservation "+ip.String())
		}
	}
	for _, r := range e.ReservationsOf(a.ID) {
		out = append(out, "ipam reservation owned by "+a.ID+": "+r)
	}
	m := e.Maps()
	for _, ip := range a.IPs {
		if _, err := m.Endpoints().Lookup(ip); err == nil {
			out = append(out, "endpoint map entry "+ip.String())
		}
	}
	if a.Ifindex != 0 {
		eps, _ := m.Endpoints().List()
		for _, ep := range eps {
			if int(ep.Info.Ifindex) == a.Ifindex {
				out = append(out, fmt.Sprintf("endpoint map entry %s -> ifindex %d", ep.IP, a.Ifindex))
			}
		}
		if _, err := m.Links().Lookup(a.Ifindex); err == nil {
			out = append(out, fmt.Sprintf("links map entry %d", a.Ifindex))
		}
		if c, _ := m.Stats().Counters(a.Ifindex); len(c) > 0 {
			out = append(out, fmt.Sprintf("counters of ifindex %d: %v", a.Ifindex, c))
		}
	}
	return out
}

// AssertGone fails the test if anything of the attachment is left.
func (e *Env) AssertGone(a *Attachment) {
	e.T.Helper()
	if tr := e.Traces(a); len(tr) > 0 {
		e.T.Errorf("%s/%s left behind:\n  %s", a.ID, a.IfName, strings.Join(tr, "\n  "))
	}
}

// WaitLinkGone waits until the kernel has removed a node link (netns
// destruction runs asynchronously).
func (e *Env) WaitLinkGone(name string) {
	e.T.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.NodeLinkExists(name) {
		if time.Now().After(deadline) {
			e.T.Fatalf("%s still exists 5s after its pod netns was destroyed", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AssertNothingOf fails when anything of a failed ADD of containerID is
// left: its veth, record, IPAM reservation, endpoint entries.
func (e *Env) AssertNothingOf(containerID string) {
	e.T.Helper()
	if err := e.InNode(func() error {
		_, err := netlink.LinkByName(state.HostIfName(containerID, "eth0"))
		return err
	}); err == nil {
		e.T.Errorf("veth of %s left", containerID)
	}
	if recs, _ := os.ReadDir(filepath.Join(e.StateDir, e.Name)); len(recs) != 0 {
		e.T.Errorf("records left: %v", recs)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.DataDir, e.Name)); len(ents) != 0 {
		for _, en := range ents {
			if net.ParseIP(en.Name()) != nil {
				e.T.Errorf("IPAM reservation %s left", en.Name())
			}
		}
	}
	if m, err := datapath.OpenMaps(e.PinDir); err == nil {
		defer m.Close()
		if eps, _ := m.Endpoints().List(); len(eps) != 0 {
			e.T.Errorf("endpoint entries left: %+v", eps)
		}
	}
}

// AssertNothingOfPod fails when anything of a refused ADD of containerID
// is left beside other pods: its veth, record, IPAM reservations, link
// pins; endpoint entries beyond the others' (endpoints: how many they hold).
func (e *Env) AssertNothingOfPod(containerID string, endpoints int) {
	e.T.Helper()
	hostIf := state.HostIfName(containerID, "eth0")
	if e.NodeLinkExists(hostIf) {
		e.T.Errorf("veth of %s left", containerID)
	}
	if _, err := os.Stat(e.RecordPath(containerID, "eth0")); err == nil {
		e.T.Errorf("record of %s left", containerID)
	}
	if r := e.ReservationsOf(containerID); len(r) > 0 {
		e.T.Errorf("IPAM reservations of %s left: %v", containerID, r)
	}
	for _, dir := range []string{"ingress", "egress"} {
		if _, err := os.Stat(datapath.LinkPinPath(e.PinDir, hostIf, dir)); err == nil {
			e.T.Errorf("%s link pin of %s left", dir, containerID)
		}
	}
	if m, err := datapath.OpenMaps(e.PinDir); err == nil {
		defer m.Close()
		if eps, _ := m.Endpoints().List(); len(eps) != endpoints {
			e.T.Errorf("%d endpoint entries, want the other pods' %d: %+v", len(eps), endpoints, eps)
		}
	}
}
