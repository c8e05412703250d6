// One owner per address: overlapping networks, sharing the pin directory or
// not, and the refused attachment's DEL removing nothing of the owner's.

package integration

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestIntegrityAddressOwner: two networks on one node hand out the same
// address (overlapping ranges). The second ADD is refused with code 7 naming
// the holder (container, interface, network), whether the networks share the
// pin directory (the endpoint entry is taken) or not (the node's route is),
// and whatever their state directories; the owner keeps its entries, routes
// and traffic, also after the refused attachment's DEL. Before, the second
// ADD overwrote the entry and replaced the route, and its DEL then removed
// both: the first pod was unreachable.
func TestIntegrityAddressOwner(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		samePin bool
		v6      bool
	}{
		{"shared pinDir v4", true, false},
		{"shared pinDir v6", true, true},
		{"own pinDir v4", false, false},
		{"own pinDir v6", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := testenv.New(t)
			rng := map[string]string{"subnet": testenv.PodSubnet4, "rangeStart": "10.250.0.5", "rangeEnd": "10.250.0.5"}
			want := net.ParseIP("10.250.0.5")
			if c.v6 {
				rng = map[string]string{"subnet": testenv.PodSubnet6, "rangeStart": "fd00:250::5", "rangeEnd": "fd00:250::5"}
				want = net.ParseIP("fd00:250::5")
			}
			e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{{rng}}}
			ownerPod := e.NewPod()
			e.CleanupDel(ownerPod, "owner")
			owner := e.AddAttachment(ownerPod, "owner")
			if len(owner.IPs) != 1 || !owner.IPs[0].Equal(want) {
				t.Fatalf("owner got %v, want %s", owner.IPs, want)
			}

			pinB := e.PinDir
			if !c.samePin {
				pinB = e.PinDir + "-b"
				t.Cleanup(func() { os.RemoveAll(pinB) })
			}
			stateB := t.TempDir()
			netB := e.NetList(testenv.RandName("netb"), map[string]any{
				"type": "ebpf-cni", "pinDir": pinB, "stateDir": stateB,
				"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{{rng}}},
			})
			podB := e.NewPod()
			rtB := &libcni.RuntimeConf{ContainerID: "intruder", NetNS: podB.Path(), IfName: "eth0"}
			t.Cleanup(func() { e.DelList(netB, rtB) })
			_, err := e.AddList(netB, rtB)
			if err == nil {
				// Go on: what follows shows what the accepted ADD broke.
				t.Errorf("ADD of an address another network's pod holds succeeded, want error %d", codeInvalidConfig)
			} else {
				libcniErr(t, "ADD of an address another network's pod holds", err, codeInvalidConfig,
					want.String(), "container owner", "interface eth0", e.Name)
			}

			check := func(when string) {
				t.Helper()
				e.AssertOwns(t, owner)
				if err := e.Check(ownerPod, "owner", "eth0"); err != nil {
					t.Errorf("CHECK of the owner %s: %v", when, err)
				}
				if err := testenv.Ping(e.Node, want, 2); err != nil {
					t.Errorf("owner %s: %v", when, err)
				}
				if err := testenv.Ping(ownerPod, testenv.NodeIP4, 2); !c.v6 && err != nil {
					t.Errorf("owner %s: %v", when, err)
				}
				if err := testenv.Ping(ownerPod, testenv.NodeIP6, 2); c.v6 && err != nil {
					t.Errorf("owner %s: %v", when, err)
				}
			}
			check("after the refused ADD")
			if ents, _ := os.ReadDir(filepath.Join(stateB, netB.Name)); len(ents) != 0 {
				t.Errorf("the refused ADD left records: %v", ents)
			}
			if e.NodeLinkExists(state.HostIfName("intruder", "eth0")) {
				t.Error("the refused ADD left its host veth")
			}
			if err := e.DelList(netB, rtB); err != nil {
				t.Fatalf("DEL of the refused attachment: %v", err)
			}
			check("after the refused attachment's DEL")

			e.MustDel(ownerPod, "owner")
			e.AssertClean()
			// With the owner gone, the address is free for the other network.
			if _, err := e.AddList(netB, rtB); err != nil {
				t.Fatalf("ADD of the freed address: %v", err)
			}
			if err := testenv.Ping(e.Node, want, 2); err != nil {
				t.Fatal(err)
			}
			if err := e.DelList(netB, rtB); err != nil {
				t.Fatal(err)
			}
		})
	}

	// A leftover entry of a veth that no longer exists is no owner.
	t.Run("leftover entry", func(t *testing.T) {
		t.Parallel()
		e := testenv.New(t)
		e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{{
			{"subnet": testenv.PodSubnet4, "rangeStart": "10.250.0.5", "rangeEnd": "10.250.0.5"}}}}
		first := e.AddAttachment(e.NewPod(), "first") // creates the maps
		e.MustDel(first.Pod, "first")
		m := e.Maps()
		if err := testenv.PutEndpoint(m, net.ParseIP("10.250.0.5"), maps.NewEndpointInfo(1<<30, nil, nil)); err != nil {
			t.Fatal(err)
		}
		p := e.AddAttachment(e.NewPod(), "second")
		e.AssertOwns(t, p)
		e.MustDel(p.Pod, "second")

		// A leftover whose ifindex the next veth reuses (ifindexes of a
		// netns are handed out in order): replaced by the new pod's entry,
		// not kept with its stale MAC and flags.
		next := p.Ifindex + 1
		if err := testenv.PutEndpoint(m, net.ParseIP("10.250.0.5"), maps.NewEndpointInfo(next, net.HardwareAddr{2, 0, 0, 0, 0, 1}, nil, maps.EndpointFlagHostPort)); err != nil {
			t.Fatal(err)
		}
		p = e.AddAttachment(e.NewPod(), "third")
		if p.Ifindex != next {
			t.Fatalf("the third veth got ifindex %d, not the %d this case needs", p.Ifindex, next)
		}
		ep, err := m.Endpoints().Lookup(p.IPs[0])
		mac := podMACOf(t, p.Pod, "eth0")
		// The slot of the pool of stack-flow tables the ADD took rides in
		// the flags' top bits (maps.SlotOfFlags); no other flag may stay.
		if err != nil || ep.Flags != maps.EndpointFlagsOfSlot(mapstest.SlotOfFlags(ep.Flags)) || net.HardwareAddr(ep.Mac[:]).String() != mac.String() {
			t.Errorf("entry of %s: %+v (%v), want the new pod's MAC %s and no flags", p.IPs[0], ep, err, mac)
		}
		p.ID = "third"
		if err := testenv.Ping(p.Pod, testenv.NodeIP4, 2); err != nil {
			t.Fatal(err)
		}
		e.MustDel(p.Pod, "third")
		e.AssertClean()
	})
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
