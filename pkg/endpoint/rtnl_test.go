package endpoint

import (
	"errors"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// TestDeleteLinkByIndex: deleteLinkIndex's one RTM_DELLINK naming the
// ifindex removes that link only, and a second call (the link gone: a
// DEL's retry) is no error, even when another link has taken the name
// since: that link stays. Through a kept socket (DEL's) and through a
// socket per request (nil), in a fresh netns.
func TestDeleteLinkByIndex(t *testing.T) {
	netns := freshNetns(t)
	err := netns.Do(func(ns.NetNS) error {
		r, err := openRTNL()
		if err != nil {
			return err
		}
		defer r.Close()
		for _, via := range []*rtnl{r, nil} {
			idx := map[string]int{}
			for _, n := range []string{"dl0", "dl1"} {
				if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n}, PeerName: n + "p"}); err != nil {
					return err
				}
				l, err := netlink.LinkByName(n)
				if err != nil {
					return err
				}
				idx[n] = l.Attrs().Index
			}
			if err := deleteLinkIndex(via, idx["dl0"]); err != nil {
				t.Errorf("deleteLinkIndex(dl0) (kept socket %v): %v", via.kept(), err)
			}
			var nf netlink.LinkNotFoundError
			if _, err := netlink.LinkByName("dl0"); !errors.As(err, &nf) {
				t.Errorf("dl0 after deleteLinkIndex (kept socket %v): %v", via.kept(), err)
			}
			// Another link takes the name; the retry leaves it.
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "dl0"}, PeerName: "dl0q"}); err != nil {
				return err
			}
			if err := deleteLinkIndex(via, idx["dl0"]); err != nil {
				t.Errorf("deleteLinkIndex(dl0) again (kept socket %v): %v", via.kept(), err)
			}
			for _, n := range []string{"dl0", "dl1"} {
				l, err := netlink.LinkByName(n)
				if err != nil {
					t.Errorf("%s, not the ifindex deleted, is gone too (kept socket %v): %v", n, via.kept(), err)
					continue
				}
				_ = netlink.LinkDel(l)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestKeptPodSocketsActInPodNetns: the pod's sockets that DEL opens inside
// the pod's netns (podSide) act there when used from a thread in the
// node's netns, as DEL's sweep uses them once the veth is gone: the parked
// objects of the pod go, the calling netns is not looked at.
func TestKeptPodSocketsActInPodNetns(t *testing.T) {
	netns := freshNetns(t)
	var r *rtnl
	var idx map[string]int
	err := netns.Do(func(ns.NetNS) (err error) {
		if err := netlink.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo"}}); err != nil {
			return err
		}
		idx = twoPodInterfaces(t)
		r, err = openRTNL()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !parkNexthopsOn(r, idx["nh0"], true) {
		t.Fatal("parkNexthopsOn(nh0) through the pod's kept socket, from the node's thread, parked nothing")
	}
	if err := netns.Do(func(ns.NetNS) error { return netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nh0"}}) }); err != nil {
		t.Fatal(err)
	}
	if err := sweepParked(r); err != nil {
		t.Fatal(err)
	}
	_ = netns.Do(func(ns.NetNS) error {
		nhs, err := listNexthops(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, nh := range nhs {
			if nh.parked() && nexthopTable(nh.id) == podTable(idx["nh0"]) {
				t.Errorf("parked nexthop %d of the deleted nh0 left after the sweep through the kept socket", nh.id)
			}
		}
		return nil
	})
}
