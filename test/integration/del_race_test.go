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
