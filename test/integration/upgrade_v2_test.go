package integration

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// layoutV2Commit is the last commit whose maps are of layout 2 (before the
// event maps of layout 3).
const layoutV2Commit = "ea9f40b87fbd0ec221015d5a2846c174c42d06a0"

// layoutV3Commit is the last commit whose maps are of layout 3 (before the
// tunnel maps of layout 4).
const layoutV3Commit = "a7659561026d66c6672e13ef911ddfff8f9ec644"

// TestUpgradeFromLayout2: pods attached by the last build of map layout 2
// (a plain one and one with a hostPort and limits) keep their traffic while
// the first ADD of this build moves the node to this build's layout (the
// event maps added, then the tunnel's): their entries, limits, hostPort
// and counters are copied, their links swapped, the layout 2 maps and
// programs removed; afterwards an old pod's drop is an event the agent
// shows, and this build DELs them clean.
func TestUpgradeFromLayout2(t *testing.T) { upgradeFromLayout(t, layoutV2Commit, 2) }

// TestUpgradeFromLayout3 is the same from the last build of layout 3 (the
// tunnel maps and drop reasons added in layout 4).
func TestUpgradeFromLayout3(t *testing.T) { upgradeFromLayout(t, layoutV3Commit, 3) }

func upgradeFromLayout(t *testing.T, commit string, version int) {
	oldBin := testenv.BuildAt(t, commit)
	e := testenv.New(t)
	e.Extra = map[string]any{"ipMasq": true, "capabilities": map[string]bool{"portMappings": true, "bandwidth": true}}
	newCNI := e.CNI
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, e.CacheDir, nil)

	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "a2")
	e.CleanupDel(b, "b2")
	ra := e.Add(a, "a2")
	rt := e.RuntimeConfHP(b, "b2", []testenv.PM{{HostPort: 8090, ContainerPort: 80, Protocol: "tcp"}})
	rt.CapabilityArgs["bandwidth"] = bandwidthArgs(50e6, 50e6)
	var rb *current.Result
	must(t, e.InNode(func() error {
		res, err := e.CNI.AddNetworkList(context.Background(), e.ConfList("1.0.0"), rt)
		if err == nil {
			rb, err = current.NewResultFromResult(res)
		}
		return err
	}))
	a4, _ := testenv.PodIPs(t, ra)
	b4, _ := testenv.PodIPs(t, rb)
	old := datapath.LayoutMapsDir(e.PinDir, version)
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("the layout %d build pinned no maps_v%d: %v", version, version, err)
	}
	_, idxA := e.HostVeth("a2")
	_, idxB := e.HostVeth("b2")
	serve(t, b, 80, "b2")
	expectServer(t, e.Node, "tcp", "127.0.0.1:8090", "b2")
	must(t, testenv.Ping(a, b4, 3))

	pingDone := make(chan string, 1)
	go func() {
		var out []byte
		a.Do(func(ns.NetNS) error {
			out, _ = exec.Command("ping", "-c", "1000", "-i", "0.004", "-W", "1", "-q", b4.String()).CombinedOutput()
			return nil
		})
		pingDone <- string(out)
	}()
	waitPings(t, a, b4)

	e.CNI = newCNI
	d := e.NewPod()
	e.CleanupDel(d, "d2")
	rd := e.Add(d, "d2")
	d4, _ := testenv.PodIPs(t, rd)
	if out := <-pingDone; !strings.Contains(out, " 0% packet loss") {
		t.Errorf("the ping between two pods of the layout %d build lost packets across the upgrade:\n%s", version, out)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("the layout %d maps are still pinned: %v", version, err)
	}
	for _, p := range datapath.ProgramPins(e.PinDir) {
		if !p.Current {
			t.Errorf("program pin of the old build left: %s", p.Name)
		}
	}
	m := e.Maps()
	wantPartsLookedUp(t, m)
	for _, dir := range []maps.Dir{maps.DirEgress, maps.DirIngress} {
		if l, ok, err := m.Bandwidth().LookupLimit(idxB, dir); err != nil || !ok || l.RateBps != 50e6 {
			t.Errorf("b's %s limit in the new maps: %+v %v %v", dir, l, ok, err)
		}
	}
	if c := counter(t, m, idxA, maps.DirEgress, maps.ReasonRedirect); c.Packets < 900 {
		t.Errorf("a's redirect counter in the new maps: %d packets, want its old count and the pings since (1000+)", c.Packets)
	}
	if st := status(t, e); !st.Healthy || st.MapLayout != maps.LayoutVersion {
		t.Errorf("status after the upgrade: healthy %v, layout %d, problems %v", st.Healthy, st.MapLayout, st.Problems)
	}
	expectServer(t, e.Node, "tcp", "127.0.0.1:8090", "b2")
	must(t, testenv.Ping(d, a4, 2))
	must(t, testenv.Ping(a, d4, 2))

	// The old pod's drops are events now.
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "")
	var seq uint64
	if recs := observeJSON(t, e, "--last", "1000"); len(recs) > 0 {
		seq = recs[len(recs)-1].Seq
	}
	podMAC, hostMAC := podMACOf(t, a, "eth0"), hostMACOf(m, idxA)
	podRaw(t, a, "eth0", ipv4UDPFrame(podMAC, hostMAC, net.ParseIP("10.250.7.7"), testenv.NodeIP4))
	got := newEvents(t, e, seq, 1)
	if len(got) != 1 || got[0].Reason != "drop_spoof_ip" || got[0].Ifindex != uint32(idxA) || got[0].Src != "10.250.7.7" {
		t.Errorf("events of the old pod's spoofed frame: %+v", got)
	}

	e.MustDel(d, "d2")
	e.MustDel(a, "a2")
	e.MustDel(b, "b2")
	e.AssertNoHostPorts()
	e.AssertClean()
}

// wantPartsLookedUp: tables an older build put in cni_stack_flow_parts (and
// the migration copied) are looked up: HP_CFG_SF_NO_PARTS is clear while any
// is there, set when none is.
func wantPartsLookedUp(t *testing.T, m *maps.Maps) {
	t.Helper()
	var k, v uint32
	n := 0
	for it := mapstest.Map(m, "cni_stack_flow_parts").Iterate(); it.Next(&k, &v); {
		n++
	}
	set, err := mapstest.NoPartsFlag(m)
	if err != nil {
		t.Fatal(err)
	}
	if set == (n > 0) {
		t.Errorf("%d tables in cni_stack_flow_parts after the upgrade, HP_CFG_SF_NO_PARTS %v", n, set)
	}
	t.Logf("%d tables in cni_stack_flow_parts after the upgrade, HP_CFG_SF_NO_PARTS %v", n, set)
}
