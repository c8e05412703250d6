// ebpf-agent uninstall racing the CNI verbs and itself.

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestUninstallTwiceAtOnce: two uninstall --force processes at once on a
// node with pods: the node ends as before install, and a third run finds
// nothing.
func TestUninstallTwiceAtOnce(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	before := l.snapshot()
	l.install()
	agent := l.startAgent()
	l.podsWithEverything()
	agent.Stop()

	type res struct {
		stdout, stderr string
		code           int
	}
	var (
		wg   sync.WaitGroup
		outs [2]res
	)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, e, c := l.uninstall("--force")
			outs[i] = res{o, e, c}
		}()
	}
	wg.Wait()
	for i, r := range outs {
		t.Logf("uninstall %d: exit %d\n%s\n%s", i, r.code, r.stdout, r.stderr)
	}
	if outs[0].code != 0 && outs[1].code != 0 {
		t.Errorf("neither of two concurrent uninstalls succeeded")
	}
	stdout, stderr, code := l.uninstall()
	if code != 0 || !strings.Contains(stdout, "nothing of ebpf-cni found") {
		t.Errorf("a third uninstall: exit %d, want 0 and nothing found\n%s\n%s", code, stdout, stderr)
	}
	l.assertAsBefore(before, "after two concurrent uninstalls")
}

// TestUninstallForceThenRuntimeDel: after uninstall --force took the pods'
// interfaces, the runtime still DELs each pod with the configuration it
// cached: DEL must succeed (or the pod is stuck terminating) and must not
// set anything up again.
func TestUninstallForceThenRuntimeDel(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	before := l.snapshot()
	l.install()
	agent := l.startAgent()
	a, b := l.podsWithEverything()
	agent.Stop()
	stdout, stderr, code := l.uninstall("--force")
	if code != 0 {
		t.Fatalf("uninstall --force: exit %d\n%s\n%s", code, stdout, stderr)
	}
	l.assertAsBefore(before, "after uninstall --force")
	for _, p := range []struct {
		pod ns.NetNS
		id  string
	}{{a, "web"}, {b, "plain"}} {
		if err := l.Del(p.pod, p.id, "eth0"); err != nil {
			t.Errorf("the runtime's DEL of %s after uninstall --force: %v", p.id, err)
		}
	}
	l.assertAsBefore(before, "after the runtime's DELs that followed uninstall --force")
}

// TestUninstallRacesAdd: hostPort ADDs with the conflist the runtime read
// before it went, at the same time as an uninstall (no --force). Whatever
// wins, no pod is left with an interface and no datapath: every ADD that
// succeeded serves its hostPort and reaches the remote host. Then DELs and
// an uninstall --force leave the node as before install.
func TestUninstallRacesAdd(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	before := l.snapshot()
	l.stopped()
	const n = 3
	pods := make([]ns.NetNS, n)
	for i := range pods {
		pods[i] = l.NewPod()
		l.CleanupDel(pods[i], fmt.Sprintf("race%d", i))
	}
	var (
		wg     sync.WaitGroup
		errs   [n]error
		stdout string
		stderr string
		code   int
	)
	for i := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = l.AddHP(pods[i], fmt.Sprintf("race%d", i), testenv.PM{HostPort: 8090 + i, ContainerPort: 80, Protocol: "tcp"})
		}()
	}
	wg.Add(1)
	go func() { defer wg.Done(); stdout, stderr, code = l.uninstall() }()
	wg.Wait()
	t.Logf("uninstall: exit %d\n%s\n%s", code, stdout, stderr)
	for i, err := range errs {
		t.Logf("ADD race%d: %v", i, err)
		if err != nil {
			continue
		}
		serve(t, pods[i], 80, fmt.Sprintf("race%d", i))
		expectServer(t, l.remote, "tcp", hp(uplinkIP4, 8090+i), fmt.Sprintf("race%d", i))
		if err := testenv.Ping(pods[i], remoteIP4, 2); err != nil {
			t.Errorf("pod race%d, ADDed beside the uninstall (exit %d): %v", i, code, err)
		}
	}
	for i := range pods {
		if err := l.Del(pods[i], fmt.Sprintf("race%d", i), "eth0"); err != nil {
			t.Errorf("DEL race%d: %v", i, err)
		}
	}
	stdout, stderr, code = l.uninstall("--force")
	if code != 0 {
		t.Fatalf("uninstall --force after the race: exit %d\n%s\n%s", code, stdout, stderr)
	}
	l.assertAsBefore(before, "after the race and a last uninstall")
}

// TestUninstallAddInTheWindow: a hostPort ADD from a runtime that read the
// conflist before it went runs while the uninstall is past its last look
// at the records (stopped there, -tags crashpoint EBPF_CNI_STOP_AT). Either
// the ADD is refused and the uninstall leaves the node as before install,
// or the uninstall fails and the pod works: never an uninstall that says
// done with a pod half there.
func TestUninstallAddInTheWindow(t *testing.T) {
	t.Parallel()
	bin := crashAgent(t)
	l := newUninstallLab(t)
	before := l.snapshot()
	l.stopped()
	var (
		cmd            *exec.Cmd
		stdout, stderr strings.Builder
	)
	err := l.InNode(func() error {
		cmd = exec.Command(bin, "uninstall", "--pin-dir", l.PinDir, "--state-dir", l.StateDir,
			"--cni-conf-dir", l.confDir, "--cni-bin-dir", testenv.BinDir, "--cgroup-root", l.cgroupRoot)
		cmd.Env = append(os.Environ(), "EBPF_CNI_STOP_AT=uninstall-hooks")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return cmd.Start()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "T" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the uninstall did not stop at uninstall-hooks:\n%s\n%s", stdout.String(), stderr.String())
		}
	}
	pod := l.NewPod()
	l.CleanupDel(pod, "late")
	_, addErr := l.AddHP(pod, "late", testenv.PM{HostPort: 8085, ContainerPort: 80, Protocol: "tcp"})
	cmd.Process.Signal(syscall.SIGCONT)
	werr := cmd.Wait()
	t.Logf("ADD in the window: %v; uninstall: %v\n%s\n%s", addErr, werr, stdout.String(), stderr.String())
	if werr == nil {
		if addErr == nil {
			t.Errorf("an ADD in the uninstall's window succeeded and the uninstall said done (exit 0)")
		}
		l.assertAsBefore(before, "after an uninstall with an ADD in its window")
	} else {
		if addErr != nil {
			t.Errorf("the uninstall failed (%v) though the ADD in its window failed too (%v)", werr, addErr)
		} else {
			serve(t, pod, 80, "late")
			expectServer(t, l.remote, "tcp", hp(uplinkIP4, 8085), "late")
		}
	}
	if err := l.Del(pod, "late", "eth0"); err != nil {
		t.Errorf("DEL of the pod ADDed in the window: %v", err)
	}
	if o, e, code := l.uninstall("--force"); code != 0 {
		t.Fatalf("a last uninstall --force: exit %d\n%s\n%s", code, o, e)
	}
	l.assertAsBefore(before, "after a last uninstall")
}

// TestUninstallRacesDel: the runtime DELs the pods while uninstall --force
// tears them down: every DEL succeeds (a failed DEL leaves the pod stuck
// terminating), and the node is as before install, after one more
// uninstall at most when the first lost a claim to a DEL.
func TestUninstallRacesDel(t *testing.T) {
	t.Parallel()
	l := newUninstallLab(t)
	before := l.snapshot()
	l.install()
	agent := l.startAgent()
	a, b := l.podsWithEverything()
	agent.Stop()
	var (
		wg             sync.WaitGroup
		delA, delB     error
		stdout, stderr string
		code           int
	)
	wg.Add(3)
	go func() { defer wg.Done(); stdout, stderr, code = l.uninstall("--force") }()
	go func() { defer wg.Done(); delA = l.Del(a, "web", "eth0") }()
	go func() { defer wg.Done(); delB = l.Del(b, "plain", "eth0") }()
	wg.Wait()
	t.Logf("uninstall --force beside the DELs: exit %d\n%s\n%s", code, stdout, stderr)
	if delA != nil || delB != nil {
		t.Errorf("the runtime's DELs beside uninstall --force: web %v, plain %v", delA, delB)
	}
	if code != 0 {
		if stdout, stderr, code = l.uninstall(); code != 0 {
			t.Fatalf("the uninstall after one that raced the DELs: exit %d\n%s\n%s", code, stdout, stderr)
		}
	}
	l.assertAsBefore(before, "after uninstall --force raced the runtime's DELs")
}
