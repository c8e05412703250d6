package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// TestForeignNetworks: networks of the conf dir whose ebpf-cni plugin names
// another pin directory (or, without pinDir, the default one when ours is
// not) are foreign; ours, other plugins' and unreadable files are not.
func TestForeignNetworks(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"10-ours.conflist":    `{"cniVersion":"1.0.0","name":"ours","plugins":[{"type":"ebpf-cni","pinDir":"/sys/fs/bpf/mine/"}]}`,
		"20-theirs.conflist":  `{"cniVersion":"1.0.0","name":"theirs","plugins":[{"type":"ebpf-cni","pinDir":"/sys/fs/bpf/other"}]}`,
		"30-default.conf":     `{"cniVersion":"1.0.0","name":"default","type":"ebpf-cni"}`,
		"40-bridge.conflist":  `{"cniVersion":"1.0.0","name":"bridge","plugins":[{"type":"bridge"}]}`,
		"50-broken.conflist":  `{`,
		"60-chained.conflist": `{"cniVersion":"1.0.0","name":"chained","plugins":[{"type":"ebpf-cni","pinDir":"/sys/fs/bpf/mine"},{"type":"tuning"}]}`,
	}
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got := foreignNetworks(dir, "/sys/fs/bpf/mine")
	if len(got) != 2 || !got["theirs"] || !got["default"] {
		t.Errorf("foreign networks %v, want theirs and default", got)
	}
	if got := foreignNetworks(dir, datapath.DefaultPinRoot); got["default"] || !got["ours"] || !got["theirs"] {
		t.Errorf("foreign networks for the default pin dir %v, want ours, theirs and chained, not default", got)
	}
}

// TestUninstalledReport: an empty report says nothing was found (and
// where it looked), JSON an empty list; a full one lists every removal.
func TestUninstalledReport(t *testing.T) {
	var b bytes.Buffer
	u := Uninstalled{PinDir: "/p", StateDir: "/s", ConfDir: "/c"}
	if err := inspect.Write(&b, u, "table"); err != nil || !strings.Contains(b.String(), "nothing of ebpf-cni found on this node (pin dir /p, state dir /s, conf dir /c)") {
		t.Errorf("empty report: %v\n%s", err, b.String())
	}
	b.Reset()
	if err := inspect.Write(&b, u, "json"); err != nil || strings.TrimSpace(b.String()) != "[]" {
		t.Errorf("empty report as JSON: %v %q", err, b.String())
	}
	b.Reset()
	u.Removed = []datapath.Removal{{Kind: "route", What: "10.1.0.0/24 via 192.0.2.2 (proto 199)"}, {Kind: "pin directory", What: "/p"}}
	if err := inspect.Write(&b, u, "table"); err != nil || !strings.Contains(b.String(), "removed 2 traces") || !strings.Contains(b.String(), "10.1.0.0/24") {
		t.Errorf("report: %v\n%s", err, b.String())
	}
}
