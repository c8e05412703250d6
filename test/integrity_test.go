package test

// Hostile review: what a runtime, a second network, a chained plugin or a
// local user can do to a node, and what the plugin must still guarantee (one
// owner for every address, interface and file; nothing left behind by a
// killed ADD; errors with the spec's codes). Every test here failed on the
// code before issue 12.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/cni"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// ---- helpers of this file --------------------------------------------------

// stdinConf is the plugin config a runtime would pipe to the plugin.
func (e *env) stdinConf(edit func(c map[string]any)) []byte {
	e.t.Helper()
	c := e.pluginConf()
	c["cniVersion"], c["name"] = "1.1.0", e.name
	if edit != nil {
		edit(c)
	}
	b, err := json.Marshal(c)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// pluginEnv is the environment a runtime sets for one verb.
func pluginEnv(cmd, containerID string, pod ns.NetNS, ifname string) map[string]string {
	m := map[string]string{
		"CNI_COMMAND": cmd, "CNI_CONTAINERID": containerID, "CNI_IFNAME": ifname, "CNI_PATH": binDir,
	}
	if pod != nil {
		m["CNI_NETNS"] = pod.Path()
	}
	return m
}

// runPlugin runs a plugin binary in the node netns and returns its stdout and
// exit error (an *exec.ExitError for a failure or a signal).
func (e *env) runPlugin(bin string, envv map[string]string, stdin []byte) ([]byte, error) {
	var out []byte
	err := e.inNode(func() error {
		cmd := exec.Command(bin)
		for k, v := range envv {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stdin = bytes.NewReader(stdin)
		var b bytes.Buffer
		cmd.Stdout = &b
		err := cmd.Run()
		out = b.Bytes()
		return err
	})
	return out, err
}

// wantPluginError fails unless the plugin exited non-zero with a CNI error of
// the given code whose message contains every substring.
func wantPluginError(t *testing.T, what string, out []byte, err error, code uint, subs ...string) *types.Error {
	t.Helper()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("%s: exit %v, want a failure; stdout: %s", what, err, out)
	}
	perr := pluginError(t, out)
	if perr.Code != code {
		t.Errorf("%s: error code %d (%q), want %d", what, perr.Code, perr.Msg, code)
	}
	for _, s := range subs {
		if !strings.Contains(perr.Msg+" "+perr.Details, s) {
			t.Errorf("%s: error %q does not mention %q", what, perr.Msg, s)
		}
	}
	return perr
}

// libcniErr checks an error libcni returned for a CNI code and substrings.
func libcniErr(t *testing.T, what string, err error, code uint, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: succeeded, want error %d", what, code)
	}
	if got := errCode(err); got != code {
		t.Errorf("%s: error code %d (%v), want %d", what, got, err, code)
	}
	wantErrContains(t, what, err, subs...)
}

// podReachable proves a pod still works both ways over both families.
func (e *env) podReachable(t *testing.T, pod ns.NetNS, ips []net.IP) {
	t.Helper()
	for _, ip := range ips {
		if err := ping(e.node, ip, 2); err != nil {
			t.Fatalf("node to pod %s: %v", ip, err)
		}
	}
	if err := ping(pod, nodeIP4, 2); err != nil {
		t.Fatalf("pod to node: %v", err)
	}
	if err := ping(pod, nodeIP6, 2); err != nil {
		t.Fatalf("pod to node: %v", err)
	}
}

// ---- 1. Retried ADD --------------------------------------------------------

// TestIntegrityRetriedAdd: a second ADD of a live (container ID, ifname) is
// refused with code 4 naming it, and the live pod keeps everything: its
// veth, map entries and, above all, its IPAM reservation (before, the failed
// ADD's undo released it and the next pod got the live pod's address).
func TestIntegrityRetriedAdd(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pod := e.newPod()
	e.cleanupDel(pod, "retried")
	live := e.addAttachment(pod, "retried")

	for i := 0; i < 2; i++ {
		_, err := e.addV("1.1.0", pod, "retried", "eth0")
		libcniErr(t, "second ADD of a live attachment", err, codeInvalidEnv,
			"CNI_CONTAINERID", "retried", "eth0", e.name, "exists already", live.hostIf)
	}
	if got := e.reservationsOf("retried"); len(got) != 2 {
		t.Fatalf("the live pod's reservations after the refused ADDs: %v, want its 2", got)
	}
	if err := e.check(pod, "retried", "eth0"); err != nil {
		t.Fatalf("CHECK of the live pod after the refused ADDs: %v", err)
	}
	e.podReachable(t, pod, live.ips)

	// The next pod does not get the live pod's address.
	next := e.newPod()
	e.cleanupDel(next, "next")
	n := e.addAttachment(next, "next")
	for _, a := range n.ips {
		for _, b := range live.ips {
			if a.Equal(b) {
				t.Fatalf("the next pod got the live pod's address %s", a)
			}
		}
	}
	e.podReachable(t, pod, live.ips)
	e.podReachable(t, next, n.ips)

	// The record was lost (state directory wiped), the veth is still there:
	// refused as well, naming the veth.
	if err := os.Remove(e.recordPath("retried", "eth0")); err != nil {
		t.Fatal(err)
	}
	_, err := e.addV("1.1.0", pod, "retried", "eth0")
	libcniErr(t, "ADD of a live attachment whose record is gone", err, codeInvalidEnv, live.hostIf, "exists already")
	if got := e.reservationsOf("retried"); len(got) != 2 {
		t.Fatalf("the live pod's reservations after the refused record-less ADD: %v", got)
	}
	e.podReachable(t, pod, live.ips)

	// Another network attaching the same container ID and interface name:
	// refused, naming the network that has it.
	netB := e.netList(randName("netb"), map[string]any{"type": "ebpf-cni", "pinDir": e.pinDir, "stateDir": t.TempDir(),
		"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{{{"subnet": "10.251.0.0/24"}}}}})
	_, err = e.addList(netB, e.rt(pod, "retried", "eth0"))
	libcniErr(t, "another network's ADD of the same container and interface", err, codeInvalidEnv,
		"exists already", "network "+fmt.Sprintf("%q", e.name), live.hostIf)
	e.podReachable(t, pod, live.ips)

	e.mustDel(pod, "retried")
	e.mustDel(next, "next")
	e.assertClean()
}

// TestIntegrityRacingAdds: ADDs of one attachment racing each other: exactly
// one wins, the others are refused (4, or 11 while the winner still works)
// and take nothing from the winner.
func TestIntegrityRacingAdds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pod := e.newPod()
	e.cleanupDel(pod, "race")
	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			_, errs[i] = e.addV("1.1.0", pod, "race", "eth0")
		}(i)
	}
	close(start)
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case errCode(err) == codeInvalidEnv || errCode(err) == types.ErrTryAgainLater:
		default:
			t.Errorf("racing ADD failed with %v (code %d), want code 4 or 11", err, errCode(err))
		}
	}
	if wins != 1 {
		t.Fatalf("%d racing ADDs of one attachment succeeded, want exactly 1: %v", wins, errs)
	}
	if got := e.reservationsOf("race"); len(got) != 2 {
		t.Fatalf("reservations after the race: %v, want the winner's 2", got)
	}
	if err := e.check(pod, "race", "eth0"); err != nil {
		t.Fatalf("CHECK of the winner: %v", err)
	}
	if err := ping(pod, nodeIP4, 2); err != nil {
		t.Fatal(err)
	}
	e.mustDel(pod, "race")
	e.assertClean()
}

// ---- 6. Killed ADD ---------------------------------------------------------

var (
	crashOnce sync.Once
	crashBin  string
	crashErr  error
)

// crashBinary builds the plugin with -tags crashpoint: EBPF_CNI_CRASH_AT=<step>
// makes it SIGKILL itself at that step of ADD.
func crashBinary(t *testing.T) string {
	t.Helper()
	crashOnce.Do(func() {
		dir := filepath.Join(binDir, "crash")
		cmd := exec.Command("go", "build", "-tags", "crashpoint", "-o", dir+"/", "github.com/ebpf-cni/ebpf-cni/cmd/ebpf-cni")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			crashErr = fmt.Errorf("build crashpoint plugin: %v\n%s", err, out)
			return
		}
		crashBin = filepath.Join(dir, "ebpf-cni")
	})
	if crashErr != nil {
		t.Fatal(crashErr)
	}
	return crashBin
}

// blockingIPAM writes an IPAM plugin that delegates to host-local and then,
// for an ADD, waits while the file named by $BLOCK_FILE exists (after
// touching $BLOCK_FILE.reserved), so a test can kill ebpf-cni while its IPAM
// exec is in flight. Returns the directory to put first in CNI_PATH.
func blockingIPAM(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
out=$(%q); rc=$?
if [ "$CNI_COMMAND" = ADD ] && [ -n "$BLOCK_FILE" ]; then
	touch "$BLOCK_FILE.reserved"
	while [ -e "$BLOCK_FILE" ]; do sleep 0.02; done
fi
printf '%%s' "$out"
exit $rc
`, filepath.Join(binDir, "host-local"))
	if err := os.WriteFile(filepath.Join(dir, "blocking-ipam"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// cleanupBy removes a half-made attachment the way a node would: the
// runtime's DEL (no prevResult: the ADD failed), GC with no valid
// attachments, or `ebpf-agent reconcile`.
func (e *env) cleanupBy(t *testing.T, how, id string, pod ns.NetNS, cniPath string) {
	t.Helper()
	switch how {
	case "DEL":
		if err := e.del(pod, id, "eth0"); err != nil {
			t.Fatalf("DEL after the killed ADD: %v", err)
		}
	case "GC":
		if err := e.gc(); err != nil {
			t.Fatalf("GC after the killed ADD: %v", err)
		}
	case "reconcile":
		out, err := e.agentCmd("reconcile", "--pin-dir", e.pinDir, "--state-dir", e.stateDir,
			"--cni-conf-dir", e.writeConfDir(), "--cni-bin-dir", cniPath)
		if err != nil {
			t.Fatalf("ebpf-agent reconcile after the killed ADD: %v\n%s", err, out)
		}
	}
}

// TestIntegrityKilledAdd: an ADD killed with SIGKILL at any step, and never
// completed, is torn down completely by the runtime's DEL, by GC, and by
// `ebpf-agent reconcile`. Before, an ADD killed before writing its record
// kept its veth, link pins and lease through GC and reconcile.
func TestIntegrityKilledAdd(t *testing.T) {
	cleanups := []string{"DEL", "GC", "reconcile"}

	// Killed while its IPAM exec was in flight: veth and programs attached,
	// the address reserved, nothing else. Deterministic without a special
	// build: the IPAM plugin blocks until the test has killed ebpf-cni.
	t.Run("during IPAM", func(t *testing.T) {
		for _, how := range cleanups {
			t.Run(how, func(t *testing.T) {
				e := newEnv(t)
				ipamDir := blockingIPAM(t)
				cniPath := ipamDir + string(os.PathListSeparator) + binDir
				e.cni = libcni.NewCNIConfigWithCacheDir([]string{ipamDir, binDir}, e.cacheDir, nil)
				e.ipam = map[string]any{"type": "blocking-ipam", "dataDir": e.dataDir,
					"ranges": [][]map[string]string{{{"subnet": podSubnet4}}, {{"subnet": podSubnet6}}}}
				pod := e.newPod()
				block := filepath.Join(t.TempDir(), "block")
				if err := os.WriteFile(block, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				envv := pluginEnv("ADD", "killed", pod, "eth0")
				envv["CNI_PATH"], envv["BLOCK_FILE"] = cniPath, block
				stdin := e.stdinConf(nil)
				var cmd *exec.Cmd
				err := e.inNode(func() error {
					cmd = exec.Command(filepath.Join(binDir, "ebpf-cni"))
					for k, v := range envv {
						cmd.Env = append(cmd.Env, k+"="+v)
					}
					cmd.Stdin = bytes.NewReader(stdin)
					return cmd.Start()
				})
				if err != nil {
					t.Fatal(err)
				}
				hostIf := cni.HostIfName("killed", "eth0")
				deadline := time.Now().Add(10 * time.Second)
				for {
					_, rerr := os.Stat(block + ".reserved")
					if rerr == nil && e.nodeLinkExists(hostIf) {
						break
					}
					if time.Now().After(deadline) {
						cmd.Process.Kill()
						cmd.Wait()
						os.Remove(block)
						t.Fatal("the ADD never got to its IPAM exec with the veth made")
					}
					time.Sleep(10 * time.Millisecond)
				}
				cmd.Process.Signal(syscall.SIGKILL)
				cmd.Wait()
				os.Remove(block) // lets the orphaned IPAM exec end
				if len(e.leftovers()) == 0 {
					t.Fatal("the killed ADD left nothing; the test would prove nothing")
				}
				_, err = e.addV("1.1.0", pod, "killed", "eth0")
				libcniErr(t, "ADD again over the killed one's remains", err, codeInvalidEnv, "did not finish", "DEL it first")

				e.cleanupBy(t, how, "killed", pod, cniPath)
				if l := e.leftovers(); len(l) > 0 {
					t.Fatalf("after %s of the killed ADD:\n  %s", how, strings.Join(l, "\n  "))
				}
				// The attachment can be made again.
				p := e.addAttachment(pod, "killed")
				if err := ping(pod, nodeIP4, 2); err != nil {
					t.Fatal(err)
				}
				if err := e.del(pod, p.id, "eth0"); err != nil {
					t.Fatal(err)
				}
				e.assertClean()
			})
		}
	})

	// Killed at every later step with the crashpoint build.
	for _, step := range []string{"claimed", "ipam", "endpoints", "host", "pod", "recorded"} {
		t.Run(step, func(t *testing.T) {
			bin := crashBinary(t)
			for _, how := range cleanups {
				t.Run(how, func(t *testing.T) {
					e := newEnv(t)
					pod := e.newPod()
					envv := pluginEnv("ADD", "crash", pod, "eth0")
					envv["EBPF_CNI_CRASH_AT"] = step
					out, err := e.runPlugin(bin, envv, e.stdinConf(nil))
					var ee *exec.ExitError
					if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
						t.Fatalf("ADD with EBPF_CNI_CRASH_AT=%s: %v, want killed by SIGKILL; stdout %s", step, err, out)
					}
					if len(e.leftovers()) == 0 {
						t.Fatal("the killed ADD left nothing; the test would prove nothing")
					}
					if step == "recorded" && how == "reconcile" {
						// Complete and live, only the result was never
						// printed: reconcile keeps it, DEL and GC remove it.
						e.cleanupBy(t, how, "crash", pod, binDir)
						if err := ping(pod, nodeIP4, 2); err != nil {
							t.Fatalf("reconcile broke a complete attachment: %v", err)
						}
						how = "DEL"
					}
					e.cleanupBy(t, how, "crash", pod, binDir)
					if l := e.leftovers(); len(l) > 0 {
						t.Fatalf("after %s of the ADD killed at %q:\n  %s", how, step, strings.Join(l, "\n  "))
					}
					pod.Do(func(ns.NetNS) error {
						if _, err := netlink.LinkByName("eth0"); err == nil {
							t.Errorf("eth0 left in the pod after %s", how)
						}
						return nil
					})
				})
			}
		})
	}
}

// TestIntegrityInFlightAdd: GC and reconcile leave an ADD that is still at
// work alone, and a DEL racing it waits for it instead of tearing down half.
func TestIntegrityInFlightAdd(t *testing.T) {
	e := newEnv(t)
	ipamDir := blockingIPAM(t)
	cniPath := ipamDir + string(os.PathListSeparator) + binDir
	e.cni = libcni.NewCNIConfigWithCacheDir([]string{ipamDir, binDir}, e.cacheDir, nil)
	e.ipam = map[string]any{"type": "blocking-ipam", "dataDir": e.dataDir,
		"ranges": [][]map[string]string{{{"subnet": podSubnet4}}, {{"subnet": podSubnet6}}}}
	pod := e.newPod()
	block := filepath.Join(t.TempDir(), "block")
	os.WriteFile(block, nil, 0o600)
	t.Cleanup(func() { os.Remove(block) })
	envv := pluginEnv("ADD", "inflight", pod, "eth0")
	envv["CNI_PATH"], envv["BLOCK_FILE"] = cniPath, block
	done := make(chan error, 1)
	var out []byte
	go func() {
		var err error
		out, err = e.runPlugin(filepath.Join(binDir, "ebpf-cni"), envv, e.stdinConf(nil))
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(block + ".reserved"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ADD never reached its IPAM exec")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := e.gc(); err != nil {
		t.Fatalf("GC during an ADD: %v", err)
	}
	e.cleanupBy(t, "reconcile", "inflight", pod, cniPath)
	os.Remove(block)
	if err := <-done; err != nil {
		t.Fatalf("the ADD that GC and reconcile ran beside: %v\n%s", err, out)
	}
	if err := ping(pod, nodeIP4, 2); err != nil {
		t.Fatalf("pod added while GC and reconcile ran: %v", err)
	}
	if err := e.del(pod, "inflight", "eth0"); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}

// ---- networks beside the env's own ------------------------------------------

// netList is the conflist of another network on the env's node.
func (e *env) netList(name string, plugins ...map[string]any) *libcni.NetworkConfigList {
	e.t.Helper()
	ps := make([]any, len(plugins))
	for i, p := range plugins {
		ps[i] = p
	}
	b, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": ps})
	if err != nil {
		e.t.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		e.t.Fatalf("parse conflist: %v", err)
	}
	return l
}

func (e *env) addList(l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (*current.Result, error) {
	var res types.Result
	err := e.inNode(func() error {
		var err error
		res, err = e.cni.AddNetworkList(context.Background(), l, rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func (e *env) delList(l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return e.inNode(func() error { return e.cni.DelNetworkList(context.Background(), l, rt) })
}

func (e *env) checkList(l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return e.inNode(func() error { return e.cni.CheckNetworkList(context.Background(), l, rt) })
}

// hostRoutesTo lists the node's routes to a pod address, by link.
func (e *env) hostRoutesTo(ip net.IP) []netlink.Route {
	e.t.Helper()
	bits := 128
	fam := netlink.FAMILY_V6
	if ip.To4() != nil {
		bits, fam = 32, netlink.FAMILY_V4
	}
	var out []netlink.Route
	e.inNode(func() error {
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}}, netlink.RT_FILTER_DST)
		out = rs
		return err
	})
	return out
}

// assertOwns fails unless every address of a is a's alone on the node: its
// endpoint entry and the node's one route to it lead to a's host veth.
func (e *env) assertOwns(t *testing.T, a *attachment) {
	t.Helper()
	m := e.maps()
	for _, ip := range a.ips {
		ep, err := m.LookupEndpoint(ip)
		if err != nil || int(ep.Ifindex) != a.ifindex {
			t.Errorf("cni_endpoints entry of %s: %+v (err %v), want ifindex %d (%s)", ip, ep, err, a.ifindex, a.id)
		}
		rs := e.hostRoutesTo(ip)
		if len(rs) != 1 || rs[0].LinkIndex != a.ifindex {
			t.Errorf("node routes to %s: %v, want one, via ifindex %d (%s)", ip, rs, a.ifindex, a.id)
		}
	}
}

// ---- 2. One owner per address ----------------------------------------------

// TestIntegrityAddressOwner: two networks on one node hand out the same
// address (overlapping ranges). The second ADD is refused with code 7 naming
// the holder (container, interface, network), whether the networks share the
// pin directory (the endpoint entry is taken) or not (the node's route is),
// and whatever their state directories; the owner keeps its entries, routes
// and traffic, also after the refused attachment's DEL. Before, the second
// ADD overwrote the entry and replaced the route, and its DEL then removed
// both: the first pod was unreachable.
func TestIntegrityAddressOwner(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		samePin bool
		v6      bool
	}{
		{"shared pinDir v4", true, false},
		{"shared pinDir v6", true, true},
		{"own pinDir v4", false, false},
		{"own pinDir v6", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			rng := map[string]string{"subnet": podSubnet4, "rangeStart": "10.250.0.5", "rangeEnd": "10.250.0.5"}
			want := net.ParseIP("10.250.0.5")
			if c.v6 {
				rng = map[string]string{"subnet": podSubnet6, "rangeStart": "fd00:250::5", "rangeEnd": "fd00:250::5"}
				want = net.ParseIP("fd00:250::5")
			}
			e.ipam = map[string]any{"type": "host-local", "dataDir": e.dataDir, "ranges": [][]map[string]string{{rng}}}
			ownerPod := e.newPod()
			e.cleanupDel(ownerPod, "owner")
			owner := e.addAttachment(ownerPod, "owner")
			if len(owner.ips) != 1 || !owner.ips[0].Equal(want) {
				t.Fatalf("owner got %v, want %s", owner.ips, want)
			}

			pinB := e.pinDir
			if !c.samePin {
				pinB = e.pinDir + "-b"
				t.Cleanup(func() { os.RemoveAll(pinB) })
			}
			stateB := t.TempDir()
			netB := e.netList(randName("netb"), map[string]any{
				"type": "ebpf-cni", "pinDir": pinB, "stateDir": stateB,
				"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{{rng}}},
			})
			podB := e.newPod()
			rtB := &libcni.RuntimeConf{ContainerID: "intruder", NetNS: podB.Path(), IfName: "eth0"}
			t.Cleanup(func() { e.delList(netB, rtB) })
			_, err := e.addList(netB, rtB)
			if err == nil {
				// Go on: what follows shows what the accepted ADD broke.
				t.Errorf("ADD of an address another network's pod holds succeeded, want error %d", codeInvalidConfig)
			} else {
				libcniErr(t, "ADD of an address another network's pod holds", err, codeInvalidConfig,
					want.String(), "container owner", "interface eth0", e.name)
			}

			check := func(when string) {
				t.Helper()
				e.assertOwns(t, owner)
				if err := e.check(ownerPod, "owner", "eth0"); err != nil {
					t.Errorf("CHECK of the owner %s: %v", when, err)
				}
				if err := ping(e.node, want, 2); err != nil {
					t.Errorf("owner %s: %v", when, err)
				}
				if err := ping(ownerPod, nodeIP4, 2); !c.v6 && err != nil {
					t.Errorf("owner %s: %v", when, err)
				}
				if err := ping(ownerPod, nodeIP6, 2); c.v6 && err != nil {
					t.Errorf("owner %s: %v", when, err)
				}
			}
			check("after the refused ADD")
			if ents, _ := os.ReadDir(filepath.Join(stateB, netB.Name)); len(ents) != 0 {
				t.Errorf("the refused ADD left records: %v", ents)
			}
			if e.nodeLinkExists(cni.HostIfName("intruder", "eth0")) {
				t.Error("the refused ADD left its host veth")
			}
			if err := e.delList(netB, rtB); err != nil {
				t.Fatalf("DEL of the refused attachment: %v", err)
			}
			check("after the refused attachment's DEL")

			e.mustDel(ownerPod, "owner")
			e.assertClean()
			// With the owner gone, the address is free for the other network.
			if _, err := e.addList(netB, rtB); err != nil {
				t.Fatalf("ADD of the freed address: %v", err)
			}
			if err := ping(e.node, want, 2); err != nil {
				t.Fatal(err)
			}
			if err := e.delList(netB, rtB); err != nil {
				t.Fatal(err)
			}
		})
	}

	// A leftover entry of a veth that no longer exists is no owner.
	t.Run("leftover entry", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.ipam = map[string]any{"type": "host-local", "dataDir": e.dataDir, "ranges": [][]map[string]string{{
			{"subnet": podSubnet4, "rangeStart": "10.250.0.5", "rangeEnd": "10.250.0.5"}}}}
		first := e.addAttachment(e.newPod(), "first") // creates the maps
		e.mustDel(first.pod, "first")
		m := e.maps()
		if err := m.PutEndpoint(net.ParseIP("10.250.0.5"), maps.NewEndpointInfo(1<<30, nil, nil)); err != nil {
			t.Fatal(err)
		}
		p := e.addAttachment(e.newPod(), "second")
		e.assertOwns(t, p)
		e.mustDel(p.pod, "second")

		// A leftover whose ifindex the next veth reuses (ifindexes of a
		// netns are handed out in order): replaced by the new pod's entry,
		// not kept with its stale MAC and flags.
		next := p.ifindex + 1
		if err := m.PutEndpoint(net.ParseIP("10.250.0.5"), maps.NewEndpointInfo(next, net.HardwareAddr{2, 0, 0, 0, 0, 1}, nil, maps.EndpointFlagHostPort)); err != nil {
			t.Fatal(err)
		}
		p = e.addAttachment(e.newPod(), "third")
		if p.ifindex != next {
			t.Fatalf("the third veth got ifindex %d, not the %d this case needs", p.ifindex, next)
		}
		ep, err := m.LookupEndpoint(p.ips[0])
		mac := podMACOf(t, p.pod, "eth0")
		if err != nil || ep.Flags != 0 || net.HardwareAddr(ep.Mac[:]).String() != mac.String() {
			t.Errorf("entry of %s: %+v (%v), want the new pod's MAC %s and no flags", p.ips[0], ep, err, mac)
		}
		p.id = "third"
		if err := ping(p.pod, nodeIP4, 2); err != nil {
			t.Fatal(err)
		}
		e.mustDel(p.pod, "third")
		e.assertClean()
	})
}

// ---- 3. Several interfaces per pod -----------------------------------------

// podDefaults names the interface of the pod's default route per family.
func podDefaults(t *testing.T, pod ns.NetNS) (v4, v6 string) {
	t.Helper()
	pod.Do(func(ns.NetNS) error {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, _ := netlink.RouteList(nil, fam)
			for _, r := range rs {
				if r.Dst != nil {
					if ones, _ := r.Dst.Mask.Size(); ones != 0 {
						continue
					}
				}
				name := fmt.Sprintf("ifindex %d", r.LinkIndex)
				if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
					name = l.Attrs().Name
				}
				if fam == netlink.FAMILY_V4 {
					v4 += name + " "
				} else {
					v6 += name + " "
				}
			}
		}
		return nil
	})
	return strings.TrimSpace(v4), strings.TrimSpace(v6)
}

// podRules lists the pod's policy routing rules other than the kernel's own.
func podRules(t *testing.T, pod ns.NetNS) []string {
	t.Helper()
	var out []string
	pod.Do(func(ns.NetNS) error {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, _ := netlink.RuleList(fam)
			for _, r := range rs {
				if r.Table == 253 || r.Table == 254 || r.Table == 255 {
					continue // default, main, local
				}
				out = append(out, r.String())
			}
		}
		return nil
	})
	return out
}

// staticIPAM is the static IPAM plugin's config: no gateway, so ebpf-cni uses
// its fallback next hops (169.254.1.1, fe80::1) for every interface.
func staticIPAM(addrs ...string) map[string]any {
	var as []map[string]string
	for _, a := range addrs {
		as = append(as, map[string]string{"address": a})
	}
	return map[string]any{"type": "static", "addresses": as}
}

// TestIntegrityTwoInterfaces: eth0 and net1 of one pod from two ebpf-cni
// networks with the same next hop (169.254.1.1, fe80::1). Adding net1 keeps
// eth0's default routes; replies from each interface's address leave through
// it (else the other host veth would drop them as spoofed); DEL of net1
// leaves eth0 with all it had. Before, net1's ADD replaced eth0's default and
// gateway routes: the node could no longer reach eth0's address.
func TestIntegrityTwoInterfaces(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ipam = staticIPAM("10.250.0.10/24", "fd00:250::10/64")
	pod := e.newPod()
	e.cleanupDel(pod, "multi")
	eth0 := e.addAttachment(pod, "multi")
	stateB := t.TempDir()
	netB := e.netList(randName("netb"), map[string]any{
		"type": "ebpf-cni", "pinDir": e.pinDir, "stateDir": stateB,
		"ipam": staticIPAM("10.251.0.10/24", "fd00:251::10/64"),
	})
	rtB := &libcni.RuntimeConf{ContainerID: "multi", NetNS: pod.Path(), IfName: "net1"}
	t.Cleanup(func() { e.delList(netB, rtB) })
	rB, err := e.addList(netB, rtB)
	if err != nil {
		t.Fatalf("ADD net1: %v", err)
	}
	net1IPs := []net.IP{net.ParseIP("10.251.0.10"), net.ParseIP("fd00:251::10")}
	for _, r := range rB.Routes {
		if ones, _ := r.Dst.Mask.Size(); ones == 0 {
			t.Errorf("net1's result claims the pod's default route %s via %s, which stays eth0's", r.Dst.String(), r.GW)
		}
	}
	if v4, v6 := podDefaults(t, pod); v4 != "eth0" || v6 != "eth0" {
		t.Fatalf("pod default routes after net1's ADD: v4 %q, v6 %q; want eth0 only", v4, v6)
	}
	net1Idx := e.hostIfindex(cni.HostIfName("multi", "net1"))
	m := e.maps()
	both := func(when string) {
		t.Helper()
		// The node reaches both addresses: each reply leaves through its own
		// interface (counted on that host veth) and passes its checks.
		for _, ip := range eth0.ips {
			if err := ping(e.node, ip, 2); err != nil {
				t.Errorf("%s: node to eth0's %s: %v", when, ip, err)
			}
		}
		before := counter(t, m, net1Idx, maps.DirEgress, maps.ReasonForward).Packets
		for _, ip := range net1IPs {
			if err := ping(e.node, ip, 2); err != nil {
				t.Errorf("%s: node to net1's %s: %v\n  net1: %s", when, ip, err, dumpCounters(m, net1Idx))
			}
		}
		if got := counter(t, m, net1Idx, maps.DirEgress, maps.ReasonForward).Packets - before; got < 4 {
			t.Errorf("%s: net1's host veth forwarded %d packets from the pod for 4 echo replies", when, got)
		}
		// Traffic the pod starts leaves by eth0, or by net1 from net1's address.
		if err := ping(pod, nodeIP4, 2); err != nil {
			t.Errorf("%s: pod to node: %v", when, err)
		}
		if err := pingFrom(pod, net1IPs[0], nodeIP4, 2); err != nil {
			t.Errorf("%s: %v", when, err)
		}
		if err := pingFrom(pod, net1IPs[1], nodeIP6, 2); err != nil {
			t.Errorf("%s: %v", when, err)
		}
		if err := e.check(pod, "multi", "eth0"); err != nil {
			t.Errorf("%s: CHECK eth0: %v", when, err)
		}
	}
	both("with eth0 and net1")
	if err := e.checkList(netB, rtB); err != nil {
		t.Errorf("CHECK net1: %v", err)
	}
	rulesBoth := podRules(t, pod)

	if err := e.delList(netB, rtB); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	if v4, v6 := podDefaults(t, pod); v4 != "eth0" || v6 != "eth0" {
		t.Errorf("pod default routes after net1's DEL: v4 %q, v6 %q; want eth0", v4, v6)
	}
	rules := podRules(t, pod)
	if len(rules) != 2 || len(rulesBoth) != 4 {
		t.Errorf("pod rules: %d with both interfaces (%v), %d after net1's DEL (%v); want 4 then eth0's 2", len(rulesBoth), rulesBoth, len(rules), rules)
	}
	for _, r := range rules {
		for _, ip := range net1IPs {
			if strings.Contains(r, ip.String()) {
				t.Errorf("net1's rule survived its DEL: %s", r)
			}
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(stateB, netB.Name)); len(ents) != 0 {
		t.Errorf("net1's DEL left records: %v", ents)
	}
	if _, err := m.LookupNetns(e.netnsCookieOf(pod)); err != nil {
		t.Errorf("net1's DEL removed the pod's netns entry, which eth0 still uses: %v", err)
	}
	for _, ip := range eth0.ips {
		if err := ping(e.node, ip, 2); err != nil {
			t.Errorf("after net1's DEL: %v", err)
		}
	}
	if err := ping(pod, nodeIP6, 2); err != nil {
		t.Errorf("after net1's DEL: %v", err)
	}
	if err := e.check(pod, "multi", "eth0"); err != nil {
		t.Errorf("CHECK eth0 after net1's DEL: %v", err)
	}
	e.mustDel(pod, "multi")
	if r := podRules(t, pod); len(r) != 0 {
		t.Errorf("pod rules after both DELs: %v", r)
	}
	e.assertClean()
}

// TestIntegrityInterfaceRouteConflict: two interfaces of one pod whose IPAM
// routes name the same destination. The second ADD is refused with code 7
// naming the route and the interface holding it, and the first keeps it.
func TestIntegrityInterfaceRouteConflict(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	route := []map[string]string{{"dst": "10.96.0.0/12"}}
	e.ipam = map[string]any{"type": "host-local", "dataDir": e.dataDir, "routes": route,
		"ranges": [][]map[string]string{{{"subnet": podSubnet4}}}}
	pod := e.newPod()
	e.cleanupDel(pod, "rc")
	eth0 := e.addAttachment(pod, "rc")
	netB := e.netList(randName("netb"), map[string]any{
		"type": "ebpf-cni", "pinDir": e.pinDir, "stateDir": t.TempDir(),
		"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(), "routes": route,
			"ranges": [][]map[string]string{{{"subnet": "10.251.0.0/24"}}}},
	})
	rtB := &libcni.RuntimeConf{ContainerID: "rc", NetNS: pod.Path(), IfName: "net1"}
	t.Cleanup(func() { e.delList(netB, rtB) })
	_, err := e.addList(netB, rtB)
	libcniErr(t, "net1 with eth0's route", err, codeInvalidConfig, "10.96.0.0/12", "eth0")
	if err := e.delList(netB, rtB); err != nil {
		t.Fatalf("DEL of the refused net1: %v", err)
	}
	var via string
	pod.Do(func(ns.NetNS) error {
		_, dst, _ := net.ParseCIDR("10.96.0.0/12")
		rs, _ := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
		for _, r := range rs {
			via += linkNameIn(r.LinkIndex) + " "
		}
		return nil
	})
	if strings.TrimSpace(via) != "eth0" {
		t.Errorf("10.96.0.0/12 in the pod goes via %q, want eth0", via)
	}
	if err := e.check(pod, "rc", "eth0"); err != nil {
		t.Errorf("CHECK eth0: %v", err)
	}
	if err := ping(e.node, eth0.ips[0], 2); err != nil {
		t.Error(err)
	}
	e.mustDel(pod, "rc")
	e.assertClean()
}

func linkNameIn(idx int) string {
	if l, err := netlink.LinkByIndex(idx); err == nil {
		return l.Attrs().Name
	}
	return fmt.Sprint(idx)
}

// netnsCookieOf returns the netns cookie of a pod.
func (e *env) netnsCookieOf(pod ns.NetNS) uint64 {
	e.t.Helper()
	var c uint64
	err := pod.Do(func(ns.NetNS) error {
		var err error
		c, err = datapath.NetnsCookie()
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// TestIntegrityOtherPluginInterface: the pod's other interface is another
// plugin's, as with Multus: ptp's eth0 (with its default route) and then
// ebpf-cni's net1, or ebpf-cni's eth0 and then a veth made by hand. ebpf-cni
// takes no default route and replaces no route of the other interface, and
// its own interface answers from its own address.
func TestIntegrityOtherPluginInterface(t *testing.T) {
	t.Parallel()
	t.Run("ptp eth0, ebpf-cni net1", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		pod := e.newPod()
		ptp := e.netList(randName("ptp"), map[string]any{
			"type": "ptp",
			"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(),
				"ranges": [][]map[string]string{{{"subnet": "10.253.0.0/24"}}},
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}}},
		})
		rtP := &libcni.RuntimeConf{ContainerID: "mixed", NetNS: pod.Path(), IfName: "eth0"}
		t.Cleanup(func() { e.delList(ptp, rtP) })
		rP, err := e.addList(ptp, rtP)
		if err != nil {
			t.Fatalf("ptp ADD: %v", err)
		}
		ptpIP := rP.IPs[0].Address.IP
		e.cleanupDel(pod, "mixed")
		rtE := e.rt(pod, "mixed", "net1")
		var res types.Result
		err = e.inNode(func() error {
			var err error
			res, err = e.cni.AddNetworkList(context.Background(), e.confList("1.1.0"), rtE)
			return err
		})
		if err != nil {
			t.Fatalf("ebpf-cni ADD of net1: %v", err)
		}
		r, _ := current.NewResultFromResult(res)
		v4, v6 := podIPs(t, r)
		if d4, d6 := podDefaults(t, pod); d4 != "eth0" || d6 != "net1" {
			t.Fatalf("pod default routes: v4 %q, v6 %q; want ptp's eth0 for v4, net1 for v6 (eth0 has none)", d4, d6)
		}
		// ptp's eth0 still works (its default route is intact) ...
		if err := ping(e.node, ptpIP, 2); err != nil {
			t.Errorf("node to ptp's eth0 %s: %v", ptpIP, err)
		}
		// ... and so does net1, both ways, replies by net1.
		for _, ip := range []net.IP{v4, v6} {
			if err := ping(e.node, ip, 2); err != nil {
				t.Errorf("node to net1's %s: %v", ip, err)
			}
		}
		if err := pingFrom(pod, v4, nodeIP4, 2); err != nil {
			t.Error(err)
		}
		if err := e.check(pod, "mixed", "net1"); err != nil {
			t.Errorf("CHECK net1: %v", err)
		}
		if err := e.del(pod, "mixed", "net1"); err != nil {
			t.Fatal(err)
		}
		if d4, _ := podDefaults(t, pod); d4 != "eth0" {
			t.Errorf("ptp's default route after net1's DEL: %q", d4)
		}
		if err := ping(e.node, ptpIP, 2); err != nil {
			t.Errorf("ptp's eth0 after net1's DEL: %v", err)
		}
		if err := e.delList(ptp, rtP); err != nil {
			t.Fatal(err)
		}
		e.assertClean()
	})

	t.Run("ebpf-cni eth0, ptp net1", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		pod := e.newPod()
		e.cleanupDel(pod, "mixed2")
		a := e.addAttachment(pod, "mixed2")
		ptp := e.netList(randName("ptp"), map[string]any{
			"type": "ptp",
			"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(),
				"ranges": [][]map[string]string{{{"subnet": "10.253.0.0/24"}}}},
		})
		rtP := &libcni.RuntimeConf{ContainerID: "mixed2", NetNS: pod.Path(), IfName: "net1"}
		t.Cleanup(func() { e.delList(ptp, rtP) })
		rP, err := e.addList(ptp, rtP)
		if err != nil {
			t.Fatalf("ptp ADD of net1: %v", err)
		}
		if d4, d6 := podDefaults(t, pod); d4 != "eth0" || d6 != "eth0" {
			t.Errorf("pod default routes with ptp's net1: %q %q, want eth0's", d4, d6)
		}
		e.podReachable(t, pod, a.ips)
		if err := ping(e.node, rP.IPs[0].Address.IP, 2); err != nil {
			t.Errorf("node to ptp's net1: %v", err)
		}
		if err := e.check(pod, "mixed2", "eth0"); err != nil {
			t.Errorf("CHECK eth0 beside ptp's net1: %v", err)
		}
		if err := e.delList(ptp, rtP); err != nil {
			t.Fatal(err)
		}
		e.podReachable(t, pod, a.ips)
		if err := e.check(pod, "mixed2", "eth0"); err != nil {
			t.Errorf("CHECK eth0 after ptp's DEL of net1: %v", err)
		}
		e.mustDel(pod, "mixed2")
		e.assertClean()
	})

	t.Run("ebpf-cni eth0, hand-made net1", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		pod := e.newPod()
		e.cleanupDel(pod, "byhand")
		a := e.addAttachment(pod, "byhand")
		// net1: a veth pair with the peer in the node, an address and a
		// route of its own, as another plugin would leave it.
		peer := randName("hand")
		err := e.inNode(func() error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer}, PeerName: "net1",
				PeerNamespace: netlink.NsFd(int(pod.Fd()))})
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.inNode(func() error { return deleteHostLink(peer) }) })
		err = pod.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("net1")
			if err != nil {
				return err
			}
			addr, _ := netlink.ParseAddr("10.254.0.2/24")
			if err := netlink.AddrAdd(l, addr); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		})
		if err != nil {
			t.Fatal(err)
		}
		if d4, d6 := podDefaults(t, pod); d4 != "eth0" || d6 != "eth0" {
			t.Errorf("pod default routes: %q %q, want eth0's", d4, d6)
		}
		e.podReachable(t, pod, a.ips)
		if err := e.check(pod, "byhand", "eth0"); err != nil {
			t.Errorf("CHECK eth0 beside a hand-made net1: %v", err)
		}
		// DEL of eth0 keeps the hand-made interface.
		e.mustDel(pod, "byhand")
		pod.Do(func(ns.NetNS) error {
			if _, err := netlink.LinkByName("net1"); err != nil {
				t.Errorf("eth0's DEL removed the hand-made net1: %v", err)
			}
			return nil
		})
		e.assertClean()
	})
}

// ---- 4. MAC changed after ADD ----------------------------------------------

// podMAC returns the MAC of an interface inside a pod.
func podMACOf(t *testing.T, pod ns.NetNS, ifname string) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err == nil {
			mac = l.Attrs().HardwareAddr
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// TestIntegrityMACChange: the reference tuning plugin, chained after
// ebpf-cni, gives the pod another MAC. The pod is neither dropped as spoofed
// nor unreachable: the node reaches it before it has sent anything of its
// own (it announces the change), other pods reach it, and the datapath's
// entry follows the MAC. Then the workload changes the MAC itself with the
// announcements switched off: its first packet teaches the datapath. Before,
// every packet of the pod was dropped as drop_spoof_mac.
func TestIntegrityMACChange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	newMAC, _ := net.ParseMAC("02:42:ac:11:00:99")
	list := e.netList(e.name, e.pluginConf(), map[string]any{"type": "tuning", "mac": newMAC.String(), "dataDir": t.TempDir()})
	pod, other := e.newPod(), e.newPod()
	rt := e.rt(pod, "tuned", "eth0")
	t.Cleanup(func() { e.delList(list, rt) })
	e.cleanupDel(other, "other")
	r, err := e.addList(list, rt)
	if err != nil {
		t.Fatalf("ADD ebpf-cni + tuning: %v", err)
	}
	if got := podMACOf(t, pod, "eth0"); got.String() != newMAC.String() {
		t.Fatalf("tuning did not set the MAC: eth0 has %s", got)
	}
	pod.Do(func(ns.NetNS) error {
		for _, f := range []string{"/proc/sys/net/ipv4/conf/eth0/arp_notify", "/proc/sys/net/ipv6/conf/eth0/ndisc_notify"} {
			if b, err := os.ReadFile(f); err != nil || strings.TrimSpace(string(b)) != "1" {
				t.Errorf("%s in the pod: %q (%v), want 1: the pod would not announce a MAC change", f, b, err)
			}
		}
		return nil
	})
	v4, v6 := podIPs(t, r)
	hostIf, idx := e.hostVeth("tuned")
	m := e.maps()
	// The node first: a server pod that never spoke must answer.
	for _, ip := range []net.IP{v4, v6} {
		if err := tcpTransfer(e.node, pod, ip, 64<<10); err != nil {
			t.Errorf("node to the retuned pod %s: %v\n  %s: %s", ip, err, hostIf, dumpCounters(m, idx))
		}
	}
	o := e.add(other, "other")
	o4, o6 := podIPs(t, o)
	for _, c := range []struct {
		src, dst ns.NetNS
		ip       net.IP
	}{{other, pod, v4}, {other, pod, v6}, {pod, other, o4}, {pod, other, o6}} {
		if err := tcpTransfer(c.src, c.dst, c.ip, 64<<10); err != nil {
			t.Errorf("pod to pod %s: %v\n  %s: %s", c.ip, err, hostIf, dumpCounters(m, idx))
		}
	}
	if li, err := m.LookupLink(idx); err != nil || net.HardwareAddr(li.Mac[:]).String() != newMAC.String() {
		t.Errorf("cni_links entry of %s: %v (err %v), want the pod's MAC %s", hostIf, net.HardwareAddr(li.Mac[:]), err, newMAC)
	}
	if c := counter(t, m, idx, maps.DirEgress, maps.ReasonDropSpoofMAC); c.Packets != 0 {
		t.Errorf("%d packets of the retuned pod dropped as drop_spoof_mac", c.Packets)
	}
	if err := e.checkList(list, rt); err != nil {
		t.Errorf("CHECK of ebpf-cni + tuning: %v", err)
	}

	// The workload changes its MAC with the announcements off: its first
	// packet is learned from.
	mine, _ := net.ParseMAC("02:42:ac:11:00:aa")
	err = pod.Do(func(ns.NetNS) error {
		for _, f := range []string{"/proc/sys/net/ipv4/conf/eth0/arp_notify", "/proc/sys/net/ipv6/conf/eth0/ndisc_notify"} {
			if err := os.WriteFile(f, []byte("0"), 0o644); err != nil {
				return err
			}
		}
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.LinkSetHardwareAddr(l, mine)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(pod, nodeIP4, 2); err != nil {
		t.Errorf("pod after changing its MAC: %v", err)
	}
	if err := tcpTransfer(other, pod, v6, 64<<10); err != nil {
		t.Errorf("to the pod over IPv6 after it spoke IPv4 only: %v", err)
	}
	if li, _ := m.LookupLink(idx); net.HardwareAddr(li.Mac[:]).String() != mine.String() {
		t.Errorf("cni_links entry after the workload's change: %v, want %s", net.HardwareAddr(li.Mac[:]), mine)
	}
	// A group address is no host's: such a source is dropped, never learned.
	before := counter(t, m, idx, maps.DirEgress, maps.ReasonDropSpoofMAC).Packets
	group, _ := net.ParseMAC("03:00:5e:00:00:01")
	podRaw(t, pod, "eth0", ipv4UDPFrame(group, hostMACOf(m, idx), v4, nodeIP4))
	waitCounter(t, m, idx, maps.ReasonDropSpoofMAC, before+1)
	if li, _ := m.LookupLink(idx); net.HardwareAddr(li.Mac[:]).String() != mine.String() {
		t.Errorf("a group source MAC was learned: %v", net.HardwareAddr(li.Mac[:]))
	}
	if err := ping(pod, nodeIP6, 2); err != nil {
		t.Errorf("pod after the group-MAC frame: %v", err)
	}

	if err := e.delList(list, rt); err != nil {
		t.Fatal(err)
	}
	e.mustDel(other, "other")
	e.assertClean()
}

// hostMACOf is the host veth MAC the datapath stored for an ifindex.
func hostMACOf(m *maps.Maps, idx int) net.HardwareAddr {
	v, _ := m.LookupLink(idx)
	return append(net.HardwareAddr{}, v.HostMac[:]...)
}

// waitCounter waits up to 2 s for a from-pod counter to reach want.
func waitCounter(t *testing.T, m *maps.Maps, idx int, r maps.Reason, want uint64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		got := counter(t, m, idx, maps.DirEgress, r).Packets
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s of ifindex %d: %d, want >= %d\n  %s", r, idx, got, want, dumpCounters(m, idx))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIntegrityRequestedMAC: the runtime's mac capability and CNI_ARGS MAC
// create the pod interface with that MAC (reported in the result, working);
// a malformed or group address is refused (7, 4) and leaves nothing.
func TestIntegrityRequestedMAC(t *testing.T) {
	t.Parallel()
	newMACEnv := func(t *testing.T) *env {
		e := newEnv(t)
		e.extra = map[string]any{"capabilities": map[string]bool{"mac": true}}
		return e
	}
	for _, c := range []struct {
		name, capMAC, argMAC, want string
	}{
		{"capability", "02:11:22:33:44:55", "", "02:11:22:33:44:55"},
		{"CNI_ARGS", "", "02:11:22:33:44:66", "02:11:22:33:44:66"},
		{"capability over CNI_ARGS", "02:11:22:33:44:77", "02:11:22:33:44:88", "02:11:22:33:44:77"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newMACEnv(t)
			pod := e.newPod()
			rt := e.rt(pod, "mac", "eth0")
			if c.capMAC != "" {
				rt.CapabilityArgs = map[string]any{"mac": c.capMAC}
			}
			if c.argMAC != "" {
				rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"MAC", c.argMAC}}
			}
			t.Cleanup(func() { e.delList(e.confList("1.1.0"), rt) })
			r, err := e.addList(e.confList("1.1.0"), rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if got := podMACOf(t, pod, "eth0"); got.String() != c.want {
				t.Errorf("eth0 has %s, want %s", got, c.want)
			}
			for _, i := range r.Interfaces {
				if i.Sandbox != "" && i.Mac != c.want {
					t.Errorf("result reports %s for %s, want %s", i.Mac, i.Name, c.want)
				}
			}
			if err := ping(pod, nodeIP4, 2); err != nil {
				t.Error(err)
			}
			if err := e.delList(e.confList("1.1.0"), rt); err != nil {
				t.Fatal(err)
			}
			e.assertClean()
		})
	}
	for _, c := range []struct {
		name   string
		capMAC string
		argMAC string
		code   uint
		msg    string
	}{
		{"capability malformed", "02:11:22", "", codeInvalidConfig, "runtimeConfig.mac"},
		{"capability group", "01:00:5e:00:00:01", "", codeInvalidConfig, "runtimeConfig.mac"},
		{"CNI_ARGS group", "", "ff:ff:ff:ff:ff:ff", codeInvalidEnv, "CNI_ARGS MAC"},
		{"CNI_ARGS zero", "", "00:00:00:00:00:00", codeInvalidEnv, "CNI_ARGS MAC"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newMACEnv(t)
			pod := e.newPod()
			envv := pluginEnv("ADD", "badmac", pod, "eth0")
			if c.argMAC != "" {
				envv["CNI_ARGS"] = "IgnoreUnknown=1;MAC=" + c.argMAC
			}
			stdin := e.stdinConf(func(m map[string]any) {
				if c.capMAC != "" {
					m["runtimeConfig"] = map[string]any{"mac": c.capMAC}
				}
			})
			out, err := e.runPlugin(filepath.Join(binDir, "ebpf-cni"), envv, stdin)
			wantPluginError(t, c.name, out, err, c.code, c.msg)
			e.assertClean()
		})
	}
}

// ---- raw frames from a pod -------------------------------------------------

// podRaw sends one Ethernet frame out of a pod interface with AF_PACKET, as
// a workload with CAP_NET_RAW can.
func podRaw(t *testing.T, pod ns.NetNS, ifname string, frame []byte) {
	t.Helper()
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		return syscall.Sendto(fd, frame, 0, &syscall.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6})
	})
	if err != nil {
		t.Fatalf("send a raw frame from the pod's %s: %v", ifname, err)
	}
}

func csumFold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func csumAdd(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func ethHeader(src, dst net.HardwareAddr, proto uint16) []byte {
	b := append(append(append([]byte{}, dst...), src...), byte(proto>>8), byte(proto))
	return b
}

// ipv4Frame builds an IPv4 packet (TTL 64, no options) around a payload.
func ipv4Frame(src, dst net.HardwareAddr, sip, dip net.IP, proto byte, payload []byte) []byte {
	h := make([]byte, 20)
	h[0], h[8], h[9] = 0x45, 64, proto
	total := 20 + len(payload)
	h[2], h[3] = byte(total>>8), byte(total)
	copy(h[12:], sip.To4())
	copy(h[16:], dip.To4())
	c := csumFold(csumAdd(0, h))
	h[10], h[11] = byte(c>>8), byte(c)
	return append(append(ethHeader(src, dst, 0x0800), h...), payload...)
}

func ipv4UDPFrame(src, dst net.HardwareAddr, sip, dip net.IP) []byte {
	udp := []byte{0x30, 0x39, 0x00, 0x09, 0, 12, 0, 0, 'r', 'a', 'w', '!'} // checksum 0: none
	return ipv4Frame(src, dst, sip, dip, 17, udp)
}

// ipv6Frame builds an IPv6 packet: ext are extension headers (their first
// byte, the next header, is filled in) before an ICMPv6 message whose
// checksum is computed.
func ipv6Frame(src, dst net.HardwareAddr, sip, dip net.IP, hop byte, ext [][]byte, icmp []byte) []byte {
	icmp = append([]byte{}, icmp...)
	icmp[2], icmp[3] = 0, 0
	ps := append(append(append([]byte{}, sip.To16()...), dip.To16()...), 0, 0, byte(len(icmp)>>8), byte(len(icmp)), 0, 0, 0, 58)
	c := csumFold(csumAdd(csumAdd(0, ps), icmp))
	icmp[2], icmp[3] = byte(c>>8), byte(c)
	var payload []byte
	next := byte(58)
	for i := len(ext) - 1; i >= 0; i-- {
		e := append([]byte{}, ext[i]...)
		e[0] = next
		next = 60 // destination options
		if len(e) == 8 && e[1] == 0xff {
			next, e[1] = 44, 0 // a fragment header (marked by the caller)
		}
		payload = append(e, payload...)
	}
	h := make([]byte, 40)
	h[0] = 0x60
	pl := len(payload) + len(icmp)
	h[4], h[5], h[6], h[7] = byte(pl>>8), byte(pl), next, hop
	copy(h[8:], sip.To16())
	copy(h[24:], dip.To16())
	return append(append(append(ethHeader(src, dst, 0x86dd), h...), payload...), icmp...)
}

// routerAdvert is an RA (router lifetime 30 min) with the source link-layer option.
func routerAdvert(mac net.HardwareAddr) []byte {
	return append([]byte{134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, mac...)
}

// ---- 9. Pods cannot reconfigure the node -----------------------------------

// nodeV6Defaults lists the node's IPv6 default routes through a link.
func (e *env) nodeV6Defaults(ifindex int) []netlink.Route {
	var out []netlink.Route
	e.inNode(func() error {
		rs, _ := netlink.RouteList(nil, netlink.FAMILY_V6)
		for _, r := range rs {
			if r.LinkIndex == ifindex && (r.Dst == nil || isDefaultNet(r.Dst)) {
				out = append(out, r)
			}
		}
		return nil
	})
	return out
}

func isDefaultNet(n *net.IPNet) bool { ones, _ := n.Mask.Size(); return ones == 0 }

// TestIntegrityRouterAdvert: a pod's router advertisements and redirects
// never reach the node: on a node whose host veth accepts RAs even while
// forwarding (accept_ra=2), a pod's RA installed a default route through the
// pod before. Now RAs (plain, behind destination options, in a first
// fragment), ICMPv6 and ICMP redirects are dropped and counted as
// drop_router_msg, and the pod's other traffic flows.
func TestIntegrityRouterAdvert(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pod := e.newPod()
	e.cleanupDel(pod, "ra")
	r := e.add(pod, "ra")
	v4, v6 := podIPs(t, r)
	hostIf, idx := e.hostVeth("ra")
	err := e.inNode(func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/"+hostIf+"/accept_ra", []byte("2"), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	m := e.maps()
	podMAC := podMACOf(t, pod, "eth0")
	hostMAC := hostMACOf(m, idx)
	allNodes, _ := net.ParseMAC("33:33:00:00:00:01")
	ll := net.ParseIP("fe80::42")
	ra := routerAdvert(podMAC)
	cases := []struct {
		name  string
		frame []byte
	}{
		{"RA", ipv6Frame(podMAC, allNodes, ll, net.ParseIP("ff02::1"), 255, nil, ra)},
		{"RA to the host veth's address", ipv6Frame(podMAC, hostMAC, ll, net.ParseIP("ff02::1"), 255, nil, ra)},
		{"RA behind destination options", ipv6Frame(podMAC, allNodes, ll, net.ParseIP("ff02::1"), 255,
			[][]byte{{0, 0, 1, 4, 0, 0, 0, 0}}, ra)},
		{"RA in a first fragment", ipv6Frame(podMAC, allNodes, ll, net.ParseIP("ff02::1"), 255,
			[][]byte{{0, 0xff, 0, 0, 0, 0, 0, 7}}, ra)},
		{"RA from the pod's global address", ipv6Frame(podMAC, allNodes, v6, net.ParseIP("ff02::1"), 255, nil, ra)},
		{"ICMPv6 redirect", ipv6Frame(podMAC, hostMAC, ll, net.ParseIP("fe80::1"), 255, nil,
			append([]byte{137, 0, 0, 0, 0, 0, 0, 0}, append(net.ParseIP("fe80::42").To16(), nodeIP6.To16()...)...))},
		{"ICMP redirect", ipv4Frame(podMAC, hostMAC, v4, nodeIP4, 1,
			icmp4([]byte{5, 1, 0, 0, 10, 250, 0, 99, 0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 192, 0, 2, 1, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}))},
	}
	for _, c := range cases {
		before := counter(t, m, idx, maps.DirEgress, maps.ReasonDropRouterMsg).Packets
		podRaw(t, pod, "eth0", c.frame)
		waitCounter(t, m, idx, maps.ReasonDropRouterMsg, before+1)
	}
	time.Sleep(200 * time.Millisecond) // the node handles an RA at once; give it time anyway
	if rs := e.nodeV6Defaults(idx); len(rs) > 0 {
		t.Errorf("the pod's RA gave the node a default route: %v", rs)
	}
	e.podReachable(t, pod, []net.IP{v4, v6})
	e.mustDel(pod, "ra")
	e.assertClean()
}

// icmp4 fills in an ICMP message's checksum.
func icmp4(b []byte) []byte {
	c := csumFold(csumAdd(0, b))
	b[2], b[3] = byte(c>>8), byte(c)
	return b
}

// ---- 5. CHECK sees what breaks a pod ---------------------------------------

// TestIntegrityCheck: CHECK passes right after ADD and names each thing that
// cuts a pod off or misroutes it: the node's route to it, its host veth
// down, an MTU that differs between the ends or from the network's, the
// pod's MAC no longer the one the datapath delivers to, its interface's
// rule or table. Before, CHECK passed with the route deleted or the veth down.
func TestIntegrityCheck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.extra = map[string]any{"mtu": 1400}
	inNode := func(t *testing.T, f func() error) {
		t.Helper()
		if err := e.inNode(f); err != nil {
			t.Fatal(err)
		}
	}
	inPod := func(t *testing.T, p *attachment, f func() error) {
		t.Helper()
		if err := p.pod.Do(func(ns.NetNS) error { return f() }); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name   string
		damage func(t *testing.T, p *attachment)
		want   func(p *attachment) []string
	}{
		{"node route to the pod deleted", func(t *testing.T, p *attachment) {
			inNode(t, func() error {
				return netlink.RouteDel(&netlink.Route{LinkIndex: p.ifindex, Scope: netlink.SCOPE_LINK, Dst: &net.IPNet{IP: p.ips[0], Mask: net.CIDRMask(32, 32)}})
			})
		}, func(p *attachment) []string { return []string{"no route", p.ips[0].String(), p.hostIf} }},
		{"node route to the pod moved to another link", func(t *testing.T, p *attachment) {
			r := &netlink.Route{Dst: &net.IPNet{IP: p.ips[1], Mask: net.CIDRMask(128, 128)}}
			inNode(t, func() error {
				lo, _ := netlink.LinkByName("lo")
				r.LinkIndex = lo.Attrs().Index
				return netlink.RouteReplace(r)
			})
			t.Cleanup(func() { e.inNode(func() error { return netlink.RouteDel(r) }) })
		}, func(p *attachment) []string { return []string{p.ips[1].String(), "link lo", p.hostIf} }},
		{"host veth down", func(t *testing.T, p *attachment) {
			inNode(t, func() error {
				l, err := netlink.LinkByName(p.hostIf)
				if err != nil {
					return err
				}
				return netlink.LinkSetDown(l)
			})
		}, func(p *attachment) []string { return []string{p.hostIf, "down"} }},
		{"host veth MTU changed", func(t *testing.T, p *attachment) {
			inNode(t, func() error {
				l, err := netlink.LinkByName(p.hostIf)
				if err != nil {
					return err
				}
				return netlink.LinkSetMTU(l, 1300)
			})
		}, func(p *attachment) []string { return []string{p.hostIf, "MTU 1300", "1400"} }},
		{"pod MTU changed", func(t *testing.T, p *attachment) {
			inPod(t, p, func() error {
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				return netlink.LinkSetMTU(l, 1280)
			})
		}, func(p *attachment) []string { return []string{"eth0", "MTU 1280", p.hostIf} }},
		{"pod MAC changed silently", func(t *testing.T, p *attachment) {
			inPod(t, p, func() error {
				// No announcement, and no IPv6 (a young interface sends
				// router solicitations and MLD reports the datapath would
				// learn from); while up (down and up would send more).
				for _, f := range []string{"/proc/sys/net/ipv4/conf/eth0/arp_notify", "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"} {
					v := "0"
					if strings.HasSuffix(f, "disable_ipv6") {
						v = "1"
					}
					if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
						return err
					}
				}
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				mac, _ := net.ParseMAC("02:99:99:99:99:99")
				return netlink.LinkSetHardwareAddr(l, mac)
			})
		}, func(p *attachment) []string { return []string{"eth0", "02:99:99:99:99:99", "cni_links"} }},
		{"pod rule deleted", func(t *testing.T, p *attachment) {
			inPod(t, p, func() error {
				rs, err := netlink.RuleList(netlink.FAMILY_V4)
				if err != nil {
					return err
				}
				for _, r := range rs {
					if r.Src != nil && r.Src.IP.Equal(p.ips[0]) {
						return netlink.RuleDel(&r)
					}
				}
				return errors.New("no rule from the pod's address")
			})
		}, func(p *attachment) []string { return []string{"rule", p.ips[0].String(), "missing"} }},
		{"program detached", func(t *testing.T, p *attachment) {
			l, err := link.LoadPinnedLink(datapath.LinkPinPath(e.pinDir, p.hostIf, "egress"), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := l.Detach(); err != nil { // at once; dropping the pin detaches later
				t.Fatal(err)
			}
		}, func(p *attachment) []string { return []string{"not attached", p.hostIf, "egress"} }},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := fmt.Sprintf("chk-%d", i)
			pod := e.newPod()
			e.cleanupDel(pod, id)
			p := e.addAttachment(pod, id)
			if err := e.check(pod, id, "eth0"); err != nil {
				t.Fatalf("CHECK right after ADD: %v", err)
			}
			c.damage(t, p)
			err := e.check(pod, id, "eth0")
			wantErrContains(t, "CHECK after: "+c.name, err, c.want(p)...)
			if err := e.del(pod, id, "eth0"); err != nil {
				t.Fatalf("DEL of the damaged pod: %v", err)
			}
		})
	}
	e.assertClean()
}

// ---- 8. Files --------------------------------------------------------------

// TestIntegrityFiles: the plugin refuses a state or pin directory (or a
// parent of one) another user owns or may write to, as the agent does; a
// symlink planted where a record goes is never followed; container IDs of
// any length work (long ones hashed in file names, the record keeps the ID).
func TestIntegrityFiles(t *testing.T) {
	t.Parallel()
	add := func(e *env, id string) ([]byte, error) {
		return e.runPlugin(filepath.Join(binDir, "ebpf-cni"), pluginEnv("ADD", id, e.newPod(), "eth0"), e.stdinConf(nil))
	}

	for _, c := range []struct {
		name  string
		setup func(t *testing.T, e *env) string // returns the directory named in the error
		field string
		msg   string
	}{
		{"stateDir owned by another user", func(t *testing.T, e *env) string {
			must(t, os.Chown(e.stateDir, 4242, 4242))
			return e.stateDir
		}, "stateDir", "owned by uid 4242"},
		{"stateDir writable by others", func(t *testing.T, e *env) string {
			must(t, os.Chmod(e.stateDir, 0o777))
			return e.stateDir
		}, "stateDir", "writable by group or others"},
		{"network directory writable by group", func(t *testing.T, e *env) string {
			d := filepath.Join(e.stateDir, e.name)
			must(t, os.Mkdir(d, 0o770))
			must(t, os.Chmod(d, 0o770))
			return d
		}, "stateDir", "writable by group or others"},
		{"parent of stateDir writable by others", func(t *testing.T, e *env) string {
			open := filepath.Join(t.TempDir(), "open")
			must(t, os.Mkdir(open, 0o777))
			must(t, os.Chmod(open, 0o777))
			e.stateDir = filepath.Join(open, "state")
			return open
		}, "stateDir", "a parent of"},
		{"pinDir writable by others", func(t *testing.T, e *env) string {
			must(t, os.Mkdir(e.pinDir, 0o777))
			must(t, os.Chmod(e.pinDir, 0o777))
			return e.pinDir
		}, "pinDir", "writable by group or others"},
		{"pinDir owned by another user", func(t *testing.T, e *env) string {
			must(t, os.Mkdir(e.pinDir, 0o700))
			must(t, os.Chown(e.pinDir, 4242, 4242))
			return e.pinDir
		}, "pinDir", "owned by uid 4242"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			dir := c.setup(t, e)
			out, err := add(e, "files")
			wantPluginError(t, "ADD", out, err, codeInvalidConfig, c.field, dir, c.msg)
			out, err = e.runPlugin(filepath.Join(binDir, "ebpf-cni"), pluginEnv("DEL", "files", nil, "eth0"), e.stdinConf(nil))
			wantPluginError(t, "DEL", out, err, codeInvalidConfig, c.field, c.msg)
			e.assertClean()
			if _, err := os.Stat(filepath.Join(e.pinDir, fmt.Sprintf("maps_v%d", maps.LayoutVersion))); err == nil {
				t.Errorf("the refused ADD set up the datapath in %s", e.pinDir)
			}
		})
	}

	t.Run("planted symlinks", func(t *testing.T) {
		e := newEnv(t)
		victim := filepath.Join(t.TempDir(), "victim")
		must(t, os.WriteFile(victim, []byte("precious"), 0o600))
		dir := filepath.Join(e.stateDir, e.name)
		must(t, os.MkdirAll(dir, 0o700))
		// Where the record of "a" goes, and where a predictable temp file
		// of "b"'s record would go.
		must(t, os.Symlink(victim, filepath.Join(dir, "a_eth0.json")))
		must(t, os.Symlink(victim, filepath.Join(dir, "b_eth0.json.tmp")))
		if out, err := add(e, "b"); err != nil {
			t.Fatalf("ADD beside a planted temp-name symlink: %v\n%s", err, out)
		}
		if b, _ := os.ReadFile(victim); string(b) != "precious" {
			t.Fatalf("a planted symlink was followed: the victim now holds %q", b)
		}
		out, err := add(e, "a")
		wantPluginError(t, "ADD over a symlink in the record's place", out, err, types.ErrIOFailure, "symlink")
		if b, _ := os.ReadFile(victim); string(b) != "precious" {
			t.Fatalf("a planted symlink was followed: the victim now holds %q", b)
		}
		if fi, err := os.Lstat(filepath.Join(dir, "b_eth0.json")); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("b's record: %v %v", fi, err)
		}
		if out, err := e.runPlugin(filepath.Join(binDir, "ebpf-cni"), pluginEnv("DEL", "b", nil, "eth0"), e.stdinConf(nil)); err != nil {
			t.Fatalf("DEL b: %v\n%s", err, out)
		}
		os.Remove(filepath.Join(dir, "a_eth0.json"))
		os.Remove(filepath.Join(dir, "b_eth0.json.tmp"))
		e.assertClean()
	})

	// The network name names a directory under stateDir.
	t.Run("network name leaving stateDir", func(t *testing.T) {
		e := newEnv(t)
		escape := filepath.Join(t.TempDir(), "escape")
		rel, err := filepath.Rel(e.stateDir, escape)
		must(t, err)
		stdin := e.stdinConf(func(c map[string]any) { c["name"] = rel })
		pod := e.newPod()
		out, err := e.runPlugin(filepath.Join(binDir, "ebpf-cni"), pluginEnv("ADD", "esc", pod, "eth0"), stdin)
		wantPluginError(t, "ADD with network name "+rel, out, err, codeInvalidConfig, "name", rel)
		if _, err := os.Stat(escape); err == nil {
			t.Errorf("the ADD wrote %s, outside stateDir", escape)
		}
		e.runPlugin(filepath.Join(binDir, "ebpf-cni"), pluginEnv("DEL", "esc", pod, "eth0"), stdin)
		e.assertClean()
	})

	// A record write killed between creating its temp file and renaming it
	// leaves the temp file; GC removes it once it is a minute old.
	t.Run("temp file of a killed write", func(t *testing.T) {
		e := newEnv(t)
		dir := filepath.Join(e.stateDir, e.name)
		must(t, os.MkdirAll(dir, 0o700))
		old, fresh := filepath.Join(dir, ".x_eth0.json.0123456789abcdef.tmp"), filepath.Join(dir, ".y_eth0.json.0123456789abcdef.tmp")
		must(t, os.WriteFile(old, []byte("{"), 0o600))
		must(t, os.WriteFile(fresh, []byte("{"), 0o600))
		must(t, os.Chtimes(old, time.Now().Add(-2*time.Minute), time.Now().Add(-2*time.Minute)))
		if err := e.gc(); err != nil {
			t.Fatalf("GC: %v", err)
		}
		if _, err := os.Stat(old); err == nil {
			t.Error("GC left a 2-minute-old temp file")
		}
		if _, err := os.Stat(fresh); err != nil {
			t.Errorf("GC removed a fresh temp file (a write in progress): %v", err)
		}
		os.Remove(fresh)
		e.assertClean()
	})

	t.Run("long container IDs", func(t *testing.T) {
		e := newEnv(t)
		long := strings.Repeat("c0ffee", 50) // 300 characters
		ids := []string{long + "-a", long + "-b", strings.Repeat("d", 5000)}
		pods := map[string]ns.NetNS{}
		for _, id := range ids {
			pods[id] = e.newPod()
			out, err := e.runPlugin(filepath.Join(binDir, "ebpf-cni"), pluginEnv("ADD", id, pods[id], "eth0"), e.stdinConf(nil))
			if err != nil {
				t.Fatalf("ADD with a %d-character container ID: %v\n%s", len(id), err, out)
			}
		}
		recs, err := cni.ListRecords(e.stateDir, e.name)
		if err != nil || len(recs) != len(ids) {
			t.Fatalf("records: %d (%v), want %d", len(recs), err, len(ids))
		}
		got := map[string]bool{}
		for _, r := range recs {
			got[r.ContainerID] = true
		}
		for _, id := range ids {
			if !got[id] {
				t.Errorf("no record keeps the %d-character ID %.20s...", len(id), id)
			}
		}
		// The claim works with hashed names too: a repeated ADD is refused.
		out, err := e.runPlugin(filepath.Join(binDir, "ebpf-cni"), pluginEnv("ADD", ids[0], pods[ids[0]], "eth0"), e.stdinConf(nil))
		wantPluginError(t, "repeated ADD of a long ID", out, err, codeInvalidEnv, "exists already")
		if err := ping(pods[ids[2]], nodeIP4, 2); err != nil {
			t.Error(err)
		}
		for _, id := range ids {
			if out, err := e.runPlugin(filepath.Join(binDir, "ebpf-cni"), pluginEnv("DEL", id, pods[id], "eth0"), e.stdinConf(nil)); err != nil {
				t.Fatalf("DEL of a %d-character ID: %v\n%s", len(id), err, out)
			}
		}
		e.assertClean()
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ---- 10. Errors ------------------------------------------------------------

// failingIPAM writes IPAM plugins that fail without a CNI error: one killed
// by a signal, one exiting 1 with nothing on stdout. Returns their directory.
func failingIPAM(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "crashing-ipam"), []byte("#!/bin/sh\nkill -SEGV $$\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "silent-ipam"), []byte("#!/bin/sh\nexit 1\n"), 0o755))
	return dir
}

// TestIntegrityErrors: failures that used to come back as code 0 (which
// means success), as the wrong code, or only after work was done: each is
// the spec's code, names what is wrong, and leaves nothing.
func TestIntegrityErrors(t *testing.T) {
	t.Parallel()
	add := func(e *env, id string) ([]byte, error) {
		return e.runPlugin(filepath.Join(binDir, "ebpf-cni"), pluginEnv("ADD", id, e.newPod(), "eth0"), e.stdinConf(nil))
	}
	bad := failingIPAM(t)
	cases := []struct {
		name    string
		conf    func(e *env, c map[string]any)
		envEdit func(e *env, envv map[string]string)
		code    uint
		msg     []string
		noPins  bool // refused before the datapath is touched
		ipamDel bool // the IPAM plugin refuses the DEL itself
	}{
		{name: "IPAM plugin killed by a signal",
			conf:    func(e *env, c map[string]any) { c["ipam"] = map[string]any{"type": "crashing-ipam"} },
			envEdit: func(e *env, envv map[string]string) { envv["CNI_PATH"] = bad + ":" + binDir },
			code:    types.ErrInternal, msg: []string{"crashing-ipam"}, ipamDel: true},
		{name: "IPAM plugin exits with no error",
			conf:    func(e *env, c map[string]any) { c["ipam"] = map[string]any{"type": "silent-ipam"} },
			envEdit: func(e *env, envv map[string]string) { envv["CNI_PATH"] = bad + ":" + binDir },
			code:    types.ErrInternal, msg: []string{"silent-ipam"}, ipamDel: true},
		{name: "CNI_NETNS is the node's netns",
			envEdit: func(e *env, envv map[string]string) { envv["CNI_NETNS"] = e.node.Path() },
			code:    codeInvalidEnv, msg: []string{"CNI_NETNS", "node's own"}, noPins: true, ipamDel: true},
		{name: "CNI_NETNS is a regular file",
			envEdit: func(e *env, envv map[string]string) {
				f := filepath.Join(e.t.TempDir(), "not-a-netns")
				os.WriteFile(f, nil, 0o600)
				envv["CNI_NETNS"] = f
			},
			code: codeInvalidEnv, msg: []string{"CNI_NETNS"}, noPins: true},
		{name: "CNI_NETNS is another kind of namespace",
			envEdit: func(e *env, envv map[string]string) { envv["CNI_NETNS"] = "/proc/self/ns/uts" },
			code:    codeInvalidEnv, msg: []string{"CNI_NETNS", "not a network namespace"}, noPins: true},
		{name: "mtu below IPv6's minimum with an IPv6 range",
			conf: func(e *env, c map[string]any) { c["mtu"] = 1000 },
			code: codeInvalidConfig, msg: []string{"mtu 1000", "1280", "ipam.ranges[1][0].subnet"}, noPins: true},
		{name: "bandwidth rate as a JSON string",
			conf: func(e *env, c map[string]any) {
				c["runtimeConfig"] = map[string]any{"bandwidth": map[string]any{"ingressRate": "1000000"}}
			},
			code: codeInvalidConfig, msg: []string{"runtimeConfig.bandwidth.ingressRate", "string"}, noPins: true},
		{name: "bandwidth rate as a non-numeric string",
			conf: func(e *env, c map[string]any) {
				c["runtimeConfig"] = map[string]any{"bandwidth": map[string]any{"egressRate": "fast"}}
			},
			code: codeInvalidConfig, msg: []string{"runtimeConfig.bandwidth.egressRate"}, noPins: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			pod := e.newPod()
			envv := pluginEnv("ADD", "errs", pod, "eth0")
			if c.envEdit != nil {
				c.envEdit(e, envv)
			}
			stdin := e.stdinConf(func(m map[string]any) {
				if c.conf != nil {
					c.conf(e, m)
				}
			})
			var nodeRoutes []netlink.Route
			e.inNode(func() error { nodeRoutes, _ = netlink.RouteList(nil, netlink.FAMILY_ALL); return nil })
			out, err := e.runPlugin(filepath.Join(binDir, "ebpf-cni"), envv, stdin)
			wantPluginError(t, "ADD", out, err, c.code, c.msg...)
			e.assertClean()
			var after []netlink.Route
			e.inNode(func() error { after, _ = netlink.RouteList(nil, netlink.FAMILY_ALL); return nil })
			if fmt.Sprint(after) != fmt.Sprint(nodeRoutes) {
				t.Errorf("the failed ADD changed the node's routes:\n  before %v\n  after  %v", nodeRoutes, after)
			}
			if c.noPins {
				if _, err := os.Stat(e.pinDir); err == nil {
					t.Errorf("the refused ADD created the pin directory")
				}
			}
			// DEL of the failed attachment, with the same input, succeeds
			// (unless the IPAM plugin refuses its part: host-local will not
			// run with the node's netns, the broken ones fail as ever).
			envv["CNI_COMMAND"] = "DEL"
			if out, err := e.runPlugin(filepath.Join(binDir, "ebpf-cni"), envv, stdin); err != nil && !c.ipamDel {
				t.Errorf("DEL after the refused ADD: %v\n%s", err, out)
			}
			e.assertClean()
		})
	}

	// A full map names itself and its size; code 11: it has room again
	// once pods go.
	t.Run("full endpoints map", func(t *testing.T) {
		e := newEnv(t)
		first := e.addAttachment(e.newPod(), "first") // sets up the datapath
		e.mustDel(first.pod, "first")
		m := e.maps()
		n := int(m.Endpoints.MaxEntries())
		keys := make([]maps.EndpointKey, n)
		vals := make([]maps.EndpointInfo, n)
		for i := range keys {
			k, _ := maps.KeyFor(net.IPv4(100, byte(i>>16), byte(i>>8), byte(i)))
			keys[i], vals[i] = k, maps.NewEndpointInfo(1<<30, nil, nil)
		}
		if _, err := m.Endpoints.BatchUpdate(keys, vals, nil); err != nil {
			t.Fatalf("fill cni_endpoints: %v", err)
		}
		out, err := add(e, "no-room")
		wantPluginError(t, "ADD with cni_endpoints full", out, err, types.ErrTryAgainLater, "cni_endpoints", "full", fmt.Sprint(n))
		if _, err := m.Endpoints.BatchDelete(keys, nil); err != nil {
			t.Fatalf("empty cni_endpoints: %v", err)
		}
		if out, err := e.runPlugin(filepath.Join(binDir, "ebpf-cni"), pluginEnv("DEL", "no-room", nil, "eth0"), e.stdinConf(nil)); err != nil {
			t.Fatalf("DEL: %v\n%s", err, out)
		}
		e.assertClean()
	})
}

// TestIntegrityCheckOlderPod: a pod added by a build before per-interface
// tables (its record has no podTable, the pod no rule) still passes CHECK
// after the upgrade, and DEL cleans it up.
func TestIntegrityCheckOlderPod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pod := e.newPod()
	e.cleanupDel(pod, "older")
	e.addAttachment(pod, "older")
	path := e.recordPath("older", "eth0")
	b, err := os.ReadFile(path)
	must(t, err)
	var rec map[string]any
	must(t, json.Unmarshal(b, &rec))
	delete(rec, "podTable")
	b, _ = json.Marshal(rec)
	must(t, os.WriteFile(path, b, 0o600))
	err = pod.Do(func(ns.NetNS) error {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, _ := netlink.RuleList(fam)
			for _, r := range rs {
				if r.Table >= 10000 {
					if err := netlink.RuleDel(&r); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	must(t, err)
	if err := e.check(pod, "older", "eth0"); err != nil {
		t.Fatalf("CHECK of a pod of the older layout: %v", err)
	}
	e.mustDel(pod, "older")
	e.assertClean()
}
