// Single-stack networks and pods: IPv4-only and IPv6-only networks, a pod
// without IPv6, the runtime's ranges and requested addresses against the
// network's families.

package integration

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
	"github.com/vishvananda/netlink"
)

// TestDatapathSingleStack runs with IPv4-only and IPv6-only IPAM.
func TestDatapathSingleStack(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		subnet string
		v4     bool
	}{{"ipv4-only", testenv.PodSubnet4, true}, {"ipv6-only", testenv.PodSubnet6, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := testenv.New(t)
			e.IPAM = map[string]any{
				"type":    "host-local",
				"dataDir": e.DataDir,
				"ranges":  [][]map[string]string{{{"subnet": c.subnet}}},
			}
			a, b := e.NewPod(), e.NewPod()
			e.CleanupDel(a, "pod-a")
			e.CleanupDel(b, "pod-b")
			ra := e.Add(a, "pod-a")
			rb := e.Add(b, "pod-b")
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
			dst, node := b4, testenv.NodeIP4
			if !c.v4 {
				dst, node = b6, testenv.NodeIP6
			}
			if err := testenv.Ping(a, dst, 2); err != nil {
				t.Error(err)
			}
			if err := testenv.Ping(a, node, 2); err != nil {
				t.Error(err)
			}
			a4, a6 := resultIPs(ra)
			if c.v4 {
				if err := testenv.Ping(e.Node, a4, 1); err != nil {
					t.Error(err)
				}
			} else if err := testenv.Ping(e.Node, a6, 1); err != nil {
				t.Error(err)
			}
			if err := testenv.TCPTransfer(a, b, dst, 1<<20); err != nil {
				t.Error(err)
			}

			e.MustDel(a, "pod-a")
			e.MustDel(b, "pod-b")
			e.AssertClean()
		})
	}
}

// TestReview17IPRangesCapability: host-local takes ranges from the runtime
// too (the "ipRanges" capability, runtimeConfig.ipRanges, prepended to the
// configured ones), so an IPv4-only ipam block does not make an IPv4-only
// network. A runtime giving an IPv6 range gets a working dual-stack pod
// whose host veth carries IPv6, as before the change.
func TestReview17IPRangesCapability(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}}
	e.Extra = map[string]any{"capabilities": map[string]bool{"ipRanges": true}}
	pod := e.NewPod()
	e.CleanupDel(pod, "ranges")
	rt := e.RuntimeConf(pod, "ranges", "eth0")
	rt.CapabilityArgs = map[string]any{"ipRanges": [][]map[string]string{{{"subnet": testenv.PodSubnet6}}}}
	var res types.Result
	err := e.InNode(func() error {
		var err error
		res, err = e.CNI.AddNetworkList(context.Background(), e.ConfList("1.1.0"), rt)
		return err
	})
	if err != nil {
		e.AssertNothingOf("ranges")
		t.Fatalf("ADD with a runtime IPv6 range: %v", err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := resultIPs(r)
	if v4 == nil || v6 == nil {
		t.Fatalf("result IPs %v, want one of each family", r.IPs)
	}
	hostIf, _ := e.HostVeth("ranges")
	if got := testenv.ReadSysctl(t, e.Node, "/proc/sys/net/ipv6/conf/"+hostIf+"/disable_ipv6"); got != "0" {
		t.Errorf("host veth %s of a dual-stack pod: disable_ipv6 %s", hostIf, got)
	}
	e.PodReachable(t, pod, []net.IP{v4, v6})
	if err := e.InNode(func() error {
		return e.CNI.DelNetworkList(context.Background(), e.ConfList("1.1.0"), rt)
	}); err != nil {
		t.Fatal(err)
	}
	e.AssertClean()
}

// TestReview17PodWithoutIPv6: a pod whose netns has IPv6 switched off
// entirely (all and default disable_ipv6) on an IPv4-only network works:
// arp_notify set by netlink, node and pod reach each other, DEL leaves
// nothing. On a dual-stack network the ADD is a CNI error that leaves
// nothing.
func TestReview17PodWithoutIPv6(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		ranges [][]map[string]string
		ok     bool
	}{
		{"v4", [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}, true},
		{"dual", [][]map[string]string{{{"subnet": testenv.PodSubnet4}}, {{"subnet": testenv.PodSubnet6}}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := testenv.New(t)
			e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": c.ranges}
			pod := e.NewPod()
			for _, f := range []string{"all", "default"} {
				testenv.WriteSysctl(t, pod, "/proc/sys/net/ipv6/conf/"+f+"/disable_ipv6", "1")
			}
			e.CleanupDel(pod, "nov6")
			res, err := e.AddV("1.1.0", pod, "nov6", "eth0")
			if !c.ok {
				var te *types.Error
				if err == nil || !errors.As(err, &te) || te.Code == 0 {
					t.Fatalf("ADD of a dual-stack pod without IPv6: %v, want a CNI error", err)
				}
				t.Logf("refused as wanted: %v", err)
				e.AssertClean()
				return
			}
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			r, err := current.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			if got := testenv.ReadSysctl(t, pod, "/proc/sys/net/ipv4/conf/eth0/arp_notify"); got != "1" {
				t.Errorf("arp_notify in the pod: %s", got)
			}
			v4, _ := resultIPs(r)
			if err := testenv.Ping(e.Node, v4, 2); err != nil {
				t.Errorf("node to pod: %v", err)
			}
			if err := testenv.TCPTransfer(pod, e.Node, testenv.NodeIP4, 64<<10); err != nil {
				t.Errorf("pod to node: %v", err)
			}
			if err := e.Check(pod, "nov6", "eth0"); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			if err := e.Del(pod, "nov6", "eth0"); err != nil {
				t.Fatal(err)
			}
			e.AssertClean()
		})
	}
}

// TestReview17RequestedIPv6OnV4Network: an IPv6 address requested from an
// IPv4-only host-local network (CNI_ARGS IP=, the "ips" capability) cannot
// sneak past the v4Only inference: host-local refuses it, the ADD fails
// with a CNI error and leaves nothing; a requested IPv4 address works.
func TestReview17RequestedIPv6OnV4Network(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}}
	e.Extra = map[string]any{"capabilities": map[string]bool{"ips": true}}
	for _, c := range []struct {
		name string
		set  func(rt *libcni.RuntimeConf)
		ok   bool
	}{
		{"cni-args-v6", func(rt *libcni.RuntimeConf) { rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"IP", "fd00:250::5"}} }, false},
		{"ips-v6", func(rt *libcni.RuntimeConf) { rt.CapabilityArgs = map[string]any{"ips": []string{"fd00:250::5/64"}} }, false},
		{"ips-v4-and-v6", func(rt *libcni.RuntimeConf) {
			rt.CapabilityArgs = map[string]any{"ips": []string{"10.250.0.7/24", "fd00:250::5/64"}}
		}, false},
		{"ips-v4", func(rt *libcni.RuntimeConf) { rt.CapabilityArgs = map[string]any{"ips": []string{"10.250.0.7/24"}} }, true},
	} {
		pod := e.NewPod()
		id := "req-" + c.name
		e.CleanupDel(pod, id)
		rt := e.RuntimeConf(pod, id, "eth0")
		c.set(rt)
		var res types.Result
		err := e.InNode(func() error {
			var err error
			res, err = e.CNI.AddNetworkList(context.Background(), e.ConfList("1.1.0"), rt)
			return err
		})
		if !c.ok {
			var te *types.Error
			if err == nil || !errors.As(err, &te) || te.Code == 0 {
				t.Errorf("%s: ADD %v (%v), want a CNI error", c.name, res, err)
			}
			e.AssertNothingOf(id)
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		r, _ := current.NewResultFromResult(res)
		if len(r.IPs) != 1 || !r.IPs[0].Address.IP.Equal(net.ParseIP("10.250.0.7")) {
			t.Errorf("%s: IPs %v, want 10.250.0.7", c.name, r.IPs)
		}
		if err := testenv.Ping(e.Node, net.ParseIP("10.250.0.7"), 1); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if err := e.InNode(func() error {
			return e.CNI.DelNetworkList(context.Background(), e.ConfList("1.1.0"), rt)
		}); err != nil {
			t.Fatal(err)
		}
	}
	e.AssertClean()
}
