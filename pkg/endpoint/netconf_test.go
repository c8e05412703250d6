package endpoint

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestNetconf: forwarding reads what /proc/sys says, per family, and
// enableForwarding turns it on; upAnnouncing sets arp_notify and brings
// the link up in one netlink request. In a fresh netns, where forwarding starts off.
func TestNetconf(t *testing.T) {
	netns := freshNetns(t)
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	err := netns.Do(func(ns.NetNS) error {
		for _, f := range []struct {
			family uint8
			path   string
		}{{unix.AF_INET, "/proc/sys/net/ipv4/ip_forward"}, {unix.AF_INET6, "/proc/sys/net/ipv6/conf/all/forwarding"}} {
			for _, want := range []string{"0", "1", "0"} {
				if err := os.WriteFile(f.path, []byte(want), 0o644); err != nil {
					return err
				}
				on, err := forwarding(nil, f.family)
				if err != nil {
					t.Fatalf("forwarding(%d): %v", f.family, err)
				}
				if on != (want == "1") {
					t.Errorf("forwarding(%d) = %v with %s = %s", f.family, on, f.path, want)
				}
			}
		}
		if err := enableForwarding(nil, true, false); err != nil {
			return err
		}
		if read("/proc/sys/net/ipv4/ip_forward") != "1" || read("/proc/sys/net/ipv6/conf/all/forwarding") != "0" {
			t.Errorf("enableForwarding(v4 only): ip_forward %s, ipv6 forwarding %s; want 1, 0",
				read("/proc/sys/net/ipv4/ip_forward"), read("/proc/sys/net/ipv6/conf/all/forwarding"))
		}
		if err := enableForwarding(nil, true, true); err != nil {
			return err
		}
		if read("/proc/sys/net/ipv6/conf/all/forwarding") != "1" {
			t.Errorf("enableForwarding(v6): ipv6 forwarding %s", read("/proc/sys/net/ipv6/conf/all/forwarding"))
		}

		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nc0"}, PeerName: "nc1"}); err != nil {
			return err
		}
		l, err := netlink.LinkByName("nc0")
		if err != nil {
			return err
		}
		if got := read("/proc/sys/net/ipv4/conf/nc0/arp_notify"); got != "0" {
			t.Fatalf("arp_notify of a new veth: %s", got)
		}
		r, err := openRTNL() // as ADD does: a kept socket of the pod's netns
		if err != nil {
			return err
		}
		defer r.Close()
		if err := upAnnouncing(r, l, "nc0", true); err != nil {
			return err
		}
		if got := read("/proc/sys/net/ipv4/conf/nc0/arp_notify"); got != "1" {
			t.Errorf("arp_notify after upAnnouncing: %s, want 1", got)
		}
		// One request set both (issue 30): the link is up too.
		if l, err = netlink.LinkByName("nc0"); err != nil {
			return err
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("nc0 not up after upAnnouncing: %v", l.Attrs().Flags)
		}
		if l, err = netlink.LinkByName("nc1"); err != nil {
			return err
		}
		if l.Attrs().Flags&net.FlagUp != 0 {
			t.Errorf("the other end nc1 up after upAnnouncing nc0: %v", l.Attrs().Flags)
		}
		if got := read("/proc/sys/net/ipv4/conf/nc1/arp_notify"); got != "0" {
			t.Errorf("arp_notify of the other end: %s, want 0", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
