package datapath

import (
	"context"
	"os"
	"testing"
	"time"
)

// The locks between the verbs and the agent, on a plain directory (flock
// works on any directory; no bpffs or root needed).
func TestLocks(t *testing.T) {
	pin := t.TempDir()
	if AgentAlive(pin) {
		t.Fatal("agent alive with no lock directory")
	}
	if _, err := TryMarkBusy(pin); err == nil {
		t.Fatal("busy lock taken with no lock directory (verbs must not create it)")
	}
	MarkBusy(pin)() // never fails

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := HoldAgent(ctx, pin, nil); err != nil {
		t.Fatal(err)
	}
	if !AgentAlive(pin) {
		t.Fatal("agent lock held, AgentAlive false")
	}
	// A second agent waits for the first; told once.
	told := 0
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer wcancel()
	if _, err := HoldAgent(wctx, pin, func() { told++ }); err == nil || told != 1 {
		t.Fatalf("second agent: %v, told %d times; want to wait (told once) until its context ends", err, told)
	}

	idle, err := OpenIdle(pin, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if err := idle.Wait(ctx); err != nil {
		t.Fatalf("no verb runs, Wait: %v", err)
	}
	release, err := TryMarkBusy(pin)
	if err != nil {
		t.Fatal(err)
	}
	second := MarkBusy(pin) // verbs share the lock
	short, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer scancel()
	if err := idle.Wait(short); err == nil {
		t.Fatal("Wait returned while a verb runs")
	}
	// A verb that never ends holds the agent up for maxWait at most.
	idle.maxWait = 150 * time.Millisecond
	t0 := time.Now()
	if err := idle.Wait(ctx); err != nil || time.Since(t0) < 150*time.Millisecond {
		t.Fatalf("Wait with a verb running: %v after %s, want nil after the bound", err, time.Since(t0))
	}
	idle.maxWait = 0
	release()
	done := make(chan error, 1)
	go func() { done <- idle.Wait(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("Wait returned (%v) while the second verb runs", err)
	case <-time.After(50 * time.Millisecond):
	}
	second()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Wait still waiting after every verb ended")
	}
	// Wait let go of the lock: a verb can take it at once.
	r, err := TryMarkBusy(pin)
	if err != nil {
		t.Fatalf("verb after Wait: %v", err)
	}
	r()

	unlock, err := LockLinks(pin)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{})
	go func() {
		u, err := LockLinks(pin)
		if err == nil {
			u()
		}
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("links lock taken twice")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	<-got
}

// TestLockNetns: a pod netns's lock (LockNetns) is exclusive per stripe,
// waits at most its bound, and a verb with no lock directory (no datapath,
// or an uninstall removing it) makes none.
func TestLockNetns(t *testing.T) {
	pin := t.TempDir()
	if r := LockNetns(pin, 7, time.Second); r != nil {
		t.Fatal("netns lock taken with no lock directory")
	}
	if _, err := os.Stat(lockPath(pin, "")); !os.IsNotExist(err) {
		t.Fatalf("LockNetns made the lock directory: %v", err)
	}
	if err := ensureLocks(pin); err != nil {
		t.Fatal(err)
	}
	first := LockNetns(pin, 7, time.Second)
	if first == nil {
		t.Fatal("netns lock not taken")
	}
	t0 := time.Now()
	if r := LockNetns(pin, 7+netnsLockStripes, 100*time.Millisecond); r != nil || time.Since(t0) < 100*time.Millisecond {
		t.Fatalf("same stripe while held: got the lock %v after %v; want none after the bound", r != nil, time.Since(t0))
	}
	other := LockNetns(pin, 8, 0)
	if other == nil {
		t.Fatal("another stripe's lock not taken beside the first")
	}
	other()
	first()
	if r := LockNetns(pin, 7, 0); r == nil {
		t.Fatal("netns lock not taken once released")
	} else {
		r()
	}
}
