package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// The environment of the benchmark command's re-executed process: InnerEnv
// marks it, CmdlineEnv carries the command the user ran (for the reports).
const (
	InnerEnv   = "EBPFBENCH_INNER"
	CmdlineEnv = "EBPFBENCH_CMDLINE"
)

// Outer mounts bpffs if needed and re-executes this program in a private
// mount namespace with innerEnv=1 and cmdlineEnv set to the command the user
// typed, relaying signals and the exit code. name prefixes error messages.
func Outer(name, innerEnv, cmdlineEnv string) int {
	if err := datapath.EnsureBPFFS(datapath.BPFFSRoot); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+": find own executable:", err)
		return 1
	}
	// Pdeathsig is delivered when the forking thread dies: keep it alive.
	runtime.LockOSThread()
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), innerEnv+"=1", cmdlineEnv+"="+CommandLine())
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Go makes the new mount namespace's mounts private (MS_REC|MS_PRIVATE on /).
		Unshareflags: syscall.CLONE_NEWNS,
		Pdeathsig:    syscall.SIGTERM,
	}
	return RunRelayed(name, cmd, "start in a private mount namespace")
}

// RunRelayed starts cmd and waits for it, passing on SIGINT, SIGTERM and
// SIGHUP, and returns its exit code (128+signal when a signal killed it).
func RunRelayed(name string, cmd *exec.Cmd, what string) int {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s: %v\n", name, what, err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			// A terminal's SIGINT reaches the child too; the child treats
			// repeats as one. Others (kill PID) only reach us: pass them on.
			_ = cmd.Process.Signal(s)
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return 128 + int(ws.Signal())
				}
				return ee.ExitCode()
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
				return 1
			}
			return 0
		}
	}
}

// CommandLine is the command the user typed: the go command's when this
// runs under `go run`, else our own argv.
func CommandLine() string {
	args := os.Args
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", os.Getppid())); err == nil {
		pa := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(pa) >= 2 && filepath.Base(pa[0]) == "go" && pa[1] == "run" {
			args = pa
		}
	}
	return Quote(args)
}

// Quote joins args as a shell would need them.
func Quote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'$\\") {
			a = strconv.Quote(a)
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

// Inner runs a benchmark in the re-executed process: run gets a context
// cancelled at the first SIGINT/SIGTERM/SIGHUP, and cleanup runs on every
// exit path. It returns the exit code: 128+signal when interrupted, 1 on
// failure.
func Inner(name string, logf Logf, run func(ctx context.Context) error, cleanup func()) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	var got os.Signal
	sigSeen := make(chan struct{})
	go func() {
		s := <-sigs
		got = s
		logf("received %v: stopping and cleaning up", s)
		close(sigSeen)
		cancel()
		for range sigs { // repeats: cleanup is already under way
		}
	}()

	err := run(ctx)
	cleanup()
	select {
	case <-sigSeen:
		if s, ok := got.(syscall.Signal); ok {
			return 128 + int(s)
		}
		return 130
	default:
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: FAILED: %v\n", name, err)
		return 1
	}
	return 0
}
