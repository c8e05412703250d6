package testenv

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// HostVeth returns the name and node-netns ifindex of a pod's host veth.
func (e *Env) HostVeth(containerID string) (string, int) {
	e.T.Helper()
	name := state.HostIfName(containerID, "eth0")
	return name, e.HostIfindex(name)
}

// HostRoutesTo lists the node's routes to a pod address, by link.
func (e *Env) HostRoutesTo(ip net.IP) []netlink.Route {
	e.T.Helper()
	bits := 128
	fam := netlink.FAMILY_V6
	if ip.To4() != nil {
		bits, fam = 32, netlink.FAMILY_V4
	}
	var out []netlink.Route
	e.InNode(func() error {
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}}, netlink.RT_FILTER_DST)
		out = rs
		return err
	})
	return out
}

// AssertOwns fails unless every address of a is a's alone on the node: its
// endpoint entry and the node's one route to it lead to a's host veth.
func (e *Env) AssertOwns(t *testing.T, a *Attachment) {
	t.Helper()
	m := e.Maps()
	for _, ip := range a.IPs {
		ep, err := m.Endpoints().Lookup(ip)
		if err != nil || int(ep.Ifindex) != a.Ifindex {
			t.Errorf("cni_endpoints entry of %s: %+v (err %v), want ifindex %d (%s)", ip, ep, err, a.Ifindex, a.ID)
		}
		rs := e.HostRoutesTo(ip)
		if len(rs) != 1 || rs[0].LinkIndex != a.Ifindex {
			t.Errorf("node routes to %s: %v, want one, via ifindex %d (%s)", ip, rs, a.Ifindex, a.ID)
		}
	}
}

// ---- 2. One owner per address ----------------------------------------------

// NetnsCookieOf returns the netns cookie of a pod.
func (e *Env) NetnsCookieOf(pod ns.NetNS) uint64 {
	e.T.Helper()
	var c uint64
	err := pod.Do(func(ns.NetNS) error {
		var err error
		c, err = datapath.NetnsCookie()
		return err
	})
	if err != nil {
		e.T.Fatal(err)
	}
	return c
}

// NodeV6Defaults lists the node's IPv6 default routes through a link.
func (e *Env) NodeV6Defaults(ifindex int) []netlink.Route {
	var out []netlink.Route
	e.InNode(func() error {
		rs, _ := netlink.RouteList(nil, netlink.FAMILY_V6)
		for _, r := range rs {
			if r.LinkIndex == ifindex && (r.Dst == nil || isDefaultNet(r.Dst)) {
				out = append(out, r)
			}
		}
		return nil
	})
	return out
}

func isDefaultNet(n *net.IPNet) bool { ones, _ := n.Mask.Size(); return ones == 0 }

// Sibling is a second network on e's node with a pin directory of its own
// (and its own state, IPAM range and cache).
func (e *Env) Sibling(t *testing.T) *Env {
	s := &Env{T: t, Name: RandName("net"), Node: e.Node, Extra: map[string]any{}}
	s.PinDir = filepath.Join(datapath.BPFFSRoot, RandName("ebpf-cni-test-"))
	t.Cleanup(func() { os.RemoveAll(s.PinDir) })
	s.StateDir, s.DataDir, s.CacheDir = t.TempDir(), t.TempDir(), t.TempDir()
	s.CNI = libcni.NewCNIConfigWithCacheDir([]string{BinDir}, s.CacheDir, nil)
	s.IPAM = map[string]any{
		"type": "host-local", "dataDir": s.DataDir,
		"ranges": [][]map[string]string{{{"subnet": "10.251.0.0/24"}}, {{"subnet": "fd00:251::/64"}}},
	}
	return s
}
