// A layout migration on a loaded node: the verifier takes seconds per
// object, and what the old pods' masqueraded flows need must not age out
// meanwhile.

package integration

import (
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestUpgradeMasqSlowVerifier: this build's first verb on a node of
// e383872 (a DEL of an old pod) migrates it while a masquerading old pod
// keeps a UDP flow to a host outside, a datagram every 5 ms. The
// crashpoint build holds the load of the uplink egress object for 32 s,
// as the verifier took on a node at load 62 (59 s for the whole
// migration; 10 s for that object alone at load 4), and each link it
// moves for 300 ms. Not one datagram may be lost.
//
// Before the fix the flows were copied into the new maps before that
// load: their copies, 30 s UDP timeouts whose last use the old programs
// never refreshed there, had expired when the uplink moved, so the new
// uplink ingress program passed the echoes untranslated to the node
// (lost) until the pod's own link moved (the datagram lost once in
// TestUpgradeUnderTraffic's plugin-first run from e383872, at load 62).
func TestUpgradeMasqSlowVerifier(t *testing.T) {
	oldBin := testenv.BuildAt(t, testenv.PreUplinkMasqCommit)
	crash := crashBinary(t)
	lab := newMasqLab(t)
	e := lab.a
	newCNI := e.CNI
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, e.CacheDir, nil)
	a, x := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "a")
	e.CleanupDel(x, "x")
	e.Add(a, "a")
	e.Add(x, "x")
	e.CNI = newCNI // the cleanup's DELs are this build's

	echoUDP(t, lab.out, 7)
	const every = 5 * time.Millisecond
	start := time.Now()
	probe := startProbe(t, "egress masquerade, IPv4", a, hp(outsideIP, 7), every)
	probe.waitAnswered(t)
	time.Sleep(500 * time.Millisecond)

	envv := pluginEnv("DEL", "x", x, "eth0")
	envv["EBPF_CNI_PAUSE_AT"] = "load-to_uplink=32s,upgrade-link=300ms"
	migStart := time.Now()
	if out, err := e.RunPlugin(crash, envv, e.StdinConf(nil)); err != nil {
		t.Fatalf("DEL x (this build's first verb: the migration): %v\n%s", err, out)
	}
	t.Logf("migration and DEL: %s, from step #%d", time.Since(migStart).Round(time.Millisecond), migStart.Sub(start)/every)
	time.Sleep(time.Second)

	sent, lost, _ := probe.finish()
	t.Logf("%s: %d sent, %d lost", probe.name, sent, len(lost))
	if len(lost) > 0 {
		t.Errorf("%s: %d of %d lost across the migration (numbers %s)%s", probe.name, len(lost), sent, span(lost), probe.where(lost, start, every))
	}
	must(t, testenv.Ping(a, outsideIP, 2))
	e.MustDel(a, "a")
	e.AssertClean()
}
