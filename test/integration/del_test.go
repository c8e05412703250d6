// DEL: every error it meets reported, its claim held through the IPAM
// release, and a DEL racing the ADD of its attachment.

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestDelIPAMReleaseHoldsClaim: a DEL of an attachment that does not exist
// (the runtime cleaning up after a failed ADD) holds its claim until its
// IPAM release has run, not only until its teardown has: an ADD of the
// attachment arriving between the two is refused (11), instead of taking a
// lease that the DEL's IPAM release, still to come, would free under the
// live pod (the next pod would get its address). The IPAM plugin here is
// host-local, held before its DEL while BLOCK_FILE exists (only the DEL's
// process has it in its environment).
func TestDelIPAMReleaseHoldsClaim(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	ipamDir := t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
if [ "$CNI_COMMAND" = DEL ] && [ -n "$BLOCK_FILE" ]; then
	touch "$BLOCK_FILE.reached"
	while [ -e "$BLOCK_FILE" ]; do sleep 0.02; done
fi
exec %q
`, filepath.Join(testenv.BinDir, "host-local"))
	must(t, os.WriteFile(filepath.Join(ipamDir, "blockdel-ipam"), []byte(script), 0o755))
	cniPath := ipamDir + string(os.PathListSeparator) + testenv.BinDir
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{ipamDir, testenv.BinDir}, e.CacheDir, nil)
	e.IPAM = map[string]any{"type": "blockdel-ipam", "dataDir": e.DataDir,
		"ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}, {{"subnet": testenv.PodSubnet6}}}}
	pod := e.NewPod()
	e.CleanupDel(pod, "racing")
	block := filepath.Join(t.TempDir(), "block")
	must(t, os.WriteFile(block, nil, 0o600))
	defer os.Remove(block)

	envv := pluginEnv("DEL", "racing", pod, "eth0")
	envv["CNI_PATH"], envv["BLOCK_FILE"] = cniPath, block
	var del *exec.Cmd
	must(t, e.InNode(func() error {
		del = exec.Command(filepath.Join(testenv.BinDir, "ebpf-cni"))
		for k, v := range envv {
			del.Env = append(del.Env, k+"="+v)
		}
		del.Stdin = strings.NewReader(string(e.StdinConf(nil)))
		return del.Start()
	}))
	delDone := make(chan error, 1)
	go func() { delDone <- del.Wait() }()
	defer func() {
		os.Remove(block)
		<-delDone
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(block + ".reached"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("DEL never reached its IPAM release")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the teardown beside the release is done by now

	_, addErr := e.AddV("1.1.0", pod, "racing", "eth0")
	os.Remove(block)
	if err := <-delDone; err != nil {
		t.Fatalf("DEL: %v", err)
	}
	delDone <- nil // for the deferred wait
	if addErr == nil {
		if len(e.ReservationsOf("racing")) == 0 {
			t.Fatal("the ADD during the DEL's IPAM release succeeded, and that release freed its lease: the live pod's address goes to the next pod")
		}
		t.Fatal("the ADD during the DEL's IPAM release succeeded: it must be refused while the DEL holds the attachment")
	}
	libcniErr(t, "ADD during the DEL's IPAM release", addErr, types.ErrTryAgainLater, "in progress")
	e.AssertNothingOf("racing")
	e.AssertClean()
}

// TestDelReportsEveryError: a DEL that fails in two ways (the node's maps
// cannot be opened: a foreign map is pinned as cni_links; and the IPAM
// plugin is not in CNI_PATH) reports both, under the code of the first
// that has one: 50, the datapath's, as ADD and CHECK answer a foreign pin
// (the teardown runs before the IPAM release; it was 7, the IPAM plugin's,
// while the teardown's open error had no kind). DEL used to report the IPAM
// error alone. Once the map is back (a clone pinned: swapForeignPin), DEL
// removes everything.
func TestDelReportsEveryError(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.Add(pod, "de-setup") // the node's datapath, pinned
	if err := e.Del(pod, "de-setup", "eth0"); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(datapath.MapsDir(e.PinDir), "cni_links")
	restore, ok := swapForeignPin(t, p)
	if !ok {
		t.Fatalf("no map of another type with %s's sizes could be made", p)
	}
	defer restore()

	stdin := e.StdinConf(func(m map[string]any) { m["ipam"] = map[string]any{"type": "no-such-ipam"} })
	out, err := e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("DEL", "de-pod", pod, "eth0"), stdin)
	perr := wantPluginError(t, "DEL with a foreign cni_links and no IPAM plugin", out, err, codePluginNotAvailable,
		"open datapath at "+e.PinDir, "cni_links", "ipam.type", "no-such-ipam")
	t.Logf("DEL: error %d: %s", perr.Code, perr.Msg)

	restore()
	if err := e.Del(pod, "de-pod", "eth0"); err != nil {
		t.Errorf("DEL once the map is back: %v", err)
	}
	e.AssertClean()
}

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
