// ebpf-agent uninstall racing the CNI verbs and itself.

package integration

import (
	"fmt"
	"strings"
	"sync"
	"testing"

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
