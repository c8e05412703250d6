// GC's removal of orphaned link pins against an ADD that pins links under
// the same name at that moment.

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestGCOrphanPinsAgainstReAdd: a pod's host veth went without DEL, and
// its record and lease with it (its link pins are orphans); GC looks at the
// orphaned pins and, held there by the crashpoint build, has not removed
// them yet when the runtime adds the container again (same ID and
// interface: the same host veth name, so the same pin names). The new pod
// must keep its links: after GC it is attached by tcx, its pins are there,
// and it reaches the node.
//
// Before the fix GC removed the pins after letting the links lock go, and
// ADD pinned its links without taking it: GC removed the new pod's pins,
// detaching its programs (the pod lost the node).
func TestGCOrphanPinsAgainstReAdd(t *testing.T) {
	e := testenv.New(t)
	e.Extra = map[string]any{"attachMode": "tcx"} // pinned tcx links, no agent
	bin := crashBinary(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "c")
	e.Add(pod, "c")
	host, _ := e.HostVeth("c")
	pins := []string{datapath.LinkPinPath(e.PinDir, host, datapath.DirIngress), datapath.LinkPinPath(e.PinDir, host, datapath.DirEgress)}

	must(t, e.InNode(func() error {
		l, err := netlink.LinkByName(host)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}))
	must(t, e.Store().Remove("c", "eth0"))
	for _, ip := range e.ReservationsOf("c") {
		must(t, os.Remove(filepath.Join(e.DataDir, e.Name, ip)))
	}
	for _, p := range pins {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("no orphaned pin %s: the test would prove nothing (%v)", p, err)
		}
	}

	// GC, held between its look at the orphaned pins and their removal.
	block := filepath.Join(t.TempDir(), "block")
	must(t, os.WriteFile(block, nil, 0o600))
	defer os.Remove(block)
	stdin := e.StdinConf(func(c map[string]any) {
		c["cni.dev/valid-attachments"] = []any{map[string]any{"containerID": "c", "ifname": "eth0"}}
	})
	var gc *exec.Cmd
	var gcOut strings.Builder
	must(t, e.InNode(func() error {
		gc = exec.Command(bin)
		gc.Env = []string{"CNI_COMMAND=GC", "CNI_PATH=" + testenv.BinDir, "EBPF_CNI_HOLD_AT=orphan-pins", "EBPF_CNI_HOLD_FILE=" + block}
		gc.Stdin = strings.NewReader(string(stdin))
		gc.Stdout = &gcOut
		return gc.Start()
	}))
	gcDone := make(chan error, 1)
	go func() { gcDone <- gc.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(block + ".reached"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			gc.Process.Kill()
			t.Fatalf("GC never reached its removal of the orphaned pins: %v", <-gcDone)
		}
	}

	// The runtime adds the container again. (Now its attach waits for
	// GC's links lock: it is let go after a second either way.)
	addDone := make(chan error, 1)
	go func() {
		_, err := e.AddV("1.1.0", pod, "c", "eth0")
		addDone <- err
	}()
	select {
	case err := <-addDone:
		addDone <- err
		t.Logf("the ADD ended while GC was held: %v", err)
	case <-time.After(time.Second):
	}
	must(t, os.Remove(block))
	if err := <-gcDone; err != nil {
		t.Fatalf("GC: %v\n%s", err, gcOut.String())
	}
	if err := <-addDone; err != nil {
		t.Fatalf("ADD again: %v", err)
	}

	for _, p := range pins {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the new pod's link pin %s is gone after GC: %v", p, err)
		}
	}
	if st := e.AttachState(host); st != datapath.StateTCX {
		t.Errorf("the new pod's host veth after GC: %q, want %q", st, datapath.StateTCX)
	}
	if err := testenv.Ping(pod, testenv.NodeIP4, 2); err != nil {
		t.Errorf("the new pod after GC: %v", err)
	}
	e.MustDel(pod, "c")
	// The first veth's map entries, which no record names, are the
	// agent's reconcile's to remove (GC goes by records and pins).
	if out, err := e.AgentCmd(append([]string{"reconcile"}, e.AgentArgs(e.WriteConfDir())...)...); err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	e.AssertClean()
}
