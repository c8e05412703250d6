package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The leak check names a namespace of the run only while a process holds
// that namespace itself, not another one that got its inode number.
func TestLiveNetnsByCookie(t *testing.T) {
	needRoot(t)
	holder := exec.Command("unshare", "--net", "--", "sleep", "infinity")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder.Process.Kill(); holder.Wait() }()
	pid := holder.Process.Pid
	self, _ := os.Readlink("/proc/self/ns/net")
	var ns string
	for i := 0; i < 100; i++ {
		exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
		if ns, _ = os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net"); ns != self && strings.HasSuffix(exe, "/sleep") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cookie, err := netnsCookie(pid)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{netnsIDs: map[string]uint64{ns: cookie}}
	if got := c.liveNetns(); len(got) != 1 || !strings.Contains(got[0], "process "+strconv.Itoa(pid)+": sleep infinity") {
		t.Fatalf("holder alive: liveNetns = %q, want %s held by process %d", got, ns, pid)
	}
	// Another namespace under the same number (as after the kernel reuses
	// it): the cookie differs, nothing of the run is held.
	c.netnsIDs[ns] = cookie + 1
	if got := c.liveNetns(); len(got) != 0 {
		t.Fatalf("cookie of another namespace: liveNetns = %q, want none", got)
	}
	c.netnsIDs[ns] = cookie
	holder.Process.Kill()
	holder.Wait()
	if got := c.liveNetns(); len(got) != 0 {
		t.Fatalf("holder gone: liveNetns = %q, want none", got)
	}
}
