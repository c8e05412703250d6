package integration

import (
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack31cLongNetworkName (attack31c): a network name is valid up to
// 255 bytes (a directory under stateDir); one of 197 bytes left the host
// veth's alias (ownerAlias, the parts within 200 bytes) no room for the
// container ID. ADD, CHECK and DEL of such a network work and leave
// nothing; the alias keeps the ID's first byte, then "..." (aliasIDRoom).
//
// Red before: ADD and DEL both panicked ("slice bounds out of range
// [:-1]" in ownerAlias, which DEL's foreignLink calls too), so the DEL the
// runtime retries could never remove what the ADD left.
//
//	go test -count=1 -run 'TestAttack31cLongNetworkName$' -v ./test/integration/
func TestAttack31cLongNetworkName(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	name := strings.Repeat("n", 197)
	l := e.NetList(name, map[string]any{"type": "ebpf-cni", "pinDir": e.PinDir, "stateDir": t.TempDir(),
		"ipam": map[string]any{"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]string{{{"subnet": "10.252.0.0/24"}}}}})
	pod := e.NewPod()
	id := testenv.RandName("a31cln")
	rt := e.RuntimeConf(pod, id, "eth0")
	t.Cleanup(func() { _ = e.DelList(l, rt) })
	if _, err := e.AddList(l, rt); err != nil {
		t.Fatalf("ADD on a network named with 197 bytes: %v", err)
	}
	hostIf, idx := e.HostVeth(id)
	lk := a26Link(t, e, idx)
	if lk == nil {
		t.Fatalf("host veth %s (ifindex %d) not found", hostIf, idx)
	}
	if want := "ebpf-cni:" + name + "/" + id[:1] + ".../eth0"; lk.Attrs().Alias != want {
		t.Errorf("host veth alias %q, want %q", lk.Attrs().Alias, want)
	}
	if err := e.CheckList(l, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := e.DelList(l, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	e.AssertClean()
}
