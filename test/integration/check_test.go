// CHECK: it passes right after ADD and names each kind of damage.

package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestLifecycleCheck: CHECK passes right after ADD and names each kind of
// damage: a missing route in the pod, a detached program, a missing map entry.
func TestLifecycleCheck(t *testing.T) {
	e := testenv.New(t)
	cases := []struct {
		name   string
		damage func(t *testing.T, p *testenv.Attachment)
		want   func(p *testenv.Attachment) []string // substrings of the CHECK error
	}{
		{
			name: "default route removed in pod",
			damage: func(t *testing.T, p *testenv.Attachment) {
				err := p.Pod.Do(func(ns.NetNS) error {
					routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
					if err != nil {
						return err
					}
					for _, r := range routes {
						if r.Dst == nil || r.Dst.IP.Equal(net.IPv4zero) {
							if ones, _ := maskOnes(r.Dst); ones == 0 {
								// By destination, as "ip route del default": the
								// route's next hop is a nexthop object, which a
								// delete naming a device and gateway does not match.
								r.LinkIndex, r.Gw, r.Flags = 0, nil, 0
								return netlink.RouteDel(&r)
							}
						}
					}
					return errors.New("pod has no IPv4 default route")
				})
				if err != nil {
					t.Fatalf("delete default route: %v", err)
				}
			},
			want: func(*testenv.Attachment) []string { return []string{"route", "0.0.0.0", "not found"} },
		},
		{
			// CHECK compares the routes itself (not plugins' pkg/ip): the
			// IPv6 default route is found without a destination too.
			name: "IPv6 default route removed in pod",
			damage: func(t *testing.T, p *testenv.Attachment) {
				err := p.Pod.Do(func(ns.NetNS) error {
					routes, err := netlink.RouteList(nil, netlink.FAMILY_V6)
					if err != nil {
						return err
					}
					for _, r := range routes {
						if ones, _ := maskOnes(r.Dst); r.Dst == nil || ones == 0 {
							r.LinkIndex, r.Gw, r.Flags = 0, nil, 0 // see above
							return netlink.RouteDel(&r)
						}
					}
					return errors.New("pod has no IPv6 default route")
				})
				if err != nil {
					t.Fatalf("delete IPv6 default route: %v", err)
				}
			},
			want: func(*testenv.Attachment) []string { return []string{"route", "::/0", "not found"} },
		},
		{
			name: "ingress program detached",
			damage: func(t *testing.T, p *testenv.Attachment) {
				// A tcx link where the pod has one (an agent moved it),
				// else the cls_bpf filter ADD attached without an agent.
				l, err := link.LoadPinnedLink(datapath.LinkPinPath(e.PinDir, p.HostIf, "ingress"), nil)
				if err == nil {
					defer l.Close()
					if err := l.Detach(); err != nil {
						t.Fatalf("detach ingress link of %s: %v", p.HostIf, err)
					}
					return
				}
				err = e.InNode(func() error {
					return netlink.FilterDel(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
						LinkIndex: p.Ifindex, Parent: netlink.HANDLE_MIN_INGRESS, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1,
					}})
				})
				if err != nil {
					t.Fatalf("%s has no ingress link pin, and its ingress filter could not be deleted: %v", p.HostIf, err)
				}
			},
			want: func(p *testenv.Attachment) []string { return []string{"not attached", p.HostIf, "ingress"} },
		},
		{
			name: "endpoint map entry deleted",
			damage: func(t *testing.T, p *testenv.Attachment) {
				if err := e.Maps().Endpoints().Delete(p.IPs[0], 0); err != nil {
					t.Fatalf("delete endpoint %s: %v", p.IPs[0], err)
				}
			},
			want: func(p *testenv.Attachment) []string { return []string{"cni_endpoints", p.IPs[0].String()} },
		},
	}
	var added []*testenv.Attachment
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := e.AddAttachment(e.NewPod(), fmt.Sprintf("check-%d", i))
			added = append(added, p)
			if err := e.Check(p.Pod, p.ID, "eth0"); err != nil {
				t.Fatalf("CHECK right after ADD: %v", err)
			}
			c.damage(t, p)
			err := e.Check(p.Pod, p.ID, "eth0")
			wantErrContains(t, "CHECK after damage", err, c.want(p)...)
		})
	}
	// Damaged or not, DEL cleans up.
	for _, p := range added {
		if err := e.Del(p.Pod, p.ID, "eth0"); err != nil {
			t.Fatalf("DEL %s: %v", p.ID, err)
		}
	}
	e.AssertClean()
}

// TestIntegrityCheck: CHECK passes right after ADD and names each thing that
// cuts a pod off or misroutes it: the node's route to it, its host veth
// down, an MTU that differs between the ends or from the network's, the
// pod's MAC no longer the one the datapath delivers to, its interface's
// rule or table. Before, CHECK passed with the route deleted or the veth down.
func TestIntegrityCheck(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	// tcx: "program detached" detaches the pod's link (an agent-less ADD
	// attaches cls_bpf filters; TestLifecycleCheck damages those).
	e.Extra = map[string]any{"mtu": 1400, "attachMode": "tcx"}
	inNode := func(t *testing.T, f func() error) {
		t.Helper()
		if err := e.InNode(f); err != nil {
			t.Fatal(err)
		}
	}
	inPod := func(t *testing.T, p *testenv.Attachment, f func() error) {
		t.Helper()
		if err := p.Pod.Do(func(ns.NetNS) error { return f() }); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name   string
		damage func(t *testing.T, p *testenv.Attachment)
		want   func(p *testenv.Attachment) []string
	}{
		{"node route to the pod deleted", func(t *testing.T, p *testenv.Attachment) {
			inNode(t, func() error {
				return netlink.RouteDel(&netlink.Route{LinkIndex: p.Ifindex, Scope: netlink.SCOPE_LINK, Dst: &net.IPNet{IP: p.IPs[0], Mask: net.CIDRMask(32, 32)}})
			})
		}, func(p *testenv.Attachment) []string { return []string{"no route", p.IPs[0].String(), p.HostIf} }},
		{"node route to the pod moved to another link", func(t *testing.T, p *testenv.Attachment) {
			r := &netlink.Route{Dst: &net.IPNet{IP: p.IPs[1], Mask: net.CIDRMask(128, 128)}}
			inNode(t, func() error {
				lo, _ := netlink.LinkByName("lo")
				r.LinkIndex = lo.Attrs().Index
				return netlink.RouteReplace(r)
			})
			t.Cleanup(func() { e.InNode(func() error { return netlink.RouteDel(r) }) })
		}, func(p *testenv.Attachment) []string { return []string{p.IPs[1].String(), "link lo", p.HostIf} }},
		{"host veth down", func(t *testing.T, p *testenv.Attachment) {
			inNode(t, func() error {
				l, err := netlink.LinkByName(p.HostIf)
				if err != nil {
					return err
				}
				return netlink.LinkSetDown(l)
			})
		}, func(p *testenv.Attachment) []string { return []string{p.HostIf, "down"} }},
		{"host veth MTU changed", func(t *testing.T, p *testenv.Attachment) {
			inNode(t, func() error {
				l, err := netlink.LinkByName(p.HostIf)
				if err != nil {
					return err
				}
				return netlink.LinkSetMTU(l, 1300)
			})
		}, func(p *testenv.Attachment) []string { return []string{p.HostIf, "MTU 1300", "1400"} }},
		{"pod MTU changed", func(t *testing.T, p *testenv.Attachment) {
			inPod(t, p, func() error {
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				return netlink.LinkSetMTU(l, 1280)
			})
		}, func(p *testenv.Attachment) []string { return []string{"eth0", "MTU 1280", p.HostIf} }},
		{"pod MAC changed silently", func(t *testing.T, p *testenv.Attachment) {
			inPod(t, p, func() error {
				// No announcement, and no IPv6 (a young interface sends
				// router solicitations and MLD reports the datapath would
				// learn from); while up (down and up would send more).
				for _, f := range []string{"/proc/sys/net/ipv4/conf/eth0/arp_notify", "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"} {
					v := "0"
					if strings.HasSuffix(f, "disable_ipv6") {
						v = "1"
					}
					if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
						return err
					}
				}
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				mac, _ := net.ParseMAC("02:99:99:99:99:99")
				return netlink.LinkSetHardwareAddr(l, mac)
			})
		}, func(p *testenv.Attachment) []string { return []string{"eth0", "02:99:99:99:99:99", "cni_links"} }},
		{"pod rule deleted", func(t *testing.T, p *testenv.Attachment) {
			inPod(t, p, func() error {
				rs, err := netlink.RuleList(netlink.FAMILY_V4)
				if err != nil {
					return err
				}
				for _, r := range rs {
					if r.Src != nil && r.Src.IP.Equal(p.IPs[0]) {
						return netlink.RuleDel(&r)
					}
				}
				return errors.New("no rule from the pod's address")
			})
		}, func(p *testenv.Attachment) []string { return []string{"rule", p.IPs[0].String(), "missing"} }},
		{"program detached", func(t *testing.T, p *testenv.Attachment) {
			l, err := link.LoadPinnedLink(datapath.LinkPinPath(e.PinDir, p.HostIf, "egress"), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := l.Detach(); err != nil { // at once; dropping the pin detaches later
				t.Fatal(err)
			}
		}, func(p *testenv.Attachment) []string { return []string{"not attached", p.HostIf, "egress"} }},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := fmt.Sprintf("chk-%d", i)
			pod := e.NewPod()
			e.CleanupDel(pod, id)
			p := e.AddAttachment(pod, id)
			if err := e.Check(pod, id, "eth0"); err != nil {
				t.Fatalf("CHECK right after ADD: %v", err)
			}
			c.damage(t, p)
			err := e.Check(pod, id, "eth0")
			wantErrContains(t, "CHECK after: "+c.name, err, c.want(p)...)
			if err := e.Del(pod, id, "eth0"); err != nil {
				t.Fatalf("DEL of the damaged pod: %v", err)
			}
		})
	}
	e.AssertClean()
}

// TestIntegrityCheckOlderPod: a pod added by a build before per-interface
// tables (its record has no podTable, the pod no rule) still passes CHECK
// after the upgrade, and DEL cleans it up.
func TestIntegrityCheckOlderPod(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "older")
	e.AddAttachment(pod, "older")
	path := e.RecordPath("older", "eth0")
	b, err := os.ReadFile(path)
	must(t, err)
	var rec map[string]any
	must(t, json.Unmarshal(b, &rec))
	delete(rec, "podTable")
	b, _ = json.Marshal(rec)
	must(t, os.WriteFile(path, b, 0o600))
	err = pod.Do(func(ns.NetNS) error {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, _ := netlink.RuleList(fam)
			for _, r := range rs {
				if r.Table >= 10000 {
					if err := netlink.RuleDel(&r); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	must(t, err)
	if err := e.Check(pod, "older", "eth0"); err != nil {
		t.Fatalf("CHECK of a pod of the older layout: %v", err)
	}
	e.MustDel(pod, "older")
	e.AssertClean()
}
