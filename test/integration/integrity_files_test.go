// Files: pin and state directories other users could write, symlinks,
// long container IDs, temp files of killed writes.

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestIntegrityFiles: the plugin refuses a state or pin directory (or a
// parent of one) another user owns or may write to, as the agent does; a
// symlink planted where a record goes is never followed; container IDs of
// any length work (long ones hashed in file names, the record keeps the ID).
func TestIntegrityFiles(t *testing.T) {
	t.Parallel()
	add := func(e *testenv.Env, id string) ([]byte, error) {
		return e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("ADD", id, e.NewPod(), "eth0"), e.StdinConf(nil))
	}

	for _, c := range []struct {
		name  string
		setup func(t *testing.T, e *testenv.Env) string // returns the directory named in the error
		field string
		msg   string
	}{
		{"stateDir owned by another user", func(t *testing.T, e *testenv.Env) string {
			must(t, os.Chown(e.StateDir, 4242, 4242))
			return e.StateDir
		}, "stateDir", "owned by uid 4242"},
		{"stateDir writable by others", func(t *testing.T, e *testenv.Env) string {
			must(t, os.Chmod(e.StateDir, 0o777))
			return e.StateDir
		}, "stateDir", "writable by group or others"},
		{"network directory writable by group", func(t *testing.T, e *testenv.Env) string {
			d := filepath.Join(e.StateDir, e.Name)
			must(t, os.Mkdir(d, 0o770))
			must(t, os.Chmod(d, 0o770))
			return d
		}, "stateDir", "writable by group or others"},
		{"parent of stateDir writable by others", func(t *testing.T, e *testenv.Env) string {
			open := filepath.Join(t.TempDir(), "open")
			must(t, os.Mkdir(open, 0o777))
			must(t, os.Chmod(open, 0o777))
			e.StateDir = filepath.Join(open, "state")
			return open
		}, "stateDir", "a parent of"},
		{"pinDir writable by others", func(t *testing.T, e *testenv.Env) string {
			must(t, os.Mkdir(e.PinDir, 0o777))
			must(t, os.Chmod(e.PinDir, 0o777))
			return e.PinDir
		}, "pinDir", "writable by group or others"},
		{"pinDir owned by another user", func(t *testing.T, e *testenv.Env) string {
			must(t, os.Mkdir(e.PinDir, 0o700))
			must(t, os.Chown(e.PinDir, 4242, 4242))
			return e.PinDir
		}, "pinDir", "owned by uid 4242"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := testenv.New(t)
			dir := c.setup(t, e)
			out, err := add(e, "files")
			wantPluginError(t, "ADD", out, err, codeInvalidConfig, c.field, dir, c.msg)
			out, err = e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("DEL", "files", nil, "eth0"), e.StdinConf(nil))
			wantPluginError(t, "DEL", out, err, codeInvalidConfig, c.field, c.msg)
			e.AssertClean()
			if _, err := os.Stat(datapath.MapsDir(e.PinDir)); err == nil {
				t.Errorf("the refused ADD set up the datapath in %s", e.PinDir)
			}
		})
	}

	t.Run("planted symlinks", func(t *testing.T) {
		e := testenv.New(t)
		victim := filepath.Join(t.TempDir(), "victim")
		must(t, os.WriteFile(victim, []byte("precious"), 0o600))
		dir := filepath.Join(e.StateDir, e.Name)
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
		if out, err := e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("DEL", "b", nil, "eth0"), e.StdinConf(nil)); err != nil {
			t.Fatalf("DEL b: %v\n%s", err, out)
		}
		os.Remove(filepath.Join(dir, "a_eth0.json"))
		os.Remove(filepath.Join(dir, "b_eth0.json.tmp"))
		e.AssertClean()
	})

	// The network name names a directory under stateDir.
	t.Run("network name leaving stateDir", func(t *testing.T) {
		e := testenv.New(t)
		escape := filepath.Join(t.TempDir(), "escape")
		rel, err := filepath.Rel(e.StateDir, escape)
		must(t, err)
		stdin := e.StdinConf(func(c map[string]any) { c["name"] = rel })
		pod := e.NewPod()
		out, err := e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("ADD", "esc", pod, "eth0"), stdin)
		wantPluginError(t, "ADD with network name "+rel, out, err, codeInvalidConfig, "name", rel)
		if _, err := os.Stat(escape); err == nil {
			t.Errorf("the ADD wrote %s, outside stateDir", escape)
		}
		e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("DEL", "esc", pod, "eth0"), stdin)
		e.AssertClean()
	})

	// A record write killed between creating its temp file and renaming it
	// leaves the temp file; GC removes it once it is a minute old.
	t.Run("temp file of a killed write", func(t *testing.T) {
		e := testenv.New(t)
		dir := filepath.Join(e.StateDir, e.Name)
		must(t, os.MkdirAll(dir, 0o700))
		old, fresh := filepath.Join(dir, ".x_eth0.json.0123456789abcdef.tmp"), filepath.Join(dir, ".y_eth0.json.0123456789abcdef.tmp")
		must(t, os.WriteFile(old, []byte("{"), 0o600))
		must(t, os.WriteFile(fresh, []byte("{"), 0o600))
		must(t, os.Chtimes(old, time.Now().Add(-2*time.Minute), time.Now().Add(-2*time.Minute)))
		if err := e.GC(); err != nil {
			t.Fatalf("GC: %v", err)
		}
		if _, err := os.Stat(old); err == nil {
			t.Error("GC left a 2-minute-old temp file")
		}
		if _, err := os.Stat(fresh); err != nil {
			t.Errorf("GC removed a fresh temp file (a write in progress): %v", err)
		}
		os.Remove(fresh)
		e.AssertClean()
	})

	t.Run("long container IDs", func(t *testing.T) {
		e := testenv.New(t)
		long := strings.Repeat("c0ffee", 50) // 300 characters
		ids := []string{long + "-a", long + "-b", strings.Repeat("d", 5000)}
		pods := map[string]ns.NetNS{}
		for _, id := range ids {
			pods[id] = e.NewPod()
			out, err := e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("ADD", id, pods[id], "eth0"), e.StdinConf(nil))
			if err != nil {
				t.Fatalf("ADD with a %d-character container ID: %v\n%s", len(id), err, out)
			}
		}
		recs, err := e.Store().List()
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
		out, err := e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("ADD", ids[0], pods[ids[0]], "eth0"), e.StdinConf(nil))
		wantPluginError(t, "repeated ADD of a long ID", out, err, codeInvalidEnv, "exists already")
		if err := testenv.Ping(pods[ids[2]], testenv.NodeIP4, 2); err != nil {
			t.Error(err)
		}
		for _, id := range ids {
			if out, err := e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), pluginEnv("DEL", id, pods[id], "eth0"), e.StdinConf(nil)); err != nil {
				t.Fatalf("DEL of a %d-character ID: %v\n%s", len(id), err, out)
			}
		}
		e.AssertClean()
	})
}

// TestReviewRecordNameCollision: container IDs and interface names may both
// hold "_". Attachments (pod_x, eth0) and (pod, x_eth0) are two: both ADDs
// succeed, and the DEL of one leaves the other's record. Before, they shared
// the record file pod_x_eth0.json: the second ADD was refused as a retry of
// the first, and the DEL the runtime then sent deleted the first's record.
func TestReviewRecordNameCollision(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "pod_x")
	e.AddAttachment(pod, "pod_x")
	t.Cleanup(func() { e.Del(pod, "pod", "x_eth0") })
	if _, err := e.AddV("1.1.0", pod, "pod", "x_eth0"); err != nil {
		t.Errorf("ADD of (pod, x_eth0) beside (pod_x, eth0): %v", err)
	}
	if err := e.Del(pod, "pod", "x_eth0"); err != nil {
		t.Errorf("DEL of (pod, x_eth0): %v", err)
	}
	if _, err := os.Stat(e.RecordPath("pod_x", "eth0")); err != nil {
		t.Errorf("(pod_x, eth0) lost its record to the DEL of (pod, x_eth0): %v", err)
	}
}
