package cni

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func writeConf(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestCheckChain: the network's conflist is the first file (by name) that
// carries its name; only plugins after ebpf-cni are judged; each refusal is
// 7 naming the plugin, its index and the file.
func TestCheckChain(t *testing.T) {
	dir := t.TempDir()
	// Another network's list, and files that are not conflists.
	writeConf(t, dir, "05-other.conflist", `{"name":"other","plugins":[{"type":"ebpf-cni"},{"type":"bandwidth"}]}`)
	writeConf(t, dir, "06-notes.txt", `{"name":"net","plugins":[{"type":"ebpf-cni"},{"type":"bandwidth"}]}`)
	writeConf(t, dir, "07-broken.conflist", `{"name":`)
	writeConf(t, dir, "10-net.conflist", `{"name":"net","plugins":[{"type":"ebpf-cni","capabilities":{"portMappings":true}},{"type":"tuning","mtu":0},{"type":"firewall"},{"type":"portmap"}]}`)
	// A later file of the same name is not the one runtimes load.
	writeConf(t, dir, "20-net.conflist", `{"name":"net","plugins":[{"type":"ebpf-cni"}]}`)

	err := cniError(checkChain("net", dir))
	te, ok := err.(*types.Error)
	if !ok || te.Code != types.ErrInvalidNetworkConfig {
		t.Fatalf("checkChain: %v, want error 7", err)
	}
	for _, s := range []string{`plugins[3]`, "10-net.conflist", `plugin "portmap"`, `"portMappings" capability`} {
		if !strings.Contains(te.Msg, s) {
			t.Errorf("error %q lacks %q", te.Msg, s)
		}
	}
	// Plugins before ebpf-cni are not its chain; a network without a
	// conflist in the directory, or no directory, is not checked.
	writeConf(t, dir, "30-pre.conflist", `{"name":"pre","plugins":[{"type":"bandwidth"},{"type":"ebpf-cni"},{"type":"tuning"}]}`)
	for _, c := range []struct{ name, dir string }{{"pre", dir}, {"absent", dir}, {"net", filepath.Join(dir, "missing")}} {
		if err := checkChain(c.name, c.dir); err != nil {
			t.Errorf("checkChain(%s, %s): %v, want nil", c.name, c.dir, err)
		}
	}
}
