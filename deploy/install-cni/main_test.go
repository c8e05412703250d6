package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const placeholderConf = `{
  "cniVersion": "1.0.0",
  "name": "ebpf-cni",
  "plugins": [{
    "type": "ebpf-cni",
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "__PODCIDR__"}]]}
  }]
}`

func ranges(t *testing.T, out []byte) any {
	t.Helper()
	var c struct {
		Plugins []struct {
			IPAM struct {
				Ranges any `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(out, &c); err != nil {
		t.Fatal(err)
	}
	return c.Plugins[0].IPAM.Ranges
}

func TestRenderPlaceholderDualStack(t *testing.T) {
	out, err := Render([]byte(placeholderConf), []string{"10.244.3.0/24", "fd00:10:244:3::/64"})
	if err != nil {
		t.Fatal(err)
	}
	want := []any{
		[]any{map[string]any{"subnet": "10.244.3.0/24"}},
		[]any{map[string]any{"subnet": "fd00:10:244:3::/64"}},
	}
	if got := ranges(t, out); !reflect.DeepEqual(got, want) {
		t.Fatalf("ranges = %v, want %v", got, want)
	}
	if strings.Contains(string(out), Placeholder) {
		t.Fatal("placeholder left in output")
	}
}

func TestRenderWithoutPlaceholderKeepsRanges(t *testing.T) {
	conf := strings.ReplaceAll(placeholderConf, Placeholder, "10.9.0.0/24")
	out, err := Render([]byte(conf), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []any{[]any{map[string]any{"subnet": "10.9.0.0/24"}}}
	if got := ranges(t, out); !reflect.DeepEqual(got, want) {
		t.Fatalf("ranges = %v, want %v", got, want)
	}
}

func TestRenderErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		conf  string
		cidrs []string
		want  string
	}{
		"placeholder without CIDRs": {placeholderConf, nil, "needs the node's pod CIDRs"},
		"bad CIDR":                  {placeholderConf, []string{"10.0.0.0/33"}, `pod CIDR "10.0.0.0/33"`},
		"not JSON":                  {"{", nil, "not JSON"},
		"not a conflist":            {`{"cniVersion":"1.0.0","name":"x","type":"ebpf-cni"}`, nil, "plugins"},
		"no name":                   {`{"cniVersion":"1.0.0","plugins":[{"type":"ebpf-cni"}]}`, nil, "name"},
	} {
		_, err := Render([]byte(tc.conf), tc.cidrs)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", name, err, tc.want)
		}
	}
}

func TestInstallBinariesAtomicAndIdempotent(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "bin")
	for _, n := range []string{"ebpf-cni", "host-local"} {
		if err := os.WriteFile(filepath.Join(src, n), []byte("#!"+n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := installBinaries(src, dst, nil)
	if err != nil || c.total != 2 || c.updated != 2 {
		t.Fatalf("first install: %+v %v", c, err)
	}
	st, err := os.Stat(filepath.Join(dst, "ebpf-cni"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("installed binary: %v %v", st, err)
	}
	if c, err = installBinaries(src, dst, nil); err != nil || c.updated != 0 {
		t.Fatalf("second install rewrote files: %+v %v", c, err)
	}
	// A node's own host-local is kept; ebpf-cni is always ours.
	if err := os.WriteFile(filepath.Join(src, "host-local"), []byte("newer"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "ebpf-cni"), []byte("newer"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err = installBinaries(src, dst, []string{"host-local", "loopback"}); err != nil || c.updated != 1 || c.kept != 1 {
		t.Fatalf("install with -if-missing: %+v %v", c, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "host-local")); string(b) != "#!host-local" {
		t.Fatalf("node's host-local was replaced: %q", b)
	}
	ents, _ := os.ReadDir(dst)
	if len(ents) != 2 {
		t.Fatalf("temporary files left behind: %v", ents)
	}
}
