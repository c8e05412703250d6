// A node set up by the build of the previous map layout, upgraded to this
// one by its first ADD.

package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestUpgradeFromLayout1: pods attached by the last build of map layout 1
// (a plain one, one with a hostPort and ingress and egress limits, both
// masquerading) keep working while the first ADD of this build moves the
// node to this layout: their entries, limit, hostPort, counters and cluster
// CIDR are copied into the new maps, their links swapped to this build's
// programs, the old maps and programs unpinned. A ping between them loses
// nothing across it; afterwards this build CHECKs and DELs them, and the
// new pod reaches them.
func TestUpgradeFromLayout1(t *testing.T) {
	oldBin := testenv.BuildAt(t, testenv.LayoutV1Commit)
	e := testenv.New(t)
	e.Extra = map[string]any{"ipMasq": true, "capabilities": map[string]bool{"portMappings": true, "bandwidth": true}}
	newCNI := e.CNI
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, e.CacheDir, nil)

	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "a")
	e.CleanupDel(b, "b")
	ra := e.Add(a, "a")
	rt := e.RuntimeConfHP(b, "b", []testenv.PM{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}})
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
	old := datapath.LayoutMapsDir(e.PinDir, 1)
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("the layout 1 build pinned no maps_v1: %v", err)
	}
	_, idxA := e.HostVeth("a")
	_, idxB := e.HostVeth("b")
	progsA := e.ProgIDs(idxA)
	serve(t, b, 80, "b")
	expectServer(t, e.Node, "tcp", "127.0.0.1:8080", "b")
	must(t, testenv.Ping(a, b4, 3))

	// 1500 echoes 4 ms apart (6 s) across the upgrade.
	pingDone := make(chan string, 1)
	go func() {
		var out []byte
		a.Do(func(ns.NetNS) error {
			out, _ = exec.Command("ping", "-c", "1500", "-i", "0.004", "-W", "1", "-q", b4.String()).CombinedOutput()
			return nil
		})
		pingDone <- string(out)
	}()
	waitPings(t, a, b4)

	e.CNI = newCNI
	d := e.NewPod()
	e.CleanupDel(d, "d")
	rd := e.Add(d, "d")
	d4, _ := testenv.PodIPs(t, rd)
	if out := <-pingDone; !strings.Contains(out, " 0% packet loss") {
		t.Errorf("the ping between two pods of the old build lost packets across the upgrade:\n%s", out)
	}

	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("the layout 1 maps are still pinned: %v", err)
	}
	if _, err := os.Stat(datapath.StagingMapsDir(e.PinDir)); !os.IsNotExist(err) {
		t.Errorf("the staging directory of the migration is left: %v", err)
	}
	for _, p := range datapath.ProgramPins(e.PinDir) {
		if !p.Current {
			t.Errorf("program pin of the old build left: %s", p.Name)
		}
	}
	if now := e.ProgIDs(idxA); len(now) != 2 || now[0] == progsA[0] || now[1] == progsA[1] {
		t.Errorf("a's host veth runs programs %v, before the upgrade %v: not this build's", now, progsA)
	}
	m := e.Maps()
	// b's buckets, converted from layout 1's bw_state (no ingress queue:
	// queue_ns 0, the bucket polices alone as it did).
	for _, dir := range []maps.Dir{maps.DirEgress, maps.DirIngress} {
		if l, ok, err := m.Bandwidth().LookupLimit(idxB, dir); err != nil || !ok || l.RateBps != 50e6 || l.BurstBits == 0 || l.QueueNs != 0 {
			t.Errorf("b's %s limit in the new maps: %+v %v %v", dir, l, ok, err)
		}
	}
	// Counters carry on from the old ones (what the old programs counted
	// in the milliseconds between the copy and the swap is not carried).
	if c := counter(t, m, idxA, maps.DirEgress, maps.ReasonRedirect); c.Packets < 1400 {
		t.Errorf("a's redirect counter in the new maps: %d packets, want about its old count and the pings since (1500+)", c.Packets)
	}
	users, err := m.Masq().ClusterCIDRUsers()
	must(t, err)
	if n := users[netip.MustParsePrefix(testenv.PodSubnet4)]; n != 2 {
		t.Errorf("%s has %d users, want 2: the old build's pods (inherited) and d", testenv.PodSubnet4, n)
	}
	st := status(t, e)
	if !st.Healthy || st.MapLayout != maps.LayoutVersion {
		t.Errorf("status after the upgrade: healthy %v, layout %d, problems %v", st.Healthy, st.MapLayout, st.Problems)
	}

	// A migration stopped before it unpinned the old maps (killed): status
	// says so, and `ebpf-agent upgrade` removes them once every link moved.
	must(t, os.Mkdir(old, 0o700))
	leftover, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: uint32(binary.Size(maps.LinkInfo{})), MaxEntries: 1})
	must(t, err)
	must(t, leftover.Pin(filepath.Join(old, "cni_links")))
	leftover.Close()
	if st := status(t, e); st.Healthy || !slices.ContainsFunc(st.Problems, func(p string) bool { return strings.Contains(p, "maps of an older layout are still pinned at "+old) }) {
		t.Errorf("status with layout 1 maps left: healthy %v, problems %v", st.Healthy, st.Problems)
	}
	if out, err := e.AgentCmd("upgrade", "--pin-dir", e.PinDir, "--cni-conf-dir", e.WriteConfDir()); err != nil || !strings.Contains(out, "old map directories removed: 1") {
		t.Errorf("upgrade with layout 1 maps left: %v\n%s", err, out)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("upgrade left the layout 1 maps: %v", err)
	}

	expectServer(t, e.Node, "tcp", "127.0.0.1:8080", "b")
	must(t, testenv.Ping(d, a4, 2))
	must(t, testenv.Ping(a, d4, 2))
	must(t, testenv.Ping(b, a4, 2))
	// b's limit still holds: a stream from b runs at about 50 Mbit/s, not
	// at the veth's gigabits (loose bounds: the machine is shared).
	if r := tcpRate(t, b, d, d4, 3*time.Second); r > 1.25*50e6 || r < 0.5*50e6 {
		t.Errorf("b's egress after the upgrade: %.1f Mbit/s, want about its 50 Mbit/s limit", r/1e6)
	} else {
		t.Logf("b's egress after the upgrade: %.1f Mbit/s (limit 50)", r/1e6)
	}
	for _, p := range []struct {
		pod ns.NetNS
		id  string
	}{{a, "a"}, {d, "d"}} {
		if err := e.Check(p.pod, p.id, "eth0"); err != nil {
			t.Errorf("CHECK of %s after the upgrade: %v", p.id, err)
		}
	}
	// b's CHECK with its hostPort and limits: the buckets without a queue
	// are what a host veth without one expects.
	if err := e.InNode(func() error {
		return e.CNI.CheckNetworkList(context.Background(), e.ConfList("1.1.0"), rt)
	}); err != nil {
		t.Errorf("CHECK of b (hostPort, limits) after the upgrade: %v", err)
	}
	// d's DEL leaves the subnet to the old pods; the last DEL takes it.
	e.MustDel(d, "d")
	if !clusterCIDRSet(t, m)[testenv.PodSubnet4] {
		t.Errorf("d's DEL removed %s, which the old build's pods still use", testenv.PodSubnet4)
	}
	must(t, testenv.Ping(a, b4, 2))
	e.MustDel(a, "a")
	e.MustDel(b, "b")
	e.AssertNoHostPorts()
	e.AssertClean()
}

// waitPings waits until a's ping to ip has its first reply (up to 10 s:
// it returns at the first, the bound is for a loaded node).
func waitPings(t *testing.T, a ns.NetNS, ip net.IP) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for testenv.Ping(a, ip, 1) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("no ping to %s", ip)
		}
	}
}

// TestUpgradeKilledMidMigration: the first ADD of this build is killed
// (SIGKILL) at each step of the migration from layout 1 in turn, after
// the copy into the staging maps, after the links moved to this build's
// programs, and after the staging maps were renamed into place. Each
// next process starts the migration over (or, after the rename, finds
// it done); the old build's pods keep their traffic throughout, and in
// the end the node is on this layout with their entries and limit, and
// `ebpf-agent upgrade` removes what the last kill left of layout 1.
func TestUpgradeKilledMidMigration(t *testing.T) {
	oldBin := testenv.BuildAt(t, testenv.LayoutV1Commit)
	crash := crashBinary(t)
	e := testenv.New(t)
	e.Extra = map[string]any{"ipMasq": true, "capabilities": map[string]bool{"bandwidth": true}}
	newCNI := e.CNI
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, e.CacheDir, nil)

	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "a")
	e.CleanupDel(b, "b")
	e.Add(a, "a")
	rt := e.RuntimeConf(b, "b", "eth0")
	rt.CapabilityArgs = map[string]any{"bandwidth": bandwidthArgs(0, 50e6)}
	var rb *current.Result
	must(t, e.InNode(func() error {
		res, err := e.CNI.AddNetworkList(context.Background(), e.ConfList("1.0.0"), rt)
		if err == nil {
			rb, err = current.NewResultFromResult(res)
		}
		return err
	}))
	b4, _ := testenv.PodIPs(t, rb)
	_, idxB := e.HostVeth("b")
	old := datapath.LayoutMapsDir(e.PinDir, 1)
	staging := datapath.StagingMapsDir(e.PinDir)

	// Echoes 5 ms apart for 15 s, across every kill.
	pingDone := make(chan string, 1)
	go func() {
		var out []byte
		a.Do(func(ns.NetNS) error {
			out, _ = exec.Command("ping", "-c", "3000", "-i", "0.005", "-W", "1", "-q", b4.String()).CombinedOutput()
			return nil
		})
		pingDone <- string(out)
	}()
	waitPings(t, a, b4)

	// No DEL between the kills: this build's DEL migrates too.
	e.CNI = newCNI
	var killed []struct {
		pod ns.NetNS
		id  string
	}
	for i, step := range []string{"migrate-copied", "migrate-swapped", "migrate-renamed"} {
		c := e.NewPod()
		id := "killed" + strconv.Itoa(i)
		e.CleanupDel(c, id)
		envv := pluginEnv("ADD", id, c, "eth0")
		envv["EBPF_CNI_CRASH_AT"] = step
		out, err := e.RunPlugin(crash, envv, e.StdinConf(nil))
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("ADD with EBPF_CNI_CRASH_AT=%s: %v, want killed by SIGKILL; stdout %s", step, err, out)
		}
		_, errOld := os.Stat(old)
		_, errStaging := os.Stat(staging)
		_, errFinal := os.Stat(datapath.MapsDir(e.PinDir))
		switch {
		case errOld != nil:
			t.Fatalf("killed at %s: the layout 1 maps are gone already: %v", step, errOld)
		case step != "migrate-renamed" && (errStaging != nil || errFinal == nil):
			t.Fatalf("killed at %s: want the staging maps and no %s: %v, %v", step, datapath.MapsDir(e.PinDir), errStaging, errFinal)
		case step == "migrate-renamed" && (errStaging == nil || errFinal != nil):
			t.Fatalf("killed at %s: want %s and no staging maps: %v, %v", step, datapath.MapsDir(e.PinDir), errFinal, errStaging)
		}
		if err := testenv.Ping(a, b4, 2); err != nil {
			t.Fatalf("after the migration was killed at %s: %v", step, err)
		}
		killed = append(killed, struct {
			pod ns.NetNS
			id  string
		}{c, id})
	}

	// The last kill left the old maps and programs pinned: an ADD of the
	// old build still in flight then (or a rollback) attaches pod f over
	// them, its entries in layout 1's maps only.
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, e.CacheDir, nil)
	f := e.NewPod()
	e.CleanupDel(f, "f")
	f4, _ := testenv.PodIPs(t, e.Add(f, "f"))
	e.CNI = newCNI

	d := e.NewPod()
	e.CleanupDel(d, "d")
	rd := e.Add(d, "d")
	d4, _ := testenv.PodIPs(t, rd)
	if out := <-pingDone; !strings.Contains(out, " 0% packet loss") {
		t.Errorf("the ping between two pods of the old build lost packets across the killed migrations:\n%s", out)
	}
	m := e.Maps()
	if l, ok, err := m.Bandwidth().LookupLimit(idxB, maps.DirEgress); err != nil || !ok || l.RateBps != 50e6 {
		t.Errorf("b's egress limit in the layout 2 maps: %+v %v %v", l, ok, err)
	}
	if st := status(t, e); st.Healthy || !slices.ContainsFunc(st.Problems, func(p string) bool { return strings.Contains(p, old) }) {
		t.Errorf("status with the layout 1 maps the last kill left: healthy %v, problems %v", st.Healthy, st.Problems)
	}
	if out, err := e.AgentCmd("upgrade", "--pin-dir", e.PinDir, "--cni-conf-dir", e.WriteConfDir()); err != nil || !strings.Contains(out, "old map directories removed: 1") {
		t.Errorf("upgrade after the killed migrations: %v\n%s", err, out)
	}
	for _, p := range datapath.ProgramPins(e.PinDir) {
		if !p.Current {
			t.Errorf("program pin of the old build left: %s", p.Name)
		}
	}
	if st := status(t, e); !st.Healthy || st.MapLayout != maps.LayoutVersion {
		t.Errorf("status after upgrade: healthy %v, layout %d, problems %v", st.Healthy, st.MapLayout, st.Problems)
	}
	// upgrade finished the migration: f's entries were copied before its
	// link moved to this build's programs.
	if ep, err := m.Endpoints().Lookup(f4); err != nil {
		t.Errorf("f (attached by the old build after the last kill) has no endpoint in the layout 2 maps: %v", err)
	} else if _, idxF := e.HostVeth("f"); int(ep.Ifindex) != idxF {
		t.Errorf("f's endpoint in the layout 2 maps: ifindex %d, its host veth %d", ep.Ifindex, idxF)
	}
	must(t, testenv.Ping(d, b4, 2))
	must(t, testenv.Ping(b, d4, 2))
	must(t, testenv.Ping(f, d4, 2))
	must(t, testenv.Ping(d, f4, 2))
	e.MustDel(f, "f")
	e.MustDel(d, "d")
	for _, k := range killed { // whatever the killed ADDs left
		e.MustDel(k.pod, k.id)
	}
	e.MustDel(a, "a")
	e.MustDel(b, "b")
	e.AssertClean()
}

// TestUpgradeTooSmall: the first ADD of this build on a node of layout 1
// asks for sizes the old build's pods do not fit in (maxPods 1: cni_links
// holds 2 host veths, the old build attached 3 pods). It is refused with 7
// naming the map, its size and maxPods, and changes nothing: the old maps
// and programs stay, the old pods keep running them and reach each other.
// Two ADDs with a maxPods they fit in, at once, then migrate the node.
func TestUpgradeTooSmall(t *testing.T) {
	oldBin := testenv.BuildAt(t, testenv.LayoutV1Commit)
	e := testenv.New(t)
	newCNI := e.CNI
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, e.CacheDir, nil)
	var (
		pods []ns.NetNS
		ips  []net.IP
	)
	for _, id := range []string{"a", "b", "c"} {
		p := e.NewPod()
		e.CleanupDel(p, id)
		ip, _ := testenv.PodIPs(t, e.Add(p, id))
		pods, ips = append(pods, p), append(ips, ip)
	}
	_, idxA := e.HostVeth("a")
	progsA := e.ProgIDs(idxA)
	old := datapath.LayoutMapsDir(e.PinDir, 1)

	e.CNI = newCNI
	e.Extra = map[string]any{"maxPods": 1}
	d := e.NewPod()
	e.CleanupDel(d, "d")
	_, err := e.AddV("1.1.0", d, "d", "eth0")
	libcniErr(t, "ADD with maxPods 1 over 3 pods of layout 1", err, 7, "cni_links holds at most 2 entries", "maxPods 1 is too small")
	e.AssertNothingOfPod("d", 1)
	if _, err := os.Stat(old); err != nil {
		t.Errorf("the refused migration removed the layout 1 maps: %v", err)
	}
	for _, dir := range []string{datapath.MapsDir(e.PinDir), datapath.StagingMapsDir(e.PinDir)} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("the refused migration left %s: %v", dir, err)
		}
	}
	for _, p := range datapath.ProgramPins(e.PinDir) {
		if p.Current { // loaded over the staging maps it removed
			t.Errorf("the refused migration left this build's program pin %s", p.Name)
		}
	}
	if now := e.ProgIDs(idxA); !slices.Equal(now, progsA) {
		t.Errorf("a's host veth runs %v after the refused migration, before %v", now, progsA)
	}
	must(t, testenv.Ping(pods[0], ips[2], 2))
	must(t, testenv.Ping(pods[2], ips[1], 2))

	// Two ADDs with room at once: one migrates, the other waits for it
	// and finds the node migrated.
	e.Extra = nil
	g := e.NewPod()
	e.CleanupDel(g, "g")
	var (
		resG types.Result
		errG error
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		resG, errG = e.AddV("1.1.0", g, "g", "eth0")
	}()
	rd := e.Add(d, "d")
	wg.Wait()
	must(t, errG)
	rg, err := current.NewResultFromResult(resG)
	must(t, err)
	d4, _ := testenv.PodIPs(t, rd)
	g4, _ := testenv.PodIPs(t, rg)
	for _, dir := range []string{old, datapath.StagingMapsDir(e.PinDir)} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s is still pinned after the migration: %v", dir, err)
		}
	}
	must(t, testenv.Ping(pods[0], d4, 2))
	must(t, testenv.Ping(d, ips[1], 2))
	must(t, testenv.Ping(g, d4, 2))
	must(t, testenv.Ping(pods[2], g4, 2))
	e.MustDel(g, "g")
	e.MustDel(d, "d")
	for i, id := range []string{"a", "b", "c"} {
		e.MustDel(pods[i], id)
	}
	e.AssertClean()
}
