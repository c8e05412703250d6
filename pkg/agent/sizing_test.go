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
			got, err := ResolveSizing(conf(t, c.nets...), "/sys/fs/bpf/x", c.maxPods, c.hostPort)
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
