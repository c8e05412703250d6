package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CNICacheDir is libcni's fixed result cache, which cnitool cannot move.
const CNICacheDir = "/var/lib/cni"

// Logf is how the package reports progress: the command's own logger.
type Logf func(format string, a ...any)

// RandHex returns n random bytes in hex.
func RandHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// ModuleRoot finds the directory of this repository's go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside a Go module: run from the ebpf-cni repository root")
	}
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	if !bytes.Contains(data, []byte("module github.com/ebpf-cni/ebpf-cni\n")) {
		return "", fmt.Errorf("%s is not the ebpf-cni module: run from the repository root", gomod)
	}
	return filepath.Dir(gomod), nil
}

// Build builds packages (ebpf-cni from this tree, the reference plugins at
// the versions go.mod pins as tool dependencies) into binDir.
func Build(ctx context.Context, binDir string, pkgs []string, logf Logf) error {
	dir, err := ModuleRoot()
	if err != nil {
		return err
	}
	logf("building %d binaries into %s", len(pkgs), binDir)
	start := time.Now()
	args := append([]string{"build", "-o", binDir + "/"}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(binDir, filepath.Base(p))); err != nil {
			return fmt.Errorf("build produced no %s: %w", filepath.Base(p), err)
		}
	}
	logf("built in %s", time.Since(start).Round(time.Millisecond))
	return nil
}

// HideCNICache bind-mounts cache over /var/lib/cni in this process's private
// mount namespace, so cnitool's result cache lands in the temp dir. It
// returns what it mounted over (for Unmount at cleanup). marker names a file
// written through /var/lib/cni to prove the mount is effective.
func HideCNICache(cache, marker string, logf Logf) (string, error) {
	target := CNICacheDir
	for {
		if st, err := os.Stat(target); err == nil && st.IsDir() {
			break
		}
		target = filepath.Dir(target)
		if target == "/" {
			return "", fmt.Errorf("no existing directory on the path of %s to mount over", CNICacheDir)
		}
	}
	if target == CNICacheDir {
		if err := unix.Mount(cache, target, "", unix.MS_BIND, ""); err != nil {
			return "", fmt.Errorf("bind-mount %s over %s: %w", cache, target, err)
		}
	} else {
		// /var/lib/cni does not exist: cover its nearest ancestor with an
		// empty tmpfs rather than create it on the host.
		if err := unix.Mount("tmpfs", target, "tmpfs", 0, "mode=0755"); err != nil {
			return "", fmt.Errorf("mount tmpfs over %s: %w", target, err)
		}
		logf("%s does not exist; %s is covered by a private tmpfs for this run", CNICacheDir, target)
	}
	if err := os.MkdirAll(filepath.Join(CNICacheDir, "results"), 0o700); err != nil {
		return target, err
	}
	// Prove the mount is ours: a marker written through /var/lib/cni must
	// appear in the temp dir (or the tmpfs), never on the host.
	m := filepath.Join(CNICacheDir, marker)
	if err := os.WriteFile(m, nil, 0o600); err != nil {
		return target, err
	}
	defer os.Remove(m)
	if target == CNICacheDir {
		if _, err := os.Stat(filepath.Join(cache, marker)); err != nil {
			return target, fmt.Errorf("bind mount over %s is not effective: %w", CNICacheDir, err)
		}
	}
	return target, nil
}

// Loadavg is the 1, 5 and 15 minute load averages.
func Loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// Load1 is the 1 minute load average, or -1.
func Load1() float64 {
	var l float64
	if _, err := fmt.Sscanf(Loadavg(), "%g", &l); err != nil {
		return -1
	}
	return l
}

// KernelRelease is uname -r.
func KernelRelease() string {
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		return strings.TrimSpace(string(b))
	}
	return "unknown"
}

// GoVersion is the go command's version.
func GoVersion() string {
	if out, err := exec.Command("go", "version").Output(); err == nil {
		return strings.TrimPrefix(strings.TrimSpace(string(out)), "go version ")
	}
	return runtime.Version()
}

// IperfVersion is the first line of iperf3 --version.
func IperfVersion() string {
	out, _ := exec.Command("iperf3", "--version").Output()
	line, _, _ := strings.Cut(string(out), "\n")
	if line = strings.TrimSpace(line); line != "" {
		return line
	}
	return "unknown"
}

// GitCommit is the short commit of the checkout, marked when tracked files
// are modified.
func GitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		c += " (tracked files modified)"
	}
	return c
}

// OtherRunnable counts the user tasks (threads) in state R, not kernel
// threads, whose process is not in ours: work of others competing for the
// CPUs. Kernel threads are left out: softirq and kworker threads also do
// the benchmark's own packet processing.
func OtherRunnable(ours map[int]bool) int { return runnable(ours, false) }

// runnable counts tasks in state R outside ours, kernel threads too if
// kthreads.
func runnable(ours map[int]bool, kthreads bool) int {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	n := 0
	for _, p := range procs {
		tgid, err := strconv.Atoi(p.Name())
		if err != nil || ours[tgid] {
			continue
		}
		tasks, err := os.ReadDir("/proc/" + p.Name() + "/task")
		if err != nil {
			continue
		}
		for _, t := range tasks {
			b, err := os.ReadFile("/proc/" + p.Name() + "/task/" + t.Name() + "/stat")
			if err != nil {
				continue
			}
			// pid (comm) state ppid pgrp session tty_nr tpgid flags ...
			i := bytes.LastIndexByte(b, ')')
			if i < 0 {
				continue
			}
			f := strings.Fields(string(b[i+1:]))
			if len(f) < 7 || f[0] != "R" {
				continue
			}
			flags, err := strconv.ParseUint(f[6], 10, 64)
			if err != nil || (!kthreads && flags&pfKthread != 0) {
				continue
			}
			n++
		}
	}
	return n
}

// pfKthread is PF_KTHREAD of the task flags.
const pfKthread = 0x00200000

// SampleOthers samples OtherRunnable every 500 ms (ours: this process and
// the pids given) until the returned function is called, which returns the
// mean (-1 without samples).
func SampleOthers(pids ...int) func() float64 {
	ours := map[int]bool{os.Getpid(): true}
	for _, p := range pids {
		ours[p] = true
	}
	stop := make(chan struct{})
	res := make(chan float64, 1)
	go func() {
		var sum, n float64
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				if n == 0 {
					res <- -1
				} else {
					res <- sum / n
				}
				return
			case <-t.C:
				if v := OtherRunnable(ours); v >= 0 {
					sum += float64(v)
					n++
				}
			}
		}
	}()
	return func() float64 {
		close(stop)
		return <-res
	}
}

// WaitCalm waits until no task outside this process, kernel threads
// included, was runnable in more than a fifth of 10 samples over a second
// (asynchronous network namespace teardown, for one, runs in kworkers for
// a while after many namespaces went), or until max. It returns how long
// it waited and whether the machine was calm.
func WaitCalm(ctx context.Context, max time.Duration) (time.Duration, bool) {
	start := time.Now()
	ours := map[int]bool{os.Getpid(): true}
	for {
		busy := 0
		for i := 0; i < 10; i++ {
			if runnable(ours, true) > 0 {
				busy++
			}
			if SleepCtx(ctx, 100*time.Millisecond) != nil {
				return time.Since(start), false
			}
		}
		if busy <= 2 {
			return time.Since(start), true
		}
		if time.Since(start) >= max {
			return time.Since(start), false
		}
	}
}
