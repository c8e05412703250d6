package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestRollbackRefusesNewerLayout: a node whose datapath is of a newer map
// layout than this build's (a rollback from a newer release: simulated by
// moving this build's maps to maps_v<N+1>, which the pinned programs keep
// using) is left alone by this build. Its agent exits naming the layout,
// `ebpf-agent upgrade` too, a new pod's ADD fails with 50 and leaves
// nothing, the runtime's DEL of it succeeds; meanwhile the pods' IPv4 and
// IPv6 pings lose nothing, a hostPort still answers, and no program of a
// pod or of the node hooks was swapped, no map of this layout created.
// Before the refusal an older build set up empty maps of its own and
// swapped the node hooks to them (docs/upgrade.md, Rolling back).
func TestRollbackRefusesNewerLayout(t *testing.T) {
	e := testenv.New(t)
	e.Extra = map[string]any{"ipMasq": true, "capabilities": map[string]bool{"portMappings": true}}
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "a")
	e.CleanupDel(b, "b")
	e.Add(a, "a")
	rb := e.MustAddHP(b, "b", testenv.PM{HostPort: 8091, ContainerPort: 80, Protocol: "tcp"})
	b4, b6 := testenv.PodIPs(t, rb)
	serve(t, b, 80, "b")
	expectServer(t, e.Node, "tcp", "127.0.0.1:8091", "b")
	_, idxA := e.HostVeth("a")
	_, idxB := e.HostVeth("b")
	progsA, progsB, hooks := e.ProgIDs(idxA), e.ProgIDs(idxB), e.NodeHookProgIDs()
	if len(hooks) == 0 {
		t.Fatal("no node hook attached: the hostPort pod should have set them up")
	}

	// The newer release's datapath: the same programs, over maps this
	// build does not know by their directory.
	mine := datapath.MapsDir(e.PinDir)
	newer := datapath.LayoutMapsDir(e.PinDir, maps.LayoutVersion+1)
	must(t, os.Rename(mine, newer))
	t.Cleanup(func() { os.Rename(newer, mine) }) // before the pods' DELs (cleanups run last first)

	pings := map[string]chan string{}
	for fam, ip := range map[string]net.IP{"4": b4, "6": b6} {
		waitPings(t, a, ip)
		done := make(chan string, 1)
		pings[fam] = done
		go func() {
			var out []byte
			a.Do(func(ns.NetNS) error {
				out, _ = exec.Command("ping", "-"+fam, "-c", "600", "-i", "0.005", "-W", "1", "-q", ip.String()).CombinedOutput()
				return nil
			})
			done <- string(out)
		}()
	}

	wantRefusal := func(what, out string) {
		t.Helper()
		if !strings.Contains(out, fmt.Sprintf("maps of layout v%d", maps.LayoutVersion+1)) || !strings.Contains(out, "refusing to touch it") {
			t.Errorf("%s: does not refuse naming layout v%d:\n%s", what, maps.LayoutVersion+1, out)
		}
	}
	conf := e.WriteConfDir()
	var agentOut []byte
	var agentErr error
	must(t, e.InNode(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		args := append([]string{"run", "--metrics-addr", ""}, e.AgentArgs(conf)...)
		agentOut, agentErr = exec.CommandContext(ctx, filepath.Join(testenv.BinDir, "ebpf-agent"), args...).CombinedOutput()
		return nil
	}))
	if agentErr == nil || strings.Contains(string(agentOut), "datapath ready") {
		t.Errorf("the agent ran over a newer layout (exit %v):\n%s", agentErr, agentOut)
	}
	wantRefusal("ebpf-agent run", string(agentOut))
	out, err := e.AgentCmd("upgrade", "--pin-dir", e.PinDir)
	if err == nil {
		t.Errorf("ebpf-agent upgrade over a newer layout succeeded:\n%s", out)
	}
	wantRefusal("ebpf-agent upgrade", out)

	c := e.NewPod()
	_, err = e.AddV("1.1.0", c, "c", "eth0")
	if code := testenv.ErrCode(err); code != 50 {
		t.Errorf("ADD over a newer layout: code %d (%v), want 50", code, err)
	}
	if err != nil {
		wantRefusal("ADD", err.Error())
		if !strings.Contains(err.Error(), e.PinDir) {
			t.Errorf("ADD's error does not name the pin directory %s: %v", e.PinDir, err)
		}
	}
	if err := e.Del(c, "c", "eth0"); err != nil {
		t.Errorf("the runtime's DEL after the refused ADD: %v", err)
	}

	for fam, done := range pings {
		if out := <-done; !strings.Contains(out, " 0% packet loss") {
			t.Errorf("IPv%s ping a -> b lost packets while this build was refused:\n%s", fam, out)
		}
	}
	expectServer(t, e.Node, "tcp", "127.0.0.1:8091", "b")
	if got := e.ProgIDs(idxA); !reflect.DeepEqual(got, progsA) {
		t.Errorf("a's programs changed: %v -> %v", progsA, got)
	}
	if got := e.ProgIDs(idxB); !reflect.DeepEqual(got, progsB) {
		t.Errorf("b's programs changed: %v -> %v", progsB, got)
	}
	if got := e.NodeHookProgIDs(); !reflect.DeepEqual(got, hooks) {
		t.Errorf("node hooks changed: %v -> %v", hooks, got)
	}
	for _, d := range []string{mine, datapath.StagingMapsDir(e.PinDir)} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("this build created %s over the newer layout (%v)", d, err)
		}
	}

	// Rolled forward again (the newer maps back where this build finds
	// them): the pods are deleted clean, and nothing of the refused ADD
	// is left (veth, address, records).
	must(t, os.Rename(newer, mine))
	e.MustDel(a, "a")
	e.MustDel(b, "b")
	e.AssertNoHostPorts()
	e.AssertClean()
}
