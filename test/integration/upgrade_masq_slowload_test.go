// A layout migration on a loaded node: the verifier takes seconds per
// object, and what the old pods' masqueraded flows need must not age out
// meanwhile.

package integration

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestUpgradeMasqSlowVerifier: this build's first verb on a node of
// e383872 (a DEL of an old pod) migrates it while a masquerading old pod
// keeps a UDP flow to a host outside, a datagram every 5 ms. The
// crashpoint build holds the load of the uplink egress object for 32 s,
// as the verifier took on a node at load 62 (59 s for the whole
// migration; 10 s for that object alone at load 4), and each link it
// moves for 300 ms. Not one datagram, nor one ping (ICMP echo, the same
// 30 s timeout in both builds), may be lost.
//
// Before the fix the flows were copied into the new maps before that
// load: their copies, 30 s timeouts whose last use the old programs
// never refreshed there, had expired when the uplink moved, so the new
// uplink ingress program passed the replies untranslated to the node
// (lost) until the pod's own link moved (the datagram lost once in
// TestUpgradeUnderTraffic's plugin-first run from e383872, at load 62):
// 77 of 6115 datagrams. Layout 1's UDP flows now come over as streams
// (120 s), which alone keeps the datagrams here; the pings, 54 of 6977
// lost with the copy before the load, prove the order.
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
	// An echo flow too: its timeout (30 s) is the same in both builds, so
	// only the order of the load and the copy keeps it.
	echo := startPing(t, a, outsideIP, every)
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
	replied, unanswered := echo()
	t.Logf("ping (ICMP echo, masqueraded), IPv4: %d answered, %d unanswered", replied, len(unanswered))
	if len(unanswered) > 0 || replied == 0 {
		t.Errorf("ping (ICMP echo, masqueraded): %d of %d unanswered across the migration (sequence numbers %s)", len(unanswered), replied+len(unanswered), span(unanswered))
	}
	must(t, testenv.Ping(a, outsideIP, 2))
	e.MustDel(a, "a")
	e.AssertClean()
}

// startPing pings dst from pod every interval until the function returned
// is called, which gives how many echoes were answered and which sequence
// numbers were not, up to the last answered one (those after it may still
// have been in flight).
func startPing(t *testing.T, pod ns.NetNS, dst net.IP, every time.Duration) func() (int, []uint32) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command("nsenter", "--net="+pod.Path(), "ping", "-n", "-i", fmt.Sprintf("%.3f", every.Seconds()), "-W", "1", dst.String())
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("ping: %v", err)
	}
	done := false
	stop := func() {
		if !done {
			done = true
			cmd.Process.Signal(os.Interrupt)
			cmd.Wait()
		}
	}
	t.Cleanup(stop)
	return func() (int, []uint32) {
		stop()
		got := map[uint32]bool{}
		var last uint32
		for _, m := range regexp.MustCompile(`icmp_seq=(\d+) `).FindAllStringSubmatch(out.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			got[uint32(n)] = true
			last = max(last, uint32(n))
		}
		var missing []uint32
		for i := uint32(1); i < last; i++ {
			if !got[i] {
				missing = append(missing, i)
			}
		}
		return len(got), missing
	}
}
