package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// TestNetnsCookieWithoutSockopt: the cgroup connect4 program (the fallback
// of kernels before 5.14) learns the same cookie as SO_NETNS_COOKIE, in this
// netns and in new ones, from goroutines at once, and leaves no program
// attached to the cgroup it borrowed.
func TestNetnsCookieWithoutSockopt(t *testing.T) {
	requireRoot(t)
	same := func() error {
		want, err := soNetnsCookie()
		if err != nil {
			return err
		}
		got, err := bpfNetnsCookie()
		if err != nil {
			return err
		}
		if got != want {
			t.Errorf("the program learned cookie %d, SO_NETNS_COOKIE says %d", got, want)
		}
		return nil
	}
	if err := same(); err != nil {
		t.Fatal(err)
	}
	// What a round costs once the program is loaded (an ADD's, per call).
	start := time.Now()
	for i := 0; i < 20; i++ {
		if _, err := bpfNetnsCookie(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("one round of the netns cookie program: %v", time.Since(start)/20)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A new netns on a thread that dies with the goroutine (never
			// unlocked), so no other goroutine runs in it.
			runtime.LockOSThread()
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				t.Error(err)
				return
			}
			if err := same(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	dirs, err := ownCgroupDirs()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		f, err := os.Open(d)
		if err != nil {
			t.Fatal(err)
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupInet4Connect})
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range res.Programs {
			if p.ID == mustID(t, cookieProbe.prog) {
				t.Errorf("the netns cookie program is still attached to %s", d)
			}
		}
	}
}

func mustID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// TestNetnsCookieKilled: a process killed with SIGKILL while its netns
// cookie program is attached leaves nothing attached (the bpf_link was its
// own) and the program itself gone.
func TestNetnsCookieKilled(t *testing.T) {
	requireRoot(t)
	if os.Getenv("EBPF_CNI_TEST_COOKIE_CHILD") != "" {
		afterCookieAttach = func() {
			fmt.Printf("prog %d\n", mustID(t, cookieProbe.prog))
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		bpfNetnsCookie()
		t.Fatal("not killed")
	}
	var out bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestNetnsCookieKilled$", "-test.count=1")
	cmd.Env = append(os.Environ(), "EBPF_CNI_TEST_COOKIE_CHILD=1")
	cmd.Stdout = &out
	err := cmd.Run()
	if st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !st.Signaled() || st.Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not killed at the attach: %v\n%s", err, out.String())
	}
	f := strings.Fields(out.String())
	if len(f) < 2 || f[0] != "prog" {
		t.Fatalf("the child said %q", out.String())
	}
	id, _ := strconv.Atoi(f[1])
	dirs, err := ownCgroupDirs()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		cg, err := os.Open(d)
		if err != nil {
			t.Fatal(err)
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.Fd()), Attach: ebpf.AttachCGroupInet4Connect})
		cg.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range res.Programs {
			if int(p.ID) == id {
				t.Errorf("the killed child's program %d is still attached to %s", id, d)
			}
		}
	}
	// The link held the last reference: the program is freed (after an RCU
	// grace period, hence the wait).
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
		if err != nil {
			break
		}
		p.Close()
		if time.Now().After(deadline) {
			t.Errorf("the killed child's program %d still exists", id)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNetnsCookieOwnCgroupFull: a process in a cgroup of its own (not the
// root) learns its netns cookie there, and where the cgroup's connect4 hook
// already holds the kernel's 64 programs it waits for a slot instead of
// failing.
func TestNetnsCookieOwnCgroupFull(t *testing.T) {
	requireRoot(t)
	if os.Getenv("EBPF_CNI_TEST_COOKIE_CHILD") == "round" {
		start := time.Now()
		got, err := bpfNetnsCookie()
		want, _ := soNetnsCookie()
		fmt.Printf("cookie %d want %d took %d err %v\n", got, want, time.Since(start).Milliseconds(), err)
		return
	}
	root, err := CgroupRoot("")
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(root, fmt.Sprintf("ebpf-cni-test-cookie-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(cg)
	dir, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	pass, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect,
		License: "GPL", Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer pass.Close()
	var links []link.Link
	defer func() {
		for _, l := range links {
			l.Close()
		}
	}()
	for {
		l, err := link.AttachRawLink(link.RawLinkOptions{Target: int(dir.Fd()), Program: pass, Attach: ebpf.AttachCGroupInet4Connect})
		if errors.Is(err, unix.E2BIG) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		links = append(links, l)
	}
	var out bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestNetnsCookieOwnCgroupFull$", "-test.count=1")
	cmd.Env = append(os.Environ(), "EBPF_CNI_TEST_COOKIE_CHILD=round")
	cmd.Stdout = &out
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	links[0].Close() // a slot frees up
	links = links[1:]
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	var got, want, took int64
	var rest string
	if _, err := fmt.Sscanf(out.String(), "cookie %d want %d took %d err %s", &got, &want, &took, &rest); err != nil {
		t.Fatalf("the child said %q: %v", out.String(), err)
	}
	if got != want || rest != "<nil>" {
		t.Errorf("in its own full cgroup the child learned cookie %d (error %s), SO_NETNS_COOKIE says %d", got, rest, want)
	}
	if took < 50 {
		t.Errorf("the child took %d ms: it did not wait for a slot (%d programs held)", took, len(links)+1)
	}
	t.Logf("%d programs held the hook; the child waited %d ms", len(links)+1, took)
}
