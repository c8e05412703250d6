package datapath

import (
	"testing"
	"time"
)

// ADDs attach under the links lock shared: two at once do not wait for
// each other; an exclusive holder (GC's orphan removal, an upgrade, a
// hand-off) waits for them, and they for it.
func TestLinksLockSharedByADDs(t *testing.T) {
	pin := t.TempDir()
	must(t, ensureLocks(pin))
	a, err := lockLinksShared(pin)
	must(t, err)
	got := make(chan func(), 1)
	go func() {
		b, err := lockLinksShared(pin)
		if err != nil {
			t.Error(err)
			b = func() {}
		}
		got <- b
	}()
	select {
	case b := <-got:
		b()
	case <-time.After(2 * time.Second):
		t.Fatal("a second ADD's shared hold waited for the first")
	}
	ex := make(chan func(), 1)
	go func() {
		u, err := LockLinks(pin)
		if err != nil {
			t.Error(err)
			u = func() {}
		}
		ex <- u
	}()
	select {
	case u := <-ex:
		u()
		t.Fatal("the exclusive hold did not wait for an ADD's")
	case <-time.After(200 * time.Millisecond):
	}
	a()
	select {
	case u := <-ex:
		u()
	case <-time.After(2 * time.Second):
		t.Fatal("the exclusive hold still waits after the ADD let go")
	}
}
