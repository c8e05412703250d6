package conflist

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

func TestUsesPlaceholder(t *testing.T) {
	if !UsesPlaceholder([]byte(placeholderConf)) {
		t.Fatal("placeholder conflist not recognised")
	}
	if UsesPlaceholder([]byte(strings.ReplaceAll(placeholderConf, Placeholder, "10.9.0.0/24"))) {
		t.Fatal("a fixed range taken for a placeholder")
	}
}

func TestWriteAtomic(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d", "10-x.conflist")
	if ch, err := WriteAtomic(p, []byte("a"), 0o644); err != nil || !ch {
		t.Fatalf("first write: changed %v, %v", ch, err)
	}
	if ch, err := WriteAtomic(p, []byte("a"), 0o644); err != nil || ch {
		t.Fatalf("same content rewritten: changed %v, %v", ch, err)
	}
	if ch, err := WriteAtomic(p, []byte("b"), 0o644); err != nil || !ch {
		t.Fatalf("new content: changed %v, %v", ch, err)
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	if b, _ := os.ReadFile(p); string(b) != "b" || len(ents) != 1 {
		t.Fatalf("content %q, entries %v: want b and no temporary file", b, ents)
	}
}

func TestWithMTU(t *testing.T) {
	conf := `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ebpf-cni","ipam":{}},{"type":"ebpf-cni","mtu":1400},{"type":"other"}]}`
	out, err := WithMTU([]byte(conf), 1450)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if m := got.Plugins[0]["mtu"]; m != float64(1450) {
		t.Errorf("ebpf-cni without mtu: got %v, want 1450", m)
	}
	if m := got.Plugins[1]["mtu"]; m != float64(1400) {
		t.Errorf("ebpf-cni with mtu 1400: got %v, want it kept", m)
	}
	if _, ok := got.Plugins[2]["mtu"]; ok {
		t.Errorf("another plugin got an mtu: %v", got.Plugins[2])
	}
}
