// Upgrading a node within map layout 3 to the build with the masquerade
// quota (issue 28): its maps (cni_masq_pods, cni_masq_quota, cni_masq_keys)
// are added to the pin set an older build of the layout left.

package integration

import (
	"bufio"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// preQuotaCommit is main before the masquerade quota (map layout 3 without
// its maps).
const preQuotaCommit = "a7659561026d66c6672e13ef911ddfff8f9ec644"

// TestMasqQuotaUpgradeWithinLayout: masquerading pods v and x attached by
// the build before the quota, v with an idle TCP connection to a server
// outside. This build's first verb is x's DEL (on a pin set without the
// quota maps: it must tear x down, not take the node for never set up);
// then its first ADD (pod w) pins the quota maps and writes the quota;
// v's connection, whose flow the older programs opened and nobody
// counted, survives the upgrade, and w's masqueraded flow is counted.
func TestMasqQuotaUpgradeWithinLayout(t *testing.T) {
	oldBin := testenv.BuildAt(t, preQuotaCommit)
	lab := newMasqLab(t)
	a := lab.a
	newCNI := a.CNI
	a.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, a.CacheDir, nil)
	v, x, w := a.NewPod(), a.NewPod(), a.NewPod()
	a.CleanupDel(v, "v")
	a.CleanupDel(x, "x")
	a.CleanupDel(w, "w")
	a.Add(v, "v")
	a.Add(x, "x")
	dir := datapath.MapsDir(a.PinDir)
	if _, err := os.Stat(filepath.Join(dir, "cni_masq_quota")); !os.IsNotExist(err) {
		t.Fatalf("the build before the quota pinned cni_masq_quota: %v", err)
	}
	cli, sc, _ := masqIdleConn(t, lab, v, outsideIP, labNodeA, 7331)

	a.CNI = newCNI
	if err := a.Del(x, "x", "eth0"); err != nil {
		t.Fatalf("this build's DEL of a pod of the build before the quota: %v", err)
	}
	if a.NodeLinkExists(state.HostIfName("x", "eth0")) {
		t.Errorf("x's host veth stays after this build's DEL")
	}
	w4, _ := resultIPs(a.Add(w, "w"))
	q, err := a.Maps().MasqQuota()
	if err != nil || q.PodMax == 0 {
		t.Fatalf("cni_masq_quota after this build's first ADD: %+v, %v", q, err)
	}
	masqSourcePorts(t, lab, w, 7333, 1024, 65535)
	if got := podFlows(t, a, w4); got.Flows < 2 {
		t.Errorf("pod w's flows (one per family) are not counted: %+v", got)
	}

	time.Sleep(time.Second)
	if _, err := sc.Write([]byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	cli.SetReadDeadline(time.Now().Add(3 * time.Second))
	if got, err := bufio.NewReader(cli).ReadString('\n'); err != nil || got != "pong\n" {
		t.Errorf("pod v's idle connection across the upgrade: read %q, %v", got, err)
	}
}
