package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Procs tracks every process started in a namespace, so cleanup can kill them.
type Procs struct {
	mu sync.Mutex
	m  map[*Proc]struct{}
}

// Proc is one process started by Procs.Start.
type Proc struct {
	Desc           string
	Cmd            *exec.Cmd
	Stdout, Stderr SyncBuffer
	done           chan struct{}
	err            error
}

// SyncBuffer collects a process's output: read (String, Bytes) while the
// process still writes it, as a bench polling the agent's log for "ready"
// does; a bare bytes.Buffer there is a data race.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Bytes is a copy of what was written so far.
func (s *SyncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

func NewProcs() *Procs { return &Procs{m: map[*Proc]struct{}{}} }

// Start runs a command in a network namespace: it is forked from the
// goroutine's locked thread inside n.Do, so it is born in n.
func (ps *Procs) Start(ctx context.Context, n ns.NetNS, name string, args ...string) (*Proc, error) {
	p := &Proc{Desc: name + " " + strings.Join(args, " "), done: make(chan struct{})}
	p.Cmd = exec.CommandContext(ctx, name, args...)
	p.Cmd.Stdout, p.Cmd.Stderr = &p.Stdout, &p.Stderr
	// Killed if we die without cleaning up (the forking thread stays alive
	// as long as the process does: ns.Do returns it to the scheduler).
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var startErr error
	if err := n.Do(func(ns.NetNS) error {
		startErr = p.Cmd.Start()
		return nil
	}); err != nil {
		return nil, err
	}
	if startErr != nil {
		return nil, fmt.Errorf("start %s: %w", p.Desc, startErr)
	}
	ps.m[p] = struct{}{}
	go func() {
		p.err = p.Cmd.Wait()
		ps.mu.Lock()
		delete(ps.m, p)
		ps.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Err is the process's exit error, once it has exited.
func (p *Proc) Err() error { return p.err }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Pid is the process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Wait waits for the process to exit, killing it after timeout.
func (p *Proc) Wait(timeout time.Duration) error {
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.Cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s: still running after %s, killed\nstdout: %s\nstderr: %s", p.Desc, timeout,
			Tail(p.Stdout.String()), Tail(p.Stderr.String()))
	}
	if p.err != nil {
		return fmt.Errorf("%s: %v\nstdout: %s\nstderr: %s", p.Desc, p.err, Tail(p.Stdout.String()), Tail(p.Stderr.String()))
	}
	return nil
}

// Kill kills the process and waits for it; a no-op once it exited.
func (p *Proc) Kill() {
	_ = p.Cmd.Process.Kill()
	<-p.done
}

// Stop sends SIGTERM and waits up to timeout, then kills.
func (p *Proc) Stop(timeout time.Duration) error {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s: ignored SIGTERM for %s, killed", p.Desc, timeout)
	}
}

// KillAll kills every process still running and waits for them.
func (ps *Procs) KillAll() int {
	ps.mu.Lock()
	var all []*Proc
	for p := range ps.m {
		all = append(all, p)
	}
	ps.mu.Unlock()
	for _, p := range all {
		p.Kill()
	}
	return len(all)
}

// Tail is the last 2000 bytes of s.
func Tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}

// SleepCtx sleeps for d or until ctx is done.
func SleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// WaitListen waits until the process has a listening TCP socket on port,
// read from its own /proc/PID/net/tcp{,6} (its netns's tables), so the server is
// never probed with a connection that would count as its one test.
func WaitListen(p *Proc, port int) error {
	want := fmt.Sprintf(":%04X", port)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before listening: %v\nstdout: %s\nstderr: %s", p.Desc, p.err,
				Tail(p.Stdout.String()), Tail(p.Stderr.String()))
		default:
		}
		for _, table := range []string{"tcp", "tcp6"} {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", p.Cmd.Process.Pid, table))
			if err != nil {
				continue
			}
			sc := bufio.NewScanner(bytes.NewReader(data))
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == "0A" {
					return nil
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s: not listening on port %d after 5 s", p.Desc, port)
}
