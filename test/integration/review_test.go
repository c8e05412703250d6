// Hostile review: attacks on the stack-flow table and the integrity of
// attachments that earlier tests did not cover.

package integration

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestReviewDelRacingAdd: a DEL of an attachment started while its ADD is
// under way (a runtime giving up on a slow ADD; the spec forbids it, runtimes
// still do it). Whatever the interleaving, the node ends as one of the two
// serial orders left it: the attachment complete and working (DEL first),
// or nothing of it (ADD first) - never a veth without its lease or record.
func TestReviewDelRacingAdd(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	for i := 0; i < 8; i++ {
		pod := e.NewPod()
		id := testenv.RandName("race")
		e.CleanupDel(pod, id)
		delay := time.Duration(i) * 4 * time.Millisecond
		type addOut struct {
			res types.Result
			err error
		}
		addCh, delCh := make(chan addOut, 1), make(chan error, 1)
		go func() { r, err := e.AddV("1.1.0", pod, id, "eth0"); addCh <- addOut{r, err} }()
		go func() { time.Sleep(delay); delCh <- e.Del(pod, id, "eth0") }()
		ao, derr := <-addCh, <-delCh
		t.Logf("round %d (DEL after %s): ADD %v, DEL %v", i, delay, ao.err, derr)
		hostIf := state.HostIfName(id, "eth0")
		if e.NodeLinkExists(hostIf) {
			if ao.err != nil {
				t.Errorf("round %d: ADD failed (%v) but its veth %s is left", i, ao.err, hostIf)
			} else if r, err := current.NewResultFromResult(ao.res); err != nil {
				t.Fatal(err)
			} else {
				v4, _ := testenv.PodIPs(t, r)
				if _, err := os.Stat(e.RecordPath(id, "eth0")); err != nil {
					t.Errorf("round %d: veth %s of %s left without its record: %v", i, hostIf, v4, err)
				}
				if len(e.ReservationsOf(id)) == 0 {
					t.Errorf("round %d: veth %s of %s left, its address not reserved in IPAM (the next pod gets it)", i, hostIf, v4)
				}
				if err := testenv.Ping(e.Node, v4, 1); err != nil {
					t.Errorf("round %d: the attachment left (%s) does not answer: %v", i, v4, err)
				}
			}
		} else {
			e.AssertNothingOf(id)
		}
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Errorf("round %d: final DEL: %v", i, err)
		}
		e.AssertNothingOf(id)
	}
}

// TestReviewOtherNetworksDelKeepsOwner: network B's ADD of a container ID and
// interface name that network A attached is refused; the runtime then DELs
// B's failed attachment, as runtimes do after a failed ADD. That DEL must
// remove nothing of A's pod: not its veth, not its map entries.
func TestReviewOtherNetworksDelKeepsOwner(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "shared")
	live := e.AddAttachment(pod, "shared")
	for _, same := range []bool{true, false} {
		pinDir := e.PinDir
		if !same {
			pinDir = filepath.Join(datapath.BPFFSRoot, testenv.RandName("ebpf-cni-test-"))
			t.Cleanup(func() { os.RemoveAll(pinDir) })
		}
		stateB := t.TempDir()
		netB := e.NetList(testenv.RandName("netb"), map[string]any{"type": "ebpf-cni", "pinDir": pinDir, "stateDir": stateB,
			"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{{{"subnet": "10.251.0.0/24"}}}}})
		rt := e.RuntimeConf(pod, "shared", "eth0")
		if _, err := e.AddList(netB, rt); err == nil {
			t.Fatalf("network B's ADD of network A's attachment succeeded")
		}
		// The refused ADD leaves no record: GC and the agent would take it
		// for a killed ADD of network B and tear down "its" veth.
		if recs, _ := os.ReadDir(filepath.Join(stateB, netB.Name)); len(recs) != 0 {
			t.Errorf("network B's refused ADD left records: %v", recs)
		}
		if err := e.InNode(func() error {
			return e.CNI.GCNetworkList(context.Background(), netB, &libcni.GCArgs{})
		}); err != nil {
			t.Errorf("network B's GC: %v", err)
		}
		if !e.NodeLinkExists(live.HostIf) {
			t.Fatalf("network B's GC (same pinDir: %v) deleted network A's host veth %s", same, live.HostIf)
		}
		if err := e.DelList(netB, rt); err != nil {
			t.Errorf("network B's DEL of its refused attachment: %v", err)
		}
		if !e.NodeLinkExists(live.HostIf) {
			t.Fatalf("network B's DEL (same pinDir: %v) deleted network A's host veth %s", same, live.HostIf)
		}
		e.AssertOwns(t, live)
		if err := e.Check(pod, "shared", "eth0"); err != nil {
			t.Errorf("CHECK of network A's pod after network B's DEL (same pinDir: %v): %v", same, err)
		}
		e.PodReachable(t, pod, live.IPs)
	}
	e.MustDel(pod, "shared")
	e.AssertClean()
}

// TestReviewConcurrentInterfaces: eth0 and net1 of one pod from two ebpf-cni
// networks, added at the same time (containerd's go-cni sets up the networks
// of a pod in parallel). Both ADDs succeed, as they do one after the other,
// and the pod has one default route per family, through one interface.
func TestReviewConcurrentInterfaces(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	netB := e.NetList(testenv.RandName("netb"), map[string]any{
		"type": "ebpf-cni", "pinDir": e.PinDir, "stateDir": t.TempDir(),
		"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(),
			"ranges": [][]map[string]string{{{"subnet": "10.251.0.0/24"}}, {{"subnet": "fd00:251::/64"}}}},
	})
	for i := 0; i < 6; i++ {
		pod := e.NewPod()
		id := testenv.RandName("multi")
		rtB := &libcni.RuntimeConf{ContainerID: id, NetNS: pod.Path(), IfName: "net1"}
		e.CleanupDel(pod, id)
		t.Cleanup(func() { e.DelList(netB, rtB) })
		errA, errB := make(chan error, 1), make(chan error, 1)
		go func() { _, err := e.AddV("1.1.0", pod, id, "eth0"); errA <- err }()
		go func() { _, err := e.AddList(netB, rtB); errB <- err }()
		if err := <-errA; err != nil {
			t.Errorf("round %d: ADD eth0 beside net1: %v", i, err)
		}
		if err := <-errB; err != nil {
			t.Errorf("round %d: ADD net1 beside eth0: %v", i, err)
		}
		v4, v6 := podDefaults(t, pod)
		if strings.Contains(v4, " ") || v4 == "" || strings.Contains(v6, " ") || v6 == "" || strings.HasPrefix(v6, "ifindex") {
			t.Errorf("round %d: pod default routes v4 %q, v6 %q; want one interface each", i, v4, v6)
		}
		if err := e.DelList(netB, rtB); err != nil {
			t.Errorf("round %d: DEL net1: %v", i, err)
		}
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Errorf("round %d: DEL eth0: %v", i, err)
		}
	}
	e.AssertClean()
}

// TestReviewIfnameTaken: the pod already has an eth0 of another plugin's
// making (a second network with the same ifname, a misconfigured runtime).
// ADD fails naming it and leaves nothing; the runtime's DEL of the failed
// ADD keeps the other eth0, its address and its routes.
func TestReviewIfnameTaken(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "taken")
	peer := testenv.RandName("hand")
	if err := e.InNode(func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer}, PeerName: "eth0",
			PeerNamespace: netlink.NsFd(int(pod.Fd()))})
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.InNode(func() error { return deleteHostLink(peer) }) })
	addr, _ := netlink.ParseAddr("10.254.0.2/24")
	if err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP("10.254.0.1")})
	}); err != nil {
		t.Fatal(err)
	}
	_, err := e.AddV("1.1.0", pod, "taken", "eth0")
	if err == nil {
		t.Fatal("ADD over the pod's existing eth0 succeeded")
	}
	t.Logf("ADD: %v", err)
	if !strings.Contains(err.Error(), "eth0") {
		t.Errorf("ADD's error does not name eth0: %v", err)
	}
	e.AssertNothingOf("taken")
	if err := e.Del(pod, "taken", "eth0"); err != nil {
		t.Errorf("DEL of the failed ADD: %v", err)
	}
	pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatalf("the other plugin's eth0 is gone: %v", err)
		}
		if as, _ := netlink.AddrList(l, netlink.FAMILY_V4); len(as) != 1 || !as[0].IP.Equal(addr.IP) {
			t.Errorf("the other eth0's addresses: %v", as)
		}
		if v4, _ := podDefaults(t, pod); v4 != "eth0" {
			t.Errorf("the pod's IPv4 default route: %q, want the other eth0's", v4)
		}
		return nil
	})
	e.AssertClean()
}
