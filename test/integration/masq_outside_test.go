// ADD with ipMasq whose pod address lies outside every cluster CIDR: a
// warning on the plugin's stderr, which the runtime keeps, not an error.

package integration

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// lockedBuffer is a runtime's stderr (libcni writes the plugin's into it).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// take returns what was written and empties the buffer.
func (l *lockedBuffer) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	l.b.Reset()
	return s
}

// TestMasqWarnsPodOutsideClusterCIDRs: clusterCIDRs that hold neither of
// the pod's addresses (the lab mistake of a /48 for /64s outside it): the
// ADD succeeds and the plugin's stderr, as libcni hands it to the runtime,
// has one warning per address naming it, the container and the
// configured CIDRs. No warning once the node holds the pod's range (the
// agent's --cluster-cidrs), nor with the default clusterCIDRs (the pod's
// own subnets). Red before: ADD said nothing.
func TestMasqWarnsPodOutsideClusterCIDRs(t *testing.T) {
	e := testenv.New(t)
	stderr := &lockedBuffer{}
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{testenv.BinDir}, e.CacheDir,
		&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: stderr}, PluginDecoder: version.PluginDecoder{}})
	e.Extra = map[string]any{"ipMasq": true, "clusterCIDRs": []string{"10.251.0.0/16", "fd00:251::/32"}}

	p1 := e.NewPod()
	e.CleanupDel(p1, "w1")
	a4, a6 := testenv.PodIPs(t, e.Add(p1, "w1"))
	out := stderr.take()
	var warns []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "ebpf-cni: warning: ") {
			warns = append(warns, l)
		}
	}
	if len(warns) != 2 {
		t.Fatalf("ADD with pod addresses outside clusterCIDRs: %d warnings, want 2 (one per address); stderr:\n%s", len(warns), out)
	}
	for i, ip := range []string{a4.String(), a6.String()} {
		for _, want := range []string{ip, `"w1"`, "10.251.0.0/16", "clusterCIDRs", "masqueraded"} {
			if !strings.Contains(warns[i], want) {
				t.Errorf("warning %d lacks %q: %s", i, want, warns[i])
			}
		}
	}
	if err := e.Check(p1, "w1", "eth0"); err != nil {
		t.Errorf("CHECK of the warned pod: %v", err)
	}

	// The node holds the pod's range (the agent's): nothing to warn of.
	e.StartAgent(e.WriteConfDir(), "--cluster-cidrs", testenv.PodSubnet4+","+testenv.PodSubnet6, "--metrics-addr", "")
	p2 := e.NewPod()
	e.CleanupDel(p2, "w2")
	e.Add(p2, "w2")
	if out := stderr.take(); strings.Contains(out, "warning") {
		t.Errorf("ADD whose addresses the agent's cluster CIDRs hold warned:\n%s", out)
	}
	// The default: the pod's own subnets.
	delete(e.Extra, "clusterCIDRs")
	p3 := e.NewPod()
	e.CleanupDel(p3, "w3")
	e.Add(p3, "w3")
	if out := stderr.take(); strings.Contains(out, "warning") {
		t.Errorf("ADD with the default clusterCIDRs warned:\n%s", out)
	}
}
