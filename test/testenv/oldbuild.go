package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// LayoutV1Commit is the last commit whose maps are of layout 1: the
// upgrade test attaches pods with its build and upgrades the node to this
// tree's.
const LayoutV1Commit = "ae478b0d2b7e7d17197b48409cd3b7299e2b8333"

// PreUplinkMasqCommit is a release of map layout 1 whose host veth program
// masquerades itself (no uplink egress program yet): upgraded, its pods
// need this build's uplink egress program before their new programs run.
const PreUplinkMasqCommit = "e383872f512f16801d3bb92b516d84db91c48f1a"

// PreIssue28Commit is main before the fixes of issue 28 (map layout 2).
const PreIssue28Commit = "41b58f66f6137cfb6aa5a84ce68aec98c146907c"

var (
	oldBuilds   = map[string]string{}
	oldBuildsMu sync.Mutex
)

// BuildAt builds the plugin and the agent of an earlier commit of this
// repository into a directory of their own, with this tree's IPAM plugins
// beside them (a node being upgraded has those already), and returns it.
// It needs the repository's history: a shallow clone fails the test
// (fetch with --unshallow), never skips it.
func BuildAt(t *testing.T, commit string) string {
	t.Helper()
	oldBuildsMu.Lock()
	defer oldBuildsMu.Unlock()
	if dir, ok := oldBuilds[commit]; ok {
		return dir
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("find the repository (git rev-parse): %v", err)
	}
	root := strings.TrimSpace(string(top))
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("commit %s is not in the repository's history (a shallow clone? git fetch --unshallow): %v %s", commit, err, out)
	}
	src, err := os.MkdirTemp("", "ebpf-cni-src-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(src)
	dir := filepath.Join(BinDir, "build-"+commit[:12]) // removed with BinDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive --format=tar %s | tar -x -C %q", root, commit, src))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("extract %s: %v\n%s", commit, err, out)
	}
	build := exec.Command("go", "build", "-o", dir+"/", "./cmd/ebpf-cni", "./cmd/ebpf-agent")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", commit, err, out)
	}
	for _, p := range []string{"host-local", "static"} {
		if err := os.Symlink(filepath.Join(BinDir, p), filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
	oldBuilds[commit] = dir
	return dir
}
