package datapath

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The locks between the CNI verbs and the agent are flocks on directories
// under <pinDir>/locks (bpffs holds no regular files; a directory fd
// carries a flock). A lock goes with the process holding it, killed or not.
//
//   - agent: held exclusive by `ebpf-agent run` for its whole life. A verb
//     that finds it held (AgentAlive) leaves the work that waits out RCU
//     grace periods under RTNL to the agent: ADD attaches cls_bpf filters
//     that the agent later moves to tcx links, DEL hands the veth off for
//     the agent to delete.
//   - busy: held shared by every ADD, DEL and CHECK while it runs, never
//     waited for (a verb that cannot take it runs anyway). The agent starts
//     each piece of that background work only when it can take the lock
//     exclusive (WaitIdle), so it never holds RTNL while a verb wants it.
//   - links: serialises what binds a host veth's name to its link pins:
//     DEL's hand-off (pins and veth renamed), the agent pinning tcx links
//     of a veth it found under that name, Upgrade, and the looks that pair
//     pins with veths and removes what they find (ForOrphanVethLinkPins,
//     endpoint.ListHandedOff), and (shared) ADD's tcx attach and pinning.
//   - uninstall: held exclusive by `ebpf-agent uninstall` while it runs
//     (HoldUninstall). An ADD that has claimed its attachment refuses when
//     it finds it held (Uninstalling); one that claimed before is found by
//     the uninstall's look at the records. A second uninstall is refused.
//   - netns/<stripe>: a pod netns's (LockNetns): a DEL's look at the pod's
//     other interfaces until its veth is gone, an ADD's netns entry.
const (
	lockAgent     = "agent"
	lockBusy      = "busy"
	lockLinks     = "links"
	lockUninstall = "uninstall"
)

// openLock opens a lock directory; create makes it when missing (the
// datapath's setup, the agent), else a missing one is os.ErrNotExist.
func openLock(pinRoot, name string, create bool) (int, error) {
	path := lockPath(pinRoot, name)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) && create {
		if err := os.MkdirAll(path, 0o700); err != nil {
			return -1, fmt.Errorf("create lock directory %s: %w", path, err)
		}
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return -1, os.ErrNotExist
		}
		return -1, fmt.Errorf("open lock %s: %w", path, err)
	}
	return fd, nil
}

// ensureLocks creates the lock directories (the datapath's setup).
func ensureLocks(pinRoot string) error {
	for _, n := range []string{lockAgent, lockBusy, lockLinks} {
		fd, err := openLock(pinRoot, n, true)
		if err != nil {
			return err
		}
		unix.Close(fd)
	}
	return nil
}

// AgentAlive tells whether an agent holds the node's agent lock.
func AgentAlive(pinRoot string) bool {
	fd, err := openLock(pinRoot, lockAgent, false)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return errors.Is(unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB), unix.EWOULDBLOCK)
}

// HoldAgent takes the agent lock until release (the agent: for the life of
// the process, the lock going with it); waiting is called once if another
// agent holds it, and HoldAgent then waits for it (or ctx) to end.
func HoldAgent(ctx context.Context, pinRoot string, waiting func()) (release func(), err error) {
	fd, err := openLock(pinRoot, lockAgent, true)
	if err != nil {
		return nil, err
	}
	told := false
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			var once sync.Once
			return func() { once.Do(func() { unix.Close(fd) }) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			unix.Close(fd)
			return nil, fmt.Errorf("lock %s: %w", lockPath(pinRoot, lockAgent), err)
		}
		if !told && waiting != nil {
			waiting()
			told = true
		}
		select {
		case <-ctx.Done():
			unix.Close(fd)
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// MarkBusy tells the agent a CNI verb is running, until release (or the
// process's end). It never blocks and never fails the verb: without the
// lock (no datapath yet, the agent just testing it) the verb runs anyway.
func MarkBusy(pinRoot string) (release func()) {
	release, err := TryMarkBusy(pinRoot)
	if err != nil {
		return func() {}
	}
	return release
}

// TryMarkBusy is MarkBusy that says why it could not take the lock.
func TryMarkBusy(pinRoot string) (release func(), err error) {
	fd, err := openLock(pinRoot, lockBusy, false)
	if err != nil {
		return nil, err
	}
	// The agent holds the lock exclusive only for the instant of its test
	// (Idle.Wait): a verb meeting that instant tries again.
	for try := 0; ; try++ {
		err = unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Close(fd) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || try == 100 {
			unix.Close(fd)
			return nil, fmt.Errorf("lock %s: %w", lockPath(pinRoot, lockBusy), err)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// Idle is the agent's side of the busy lock.
type Idle struct {
	fd      int
	maxWait time.Duration // 0: MaxPoliteWait
}

// OpenIdle opens the busy lock for Wait; maxWait bounds each Wait (0:
// MaxPoliteWait).
func OpenIdle(pinRoot string, maxWait time.Duration) (*Idle, error) {
	fd, err := openLock(pinRoot, lockBusy, true)
	if err != nil {
		return nil, err
	}
	return &Idle{fd: fd, maxWait: maxWait}, nil
}

// MaxPoliteWait bounds Wait: a verb that never ends (an IPAM plugin hung,
// say) or verbs that never pause must not keep the agent from its work for
// good; after this long it does one step anyway.
const MaxPoliteWait = 5 * time.Second

// Wait returns once no verb runs (or after MaxPoliteWait), or when ctx
// ends. It polls (a verb is never made to wait for the agent), and takes
// the lock exclusive only to test it, letting go at once, so a verb
// starting right after is not held up.
func (i *Idle) Wait(ctx context.Context) error {
	delay := time.Millisecond
	deadline := time.Now().Add(i.max())
	for {
		if unix.Flock(i.fd, unix.LOCK_EX|unix.LOCK_NB) == nil {
			unix.Flock(i.fd, unix.LOCK_UN)
			return nil
		}
		if time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		if delay < 10*time.Millisecond {
			delay *= 2
		}
	}
}

func (i *Idle) max() time.Duration {
	if i.maxWait > 0 {
		return i.maxWait
	}
	return MaxPoliteWait
}

// Close releases the lock's fd.
func (i *Idle) Close() { unix.Close(i.fd) }

// LockLinks takes the links lock (see above) until unlock.
func LockLinks(pinRoot string) (unlock func(), err error) {
	return lockLinksHow(pinRoot, unix.LOCK_EX)
}

// lockLinksShared takes the links lock shared: for ADD's attach, which
// binds a name no other ADD has (its own host veth's), so ADDs go on
// together and wait only for the exclusive holders.
func lockLinksShared(pinRoot string) (unlock func(), err error) {
	return lockLinksHow(pinRoot, unix.LOCK_SH)
}

func lockLinksHow(pinRoot string, how int) (unlock func(), err error) {
	fd, err := openLock(pinRoot, lockLinks, true)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(fd, how); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", lockPath(pinRoot, lockLinks), err)
	}
	return func() { unix.Close(fd) }, nil
}

// LockLinksIfPresent is LockLinks where the pin directory has the lock
// (its datapath was set up); elsewhere nothing can hand a veth off or pin
// its links, and unlock does nothing. It creates nothing.
func LockLinksIfPresent(pinRoot string) (unlock func(), err error) {
	fd, err := openLock(pinRoot, lockLinks, false)
	if errors.Is(err, os.ErrNotExist) {
		return func() {}, nil
	}
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", lockPath(pinRoot, lockLinks), err)
	}
	return func() { unix.Close(fd) }, nil
}

// ErrUninstallRunning: another uninstall holds the pin directory.
var ErrUninstallRunning = errors.New("another ebpf-agent uninstall runs on this pin directory")

// HoldUninstall takes the uninstall lock of an existing pin directory
// (a missing one has nothing to guard: release is a no-op). release drops
// it; with remove, its directory goes too (an uninstall that changed
// nothing leaves nothing).
func HoldUninstall(pinRoot string) (release func(remove bool), err error) {
	if _, err := os.Stat(pinRoot); errors.Is(err, os.ErrNotExist) {
		return func(bool) {}, nil
	}
	_, statErr := os.Stat(lockPath(pinRoot, lockUninstall))
	made := errors.Is(statErr, os.ErrNotExist)
	fd, err := openLock(pinRoot, lockUninstall, true)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrUninstallRunning
		}
		return nil, fmt.Errorf("lock %s: %w", lockPath(pinRoot, lockUninstall), err)
	}
	return func(remove bool) {
		if remove && made {
			unix.Rmdir(lockPath(pinRoot, lockUninstall))
		}
		unix.Close(fd)
	}, nil
}

// Uninstalling tells whether an uninstall holds the pin directory.
func Uninstalling(pinRoot string) bool {
	fd, err := openLock(pinRoot, lockUninstall, false)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return errors.Is(unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB), unix.EWOULDBLOCK)
}

// netnsLockStripes is how many locks the pods' netns share (LockNetns):
// two pods' verbs meet on one only when their nsfs inodes agree modulo it
// (consecutive netns have consecutive inodes), and then wait tens of
// milliseconds, never for each other's work.
const netnsLockStripes = 1024

// LockNetns takes the lock of the pod netns whose nsfs inode is ino: an
// exclusive flock on <pinDir>/locks/netns/<ino mod netnsLockStripes>,
// waiting at most wait; release drops it (nil when not had: no datapath
// set up, so no netns entry to guard, or a holder past wait). The pod's
// own nsfs inode is not the lock: any process in the pod opens
// /proc/self/ns/net and could hold that flock (attack30: every verb of the
// pod waited 5 s, then went on without the lock); this directory is the
// node's root's only.
func LockNetns(pinRoot string, ino uint64, wait time.Duration) (release func()) {
	path := lockPath(pinRoot, fmt.Sprintf("netns/%03x", ino%netnsLockStripes))
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		// Made here, below an existing locks directory only: a DEL
		// after (or beside) an uninstall makes no pin directory again.
		_ = os.Mkdir(filepath.Dir(path), 0o700)
		_ = os.Mkdir(path, 0o700)
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil
	}
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Close(fd) }
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) || time.Now().After(deadline) {
			unix.Close(fd)
			return nil
		}
		time.Sleep(time.Millisecond)
	}
}
