package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// The agent sizes the maps as the ebpf-cni networks of its pin directory
// do; flags that disagree with them, or networks that disagree with each
// other, are an error naming both.
func TestResolveSizing(t *testing.T) {
	conf := func(t *testing.T, nets ...string) string {
		dir := t.TempDir()
		for i, n := range nets {
			b := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"net%d","plugins":[{"type":"ebpf-cni","pinDir":"/sys/fs/bpf/x"%s,"ipam":{"type":"host-local"}}]}`, i, n)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d.conflist", i)), []byte(b), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	for _, c := range []struct {
		name              string
		nets              []string
		maxPods, hostPort int
		want              maps.Sizing
		err               string
	}{
		{"nothing", nil, 0, -1, maps.DefaultSizing, ""},
		{"flags", nil, 250, 4, maps.Sizing{MaxPods: 250, HostPortsPerPod: 4}, ""},
		{"networks", []string{`,"maxPods":250`, `,"maxPods":250`}, 0, -1, maps.Sizing{MaxPods: 250, HostPortsPerPod: 32}, ""},
		{"flags agree", []string{`,"maxPods":250`}, 250, 32, maps.Sizing{MaxPods: 250, HostPortsPerPod: 32}, ""},
		{"flags disagree", []string{`,"maxPods":250`}, 110, -1, maps.Sizing{}, `the agent's flags size the datapath at /sys/fs/bpf/x for maxPods 110, maxHostPortsPerPod 32, network "net0"`},
		{"networks disagree", []string{`,"maxPods":250`, `,"maxHostPortsPerPod":8`}, 0, -1, maps.Sizing{}, `networks "net0"`},
		{"out of range", nil, 100000, -1, maps.Sizing{}, "maxPods 100000 is out of range"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ResolveSizing(conf(t, c.nets...), "", "/sys/fs/bpf/x", c.maxPods, c.hostPort)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("%s, %v; want %s", got, err, c.want)
			}
		})
	}
}

// With Node-following the agent writes the conflist from a template after
// its first list of the Nodes, so at a node's first start the CNI
// configuration directory has no network yet: the template sizes the maps
// (else they would be pinned for the defaults, and every ADD of a network
// with another maxPods refused). The conflist the agent wrote from an
// earlier template (same base name) is the template's to replace; another
// network must still agree.
func TestResolveSizingTemplate(t *testing.T) {
	const pin = "/sys/fs/bpf/x"
	conflist := func(name, extra string) []byte {
		return []byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"plugins":[{"type":"ebpf-cni","pinDir":%q%s,"ipam":{"type":"host-local","ranges":[[{"subnet":"__PODCIDR__"}]]}}]}`, name, pin, extra))
	}
	write := func(t *testing.T, path string, b []byte) {
		t.Helper()
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmplDir := t.TempDir()
	tmpl := filepath.Join(tmplDir, "10-ebpf-cni.conflist")
	write(t, tmpl, conflist("ebpf-cni", `,"maxPods":250,"maxHostPortsPerPod":8`))
	want := maps.Sizing{MaxPods: 250, HostPortsPerPod: 8}

	empty := t.TempDir()
	if got, err := ResolveSizing(empty, tmpl, pin, 0, -1); err != nil || got != want {
		t.Fatalf("first start, empty conf dir: %s, %v; want the template's %s", got, err, want)
	}
	if _, err := ResolveSizing(empty, tmpl, pin, 110, -1); err == nil || !strings.Contains(err.Error(), tmpl) {
		t.Fatalf("flags against the template: %v, want an error naming %s", err, tmpl)
	}

	// The conflist an earlier template wrote: replaced, not compared.
	old := t.TempDir()
	write(t, filepath.Join(old, "10-ebpf-cni.conflist"), conflist("ebpf-cni", ""))
	if got, err := ResolveSizing(old, tmpl, pin, 0, -1); err != nil || got != want {
		t.Fatalf("conf dir with the agent's older conflist: %s, %v; want the template's %s", got, err, want)
	}
	// Another network of the same pin directory must agree.
	write(t, filepath.Join(old, "20-other.conflist"), conflist("other", ""))
	if _, err := ResolveSizing(old, tmpl, pin, 0, -1); err == nil || !strings.Contains(err.Error(), "20-other.conflist") {
		t.Fatalf("another network sized otherwise: %v, want an error naming it", err)
	}
	// A template that cannot be read is the agent's error, not the defaults.
	if _, err := ResolveSizing(empty, filepath.Join(tmplDir, "missing.conflist"), pin, 0, -1); err == nil {
		t.Fatal("a missing template gave no error")
	}
}
