package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// AgentProc is a running `ebpf-agent run` in the env's node netns.
type AgentProc struct {
	Cmd *exec.Cmd
	Log *strings.Builder // see Logs

	mu     sync.Mutex
	exited chan struct{}
	err    error // of Cmd.Wait, once exited
}

// WriteConfDir puts the env's conflist where the agent looks for networks.
func (e *Env) WriteConfDir() string {
	e.T.Helper()
	dir := e.T.TempDir()
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": e.Name, "plugins": []any{e.PluginConf()}})
	if err := os.WriteFile(filepath.Join(dir, "10-test.conflist"), b, 0o600); err != nil {
		e.T.Fatal(err)
	}
	return dir
}

func (e *Env) AgentArgs(confDir string) []string {
	return []string{"--pin-dir", e.PinDir, "--state-dir", e.StateDir, "--cni-conf-dir", confDir, "--cni-bin-dir", BinDir}
}

// StartAgent starts the agent and waits until it reports ready.
func (e *Env) StartAgent(confDir string, extra ...string) *AgentProc {
	e.T.Helper()
	return e.StartAgentBin("", nil, confDir, extra...)
}

// StartAgentBin is StartAgent with another agent binary ("" for the
// build's) and extra environment variables.
func (e *Env) StartAgentBin(bin string, env []string, confDir string, extra ...string) *AgentProc {
	e.T.Helper()
	if bin == "" {
		bin = filepath.Join(BinDir, "ebpf-agent")
	}
	a := &AgentProc{Log: &strings.Builder{}, exited: make(chan struct{})}
	err := e.InNode(func() error {
		// Tests hold the verbs (HoldVerbs) as long as they need a state.
		args := append([]string{"run", "--polite-wait", "10m"}, e.AgentArgs(confDir)...)
		a.Cmd = exec.Command(bin, append(args, extra...)...)
		a.Cmd.Env = append(os.Environ(), env...)
		stderr, err := a.Cmd.StderrPipe()
		if err != nil {
			return err
		}
		if err := a.Cmd.Start(); err != nil {
			return err
		}
		ready := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(stderr)
			once := false
			for sc.Scan() {
				a.mu.Lock()
				a.Log.WriteString(sc.Text() + "\n")
				a.mu.Unlock()
				if !once && strings.Contains(sc.Text(), "datapath ready") {
					once = true
					close(ready)
				}
			}
			a.err = a.Cmd.Wait()
			close(a.exited)
		}()
		select {
		case <-ready:
			return nil
		case <-time.After(120 * time.Second):
			// The compat build (make test-fallback) costs the verifier
			// seconds at the agent's first load of a node, and a node
			// loaded 15 times over its CPUs took three agents past 60 s
			// at once. It returns at ready: only a stuck agent waits it out.
			return fmt.Errorf("agent not ready after 120s:\n%s", a.Log)
		}
	})
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() { a.Stop() })
	return a
}

// Logs is what the agent wrote so far.
func (a *AgentProc) Logs() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.Log.String()
}

// Exited waits up to timeout for the agent to end by itself and returns
// how it ended; ok false when it still runs.
func (a *AgentProc) Exited(timeout time.Duration) (err error, ok bool) {
	select {
	case <-a.exited:
		return a.err, true
	case <-time.After(timeout):
		return nil, false
	}
}

// Stop ends the agent (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (a *AgentProc) Stop() {
	select {
	case <-a.exited:
		return
	default:
	}
	a.Cmd.Process.Signal(syscall.SIGTERM)
	if _, ok := a.Exited(5 * time.Second); !ok {
		a.Cmd.Process.Kill()
		<-a.exited
	}
}

// AgentCmd runs a one-shot agent command in the node netns.
func (e *Env) AgentCmd(args ...string) (string, error) {
	var out []byte
	err := e.InNode(func() error {
		var err error
		out, err = exec.Command(filepath.Join(BinDir, "ebpf-agent"), args...).CombinedOutput()
		return err
	})
	return string(out), err
}

// ProgIDs returns the programs attached to both tcx hooks of a host veth,
// or, where it has none (tcx missing or forced off), to its two cls_bpf
// filters.
func (e *Env) ProgIDs(ifindex int) []ebpf.ProgramID {
	e.T.Helper()
	if ids := e.tcxProgIDs(ifindex); len(ids) > 0 {
		return ids
	}
	var ids []ebpf.ProgramID
	_ = e.InNode(func() error {
		l, err := netlink.LinkByIndex(ifindex)
		if err != nil {
			return err
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, _ := netlink.FilterList(l, parent)
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "ebpf-cni-") {
					ids = append(ids, ebpf.ProgramID(bf.Id))
				}
			}
		}
		return nil
	})
	return ids
}

func (e *Env) tcxProgIDs(ifindex int) []ebpf.ProgramID {
	e.T.Helper()
	var ids []ebpf.ProgramID
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		err := e.InNode(func() error {
			r, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
			if err != nil {
				return err
			}
			for _, p := range r.Programs {
				ids = append(ids, p.ID)
			}
			return nil
		})
		if err != nil {
			e.T.Fatal(err)
		}
	}
	return ids
}

// NodeHookProgIDs returns the program each pinned node hook link runs,
// and checks that it is the hook's own: an upgrade once swapped
// cni_sock_connect4's link to cni_sock_connect6 (the kernel keeps 15
// characters of a name).
func (e *Env) NodeHookProgIDs() map[string]ebpf.ProgramID {
	e.T.Helper()
	want := map[string]string{
		"cgroup_connect4": "cni_sock_connect4", "cgroup_connect6": "cni_sock_connect6",
		"cgroup_sendmsg4": "cni_sock_sendmsg4", "cgroup_sendmsg6": "cni_sock_sendmsg6",
		"cgroup_recvmsg4": "cni_sock_recvmsg4", "cgroup_recvmsg6": "cni_sock_recvmsg6",
		"cgroup_getpeername4": "cni_sock_peer4", "cgroup_getpeername6": "cni_sock_peer6",
		"cgroup_sock_ops": "cni_sock_ops",
	}
	out := map[string]ebpf.ProgramID{}
	for _, p := range datapath.NodeHookPins(e.PinDir) {
		l, err := link.LoadPinnedLink(p.Path, nil)
		if err != nil {
			e.T.Fatalf("node hook %s: %v", p.Name, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			e.T.Fatalf("node hook %s: %v", p.Name, err)
		}
		out[p.Name] = info.Program
		prog, err := ebpf.NewProgramFromID(info.Program)
		if err != nil {
			e.T.Fatalf("program of node hook %s: %v", p.Name, err)
		}
		pi, err := prog.Info()
		prog.Close()
		if err != nil {
			e.T.Fatalf("program of node hook %s: %v", p.Name, err)
		}
		if w, ok := want[p.Name]; ok && pi.Name != w {
			e.T.Errorf("node hook %s runs %s, want %s", p.Name, pi.Name, w)
		}
	}
	return out
}

func (e *Env) MasqAgent(args ...string) ([]byte, error) {
	var out []byte
	err := e.InNode(func() error {
		cmd := exec.Command(BinDir+"/ebpf-agent", append(args, "--pin-dir", e.PinDir, "--state-dir", e.StateDir)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		var err error
		out, err = cmd.Output()
		if err != nil {
			return fmt.Errorf("ebpf-agent %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return nil
	})
	return out, err
}

// HoldVerbs takes the busy lock as a running CNI verb does, so the agent
// leaves its background work (moving pods to tcx, deleting handed-off
// veths) until the returned release; released at the end of the test too.
func (e *Env) HoldVerbs() (release func()) {
	e.T.Helper()
	rel, err := datapath.TryMarkBusy(e.PinDir)
	if err != nil {
		e.T.Fatalf("hold the busy lock: %v", err)
	}
	var once sync.Once
	release = func() { once.Do(rel) }
	e.T.Cleanup(release)
	return release
}

// AttachState is how a host veth's hooks are attached (datapath.State*).
func (e *Env) AttachState(hostIf string) string {
	e.T.Helper()
	st := datapath.StateNone
	e.InNode(func() error {
		if l, err := netlink.LinkByName(hostIf); err == nil {
			st = datapath.AttachmentOf(e.PinDir, l.Attrs().Index, hostIf)
		}
		return nil
	})
	return st
}

// WaitAttachState waits up to timeout for a host veth to reach a state and
// returns how long it took.
func (e *Env) WaitAttachState(hostIf, want string, timeout time.Duration) time.Duration {
	e.T.Helper()
	start := time.Now()
	for {
		st := e.AttachState(hostIf)
		if st == want {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			e.T.Fatalf("%s is %q after %s, want %q", hostIf, st, timeout, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
