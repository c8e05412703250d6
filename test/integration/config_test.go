// Configurations: every CNI version, tc attach mode, MTU, the node's forwarding.

package integration

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestDatapathCNIVersions runs ADD, CHECK and DEL at every supported spec
// version and checks the result is in that version's format and the pod works.
func TestDatapathCNIVersions(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			e := testenv.New(t)
			p := e.NewPod()
			id := "pod-" + strings.ReplaceAll(v, ".", "")
			t.Cleanup(func() { _ = e.DelV(v, p, id, "eth0") })
			res, err := e.AddV(v, p, id, "eth0")
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

			hostIf := state.HostIfName(id, "eth0")
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

			for _, ip := range []net.IP{testenv.NodeIP4, testenv.NodeIP6} {
				if err := testenv.Ping(p, ip, 2); err != nil {
					t.Error(err)
				}
			}
			if v != "0.3.0" && v != "0.3.1" {
				if err := e.CheckV(v, p, id, "eth0"); err != nil {
					t.Errorf("CHECK at %s: %v", v, err)
				}
			}
			if err := e.DelV(v, p, id, "eth0"); err != nil {
				t.Fatalf("DEL at %s: %v", v, err)
			}
			e.AssertClean()
		})
	}
}

// TestDatapathAttachModeTC forces clsact + cls_bpf instead of tcx.
func TestDatapathAttachModeTC(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.Extra = map[string]any{"attachMode": "tc"}
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "pod-a")
	e.CleanupDel(b, "pod-b")
	e.Add(a, "pod-a")
	rb := e.Add(b, "pod-b")
	b4, b6 := testenv.PodIPs(t, rb)

	for _, id := range []string{"pod-a", "pod-b"} {
		name := state.HostIfName(id, "eth0")
		err := e.InNode(func() error {
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
	if pins := datapath.VethLinkPins(e.PinDir); len(pins) != 0 {
		t.Errorf("tc mode pinned tcx links: %v", pins)
	}

	for _, ip := range []net.IP{b4, b6} {
		if err := testenv.Ping(a, ip, 2); err != nil {
			t.Error(err)
		}
	}
	if err := testenv.Ping(a, testenv.NodeIP4, 1); err != nil {
		t.Error(err)
	}
	m := e.Maps()
	_, aIdx := e.HostVeth("pod-a")
	if c := counter(t, m, aIdx, maps.DirEgress, maps.ReasonRedirect); c.Packets == 0 {
		t.Errorf("tc mode: no redirect counted on pod-a's veth: %s", dumpCounters(m, aIdx))
	}
	if c := counter(t, m, aIdx, maps.DirIngress, maps.ReasonForward); c.Packets == 0 {
		t.Errorf("tc mode: egress filter never ran on pod-a's veth: %s", dumpCounters(m, aIdx))
	}

	e.MustDel(a, "pod-a")
	e.MustDel(b, "pod-b")
	e.AssertClean()
}

// TestDatapathMTU sets mtu 1400: both veth ends carry it and full-size
// unfragmentable packets cross pod to pod.
func TestDatapathMTU(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.Extra = map[string]any{"mtu": 1400}
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "pod-a")
	e.CleanupDel(b, "pod-b")
	ra := e.Add(a, "pod-a")
	rb := e.Add(b, "pod-b")
	b4, b6 := testenv.PodIPs(t, rb)

	for _, c := range []struct {
		id  string
		pod ns.NetNS
		res *current.Result
	}{{"pod-a", a, ra}, {"pod-b", b, rb}} {
		name := state.HostIfName(c.id, "eth0")
		var hostMTU, podMTU int
		e.InNode(func() error {
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
	if err := testenv.PingDF(a, b4, 1400-28); err != nil {
		t.Error(err)
	}
	if err := testenv.PingDF(a, b6, 1400-48); err != nil {
		t.Error(err)
	}

	e.MustDel(a, "pod-a")
	e.MustDel(b, "pod-b")
	e.AssertClean()
}

// TestReview17Forwarding: on a node with forwarding off, ADD turns it on
// for the pod's families only, read afresh at every ADD (forwarding is now
// read by netlink): switched off between two ADDs, the second turns it on
// again. (It reads the sysctls only; that forwarding carries pods' packets
// off the node is the masquerade and Service tests' to show.)
func TestReview17Forwarding(t *testing.T) {
	t.Parallel()
	const v4f, v6f = "/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"
	for _, c := range []struct {
		name   string
		ranges [][]map[string]string
		v4, v6 string
	}{
		{"v4", [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}, "1", "0"},
		{"v6", [][]map[string]string{{{"subnet": testenv.PodSubnet6}}}, "0", "1"},
		{"dual", [][]map[string]string{{{"subnet": testenv.PodSubnet4}}, {{"subnet": testenv.PodSubnet6}}}, "1", "1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := testenv.New(t)
			e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": c.ranges}
			for i, id := range []string{"fw-a", "fw-b"} {
				testenv.WriteSysctl(t, e.Node, v4f, "0")
				testenv.WriteSysctl(t, e.Node, v6f, "0")
				pod := e.NewPod()
				e.CleanupDel(pod, id)
				e.Add(pod, id)
				if got4, got6 := testenv.ReadSysctl(t, e.Node, v4f), testenv.ReadSysctl(t, e.Node, v6f); got4 != c.v4 || got6 != c.v6 {
					t.Errorf("ADD %d: ip_forward %s, ipv6 forwarding %s; want %s, %s", i, got4, got6, c.v4, c.v6)
				}
			}
		})
	}
}
