package endpoint

import (
	"errors"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// TestDeleteLinkByName: deleteLink's one RTM_DELLINK naming the link
// removes that link only, and a second call (the link gone: a DEL's retry)
// is no error. Through a kept socket (DEL's) and through a socket per
// request (nil), in a fresh netns.
func TestDeleteLinkByName(t *testing.T) {
	netns := freshNetns(t)
	err := netns.Do(func(ns.NetNS) error {
		r, err := openRTNL()
		if err != nil {
			return err
		}
		defer r.Close()
		for _, n := range []string{"dl0", "dl1"} {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n}, PeerName: n + "p"}); err != nil {
				return err
			}
		}
		for _, via := range []*rtnl{r, nil} {
			if err := deleteLink(via, "dl0"); err != nil {
				t.Errorf("deleteLink(dl0) (kept socket %v): %v", via.kept(), err)
			}
			var nf netlink.LinkNotFoundError
			if _, err := netlink.LinkByName("dl0"); !errors.As(err, &nf) {
				t.Errorf("dl0 after deleteLink (kept socket %v): %v", via.kept(), err)
			}
		}
		if _, err := netlink.LinkByName("dl1"); err != nil {
			t.Errorf("dl1, not named, is gone too: %v", err)
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
