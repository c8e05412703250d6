package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
)

// DelV deletes with the conflist at the CNI version the attachment was added with.
func (e *Env) DelV(version string, pod ns.NetNS, containerID, ifname string) error {
	return e.InNode(func() error {
		return e.CNI.DelNetworkList(context.Background(), e.ConfList(version), e.RuntimeConf(pod, containerID, ifname))
	})
}

// CheckV runs CHECK with the conflist at the given CNI version.
func (e *Env) CheckV(version string, pod ns.NetNS, containerID, ifname string) error {
	return e.InNode(func() error {
		return e.CNI.CheckNetworkList(context.Background(), e.ConfList(version), e.RuntimeConf(pod, containerID, ifname))
	})
}

// AddK8s adds a pod at CNI 1.1.0 with the CNI_ARGS a kubelet passes.
func (e *Env) AddK8s(pod ns.NetNS, containerID, podNS, podName string) *current.Result {
	e.T.Helper()
	rt := e.RuntimeConf(pod, containerID, "eth0")
	rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", podNS}, {"K8S_POD_NAME", podName}}
	var res types.Result
	err := e.InNode(func() error {
		var err error
		res, err = e.CNI.AddNetworkList(context.Background(), e.ConfList("1.1.0"), rt)
		return err
	})
	if err != nil {
		e.T.Fatalf("ADD %s: %v", containerID, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		e.T.Fatalf("ADD %s result: %v", containerID, err)
	}
	return r
}

// MustDel deletes a pod and fails the test on error.
func (e *Env) MustDel(pod ns.NetNS, containerID string) {
	e.T.Helper()
	if err := e.Del(pod, containerID, "eth0"); err != nil {
		e.T.Fatalf("DEL %s: %v", containerID, err)
	}
}

// CleanupDel registers a best-effort DEL so a failing test leaves nothing
// attached; DEL is idempotent, so it is harmless after the test's own DEL.
func (e *Env) CleanupDel(pod ns.NetNS, containerID string) {
	e.T.Cleanup(func() { _ = e.Del(pod, containerID, "eth0") })
}

// AddBW adds a pod with the bandwidth capability, as a runtime would.
func (e *Env) AddBW(pod ns.NetNS, containerID string, bw map[string]any) (*current.Result, error) {
	if e.Extra == nil {
		e.Extra = map[string]any{}
	}
	e.Extra["capabilities"] = map[string]bool{"bandwidth": true}
	var res types.Result
	err := e.InNode(func() error {
		rt := e.RuntimeConf(pod, containerID, "eth0")
		rt.CapabilityArgs = map[string]any{"bandwidth": bw}
		var err error
		res, err = e.CNI.AddNetworkList(context.Background(), e.ConfList("1.0.0"), rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func (e *Env) CheckBW(pod ns.NetNS, containerID string, bw map[string]any) error {
	return e.InNode(func() error {
		rt := e.RuntimeConf(pod, containerID, "eth0")
		rt.CapabilityArgs = map[string]any{"bandwidth": bw}
		return e.CNI.CheckNetworkList(context.Background(), e.ConfList("1.0.0"), rt)
	})
}

// PM is one portMappings entry as a runtime passes it.
type PM struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

func (e *Env) RuntimeConfHP(pod ns.NetNS, containerID string, pms []PM) *libcni.RuntimeConf {
	rt := e.RuntimeConf(pod, containerID, "eth0")
	if pms != nil {
		rt.CapabilityArgs = map[string]any{"portMappings": pms}
	}
	return rt
}

// AddHP adds a pod with port mappings at CNI 1.0.0 (what containerd sends).
func (e *Env) AddHP(pod ns.NetNS, containerID string, pms ...PM) (*current.Result, error) {
	var res types.Result
	err := e.InNode(func() error {
		var err error
		res, err = e.CNI.AddNetworkList(context.Background(), e.ConfList("1.0.0"), e.RuntimeConfHP(pod, containerID, pms))
		return err
	})
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func (e *Env) MustAddHP(pod ns.NetNS, containerID string, pms ...PM) *current.Result {
	e.T.Helper()
	e.CleanupDel(pod, containerID)
	r, err := e.AddHP(pod, containerID, pms...)
	if err != nil {
		e.T.Fatalf("ADD %s with %+v: %v", containerID, pms, err)
	}
	return r
}

func (e *Env) CheckHP(pod ns.NetNS, containerID string, pms ...PM) error {
	return e.InNode(func() error {
		return e.CNI.CheckNetworkList(context.Background(), e.ConfList("1.0.0"), e.RuntimeConfHP(pod, containerID, pms))
	})
}

// StdinConf is the plugin config a runtime would pipe to the plugin.
func (e *Env) StdinConf(edit func(c map[string]any)) []byte {
	e.T.Helper()
	c := e.PluginConf()
	c["cniVersion"], c["name"] = "1.1.0", e.Name
	if edit != nil {
		edit(c)
	}
	b, err := json.Marshal(c)
	if err != nil {
		e.T.Fatal(err)
	}
	return b
}

// RunPlugin runs a plugin binary in the node netns and returns its stdout and
// exit error (an *exec.ExitError for a failure or a signal).
func (e *Env) RunPlugin(bin string, envv map[string]string, stdin []byte) ([]byte, error) {
	var out []byte
	err := e.InNode(func() error {
		cmd := pluginCmd(bin, envv, stdin)
		var b bytes.Buffer
		cmd.Stdout = &b
		err := cmd.Run()
		out = b.Bytes()
		return err
	})
	return out, err
}

// KillPluginAfter starts a plugin binary in the node netns, sends it
// SIGKILL after d (wherever it is), and returns how it ended: Wait's error,
// nil when it finished first (Killed tells which).
func (e *Env) KillPluginAfter(bin string, envv map[string]string, stdin []byte, d time.Duration) error {
	var werr error
	err := e.InNode(func() error {
		cmd := pluginCmd(bin, envv, stdin)
		if err := cmd.Start(); err != nil {
			return err
		}
		time.Sleep(d)
		cmd.Process.Signal(syscall.SIGKILL)
		werr = cmd.Wait()
		return nil
	})
	if err != nil {
		e.T.Fatal(err)
	}
	return werr
}

// Killed tells whether a plugin process ended by a signal (a SIGKILL that
// landed before it finished).
func Killed(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

func pluginCmd(bin string, envv map[string]string, stdin []byte) *exec.Cmd {
	cmd := exec.Command(bin)
	for k, v := range envv {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewReader(stdin)
	return cmd
}

// NetList is the conflist of another network on the env's node.
func (e *Env) NetList(name string, plugins ...map[string]any) *libcni.NetworkConfigList {
	e.T.Helper()
	ps := make([]any, len(plugins))
	for i, p := range plugins {
		ps[i] = p
	}
	b, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": ps})
	if err != nil {
		e.T.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		e.T.Fatalf("parse conflist: %v", err)
	}
	return l
}

func (e *Env) AddList(l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (*current.Result, error) {
	var res types.Result
	err := e.InNode(func() error {
		var err error
		res, err = e.CNI.AddNetworkList(context.Background(), l, rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func (e *Env) DelList(l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return e.InNode(func() error { return e.CNI.DelNetworkList(context.Background(), l, rt) })
}

func (e *Env) CheckList(l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return e.InNode(func() error { return e.CNI.CheckNetworkList(context.Background(), l, rt) })
}

// CleanupBy removes a half-made attachment the way a node would: the
// runtime's DEL (no prevResult: the ADD failed), GC with no valid
// attachments, or `ebpf-agent reconcile`.
func (e *Env) CleanupBy(t *testing.T, how, id string, pod ns.NetNS, cniPath string) {
	t.Helper()
	switch how {
	case "DEL":
		if err := e.Del(pod, id, "eth0"); err != nil {
			t.Fatalf("DEL after the killed ADD: %v", err)
		}
	case "GC":
		if err := e.GC(); err != nil {
			t.Fatalf("GC after the killed ADD: %v", err)
		}
	case "reconcile":
		out, err := e.AgentCmd("reconcile", "--pin-dir", e.PinDir, "--state-dir", e.StateDir,
			"--cni-conf-dir", e.WriteConfDir(), "--cni-bin-dir", cniPath)
		if err != nil {
			t.Fatalf("ebpf-agent reconcile after the killed ADD: %v\n%s", err, out)
		}
	}
}

// RunPod makes a pod netns, adds it as containerID (eth0), and deletes it
// when the test ends: the three lines nearly every test starts a pod with.
func (e *Env) RunPod(containerID string) (ns.NetNS, *current.Result) {
	e.T.Helper()
	pod := e.NewPod()
	e.CleanupDel(pod, containerID)
	return pod, e.Add(pod, containerID)
}
