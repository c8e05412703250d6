// Package safedir keeps the directories ebpf-cni and its agent act on out of
// other users' hands. Whoever can write to a pin directory can swap the
// programs every pod's packets run; whoever can write to the state directory
// can plant a record (DEL and GC act on records) or a symlink a record write
// would follow. So a directory is used only when it, and every directory
// above it, is writable by nobody but root or us, and files are written
// through a fresh temp file that is never a symlink.
package safedir

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrExist is returned by Claim when the file already exists.
var ErrExist = os.ErrExist

// Check refuses dir unless it is owned by us and writable by nobody else, and
// every existing directory above it is owned by root or us and not writable
// by group or others (a sticky one, like /tmp, may be: others can neither
// rename nor remove what we own in it). Missing components pass: MkdirAll
// creates them 0700. Symlinks on the way are followed and their targets
// checked the same way.
func Check(dir string) error {
	return check(dir, dir, 0)
}

func check(orig, path string, depth int) error {
	if depth > 8 {
		return fmt.Errorf("%s: too many levels of symlinks", orig)
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%s is not an absolute path", path)
	}
	path = filepath.Clean(path)
	cur := "/"
	if err := checkOne(orig, cur, path == "/"); err != nil {
		return err
	}
	if path == "/" {
		return nil
	}
	comps := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i, c := range comps {
		next := filepath.Join(cur, c)
		last := i == len(comps)-1
		var st unix.Stat_t
		if err := unix.Lstat(next, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil // created by us, 0700
			}
			return fmt.Errorf("stat %s: %w", next, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			if err := owner(orig, next, &st, false); err != nil {
				return err
			}
			target, err := filepath.EvalSymlinks(next)
			if err != nil {
				return fmt.Errorf("resolve %s: %w", next, err)
			}
			rest := filepath.Join(append([]string{target}, comps[i+1:]...)...)
			return check(orig, rest, depth+1)
		case unix.S_IFDIR:
			if err := checkOne(orig, next, last); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s is not a directory", next)
		}
		cur = next
	}
	return nil
}

func checkOne(orig, path string, final bool) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if err := owner(orig, path, &st, final); err != nil {
		return err
	}
	if st.Mode&0o022 == 0 {
		return nil
	}
	if final {
		return fmt.Errorf("%s is writable by group or others (mode %o): refusing to use it", path, st.Mode&0o7777)
	}
	if st.Mode&unix.S_ISVTX != 0 {
		return nil
	}
	return fmt.Errorf("%s, a parent of %s, is writable by group or others (mode %o): refusing to use it", path, orig, st.Mode&0o7777)
}

func owner(orig, path string, st *unix.Stat_t, final bool) error {
	me := uint32(os.Geteuid())
	if st.Uid == me || (!final && st.Uid == 0) {
		return nil
	}
	if final {
		return fmt.Errorf("%s is owned by uid %d, not %d: refusing to use it", path, st.Uid, me)
	}
	return fmt.Errorf("%s, a parent of %s, is owned by uid %d, not root or %d: refusing to use it", path, orig, st.Uid, me)
}

// MkdirAll creates dir and its missing parents 0700 and checks the result as
// Check does (also after creating, so a directory someone else slipped in
// first is refused, not used).
func MkdirAll(dir string) error {
	if err := Check(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return Check(dir)
}

func tempName(name string) string {
	b := make([]byte, 8)
	rand.Read(b)
	return "." + name + "." + hex.EncodeToString(b) + ".tmp"
}

// createTemp creates a fresh temp file in dir with O_EXCL|O_NOFOLLOW, so it is
// never an existing file or a symlink someone planted, and writes data.
func createTemp(dirfd int, dir, name string, data []byte) (*os.File, string, error) {
	tmp := tempName(name)
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("create %s: %w", filepath.Join(dir, tmp), err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, tmp))
	if _, err := f.Write(data); err != nil {
		f.Close()
		unix.Unlinkat(dirfd, tmp, 0)
		return nil, "", fmt.Errorf("write %s: %w", f.Name(), err)
	}
	return f, tmp, nil
}

func openDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", dir, err)
	}
	return fd, nil
}

// createAnon creates an unnamed file in dir (O_TMPFILE) holding data: a
// process killed before it is linked leaves nothing behind, where a named
// temp file stays until GC (StaleTempAge). ok false where the filesystem
// or kernel has no O_TMPFILE: the caller uses a named temp file.
func createAnon(dirfd int, dir string, data []byte) (f *os.File, ok bool, err error) {
	fd, err := unix.Openat(dirfd, ".", unix.O_WRONLY|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EINVAL) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("create a file in %s: %w", dir, err)
	}
	f = os.NewFile(uintptr(fd), dir)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, false, fmt.Errorf("write a file in %s: %w", dir, err)
	}
	return f, true, nil
}

// linkAnon gives f, made by createAnon, the name name in dirfd; like
// link(2) it fails on any existing name. Through /proc/self/fd, which
// needs no capability (AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH).
func linkAnon(f *os.File, dirfd int, name string) error {
	return unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", f.Fd()), dirfd, name, unix.AT_SYMLINK_FOLLOW)
}

// WriteFile replaces dir/name with data atomically: a new file, renamed
// over the old name (rename replaces a symlink, never follows it). The new
// file is unnamed until the step before the rename (createAnon), so a kill
// leaves a temp file only between those two calls.
func WriteFile(dir, name string, data []byte) error {
	dirfd, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	var tmp string
	f, ok, err := createAnon(dirfd, dir, data)
	if err != nil {
		return err
	}
	if ok {
		tmp = tempName(name)
		err = linkAnon(f, dirfd, tmp)
		f.Close()
		if err != nil {
			return fmt.Errorf("create %s: %w", filepath.Join(dir, tmp), err)
		}
	} else {
		if f, tmp, err = createTemp(dirfd, dir, name, data); err != nil {
			return err
		}
		f.Close()
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, name); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return fmt.Errorf("rename %s to %s: %w", tmp, filepath.Join(dir, name), err)
	}
	return nil
}

// Claim creates dir/name with data only if nothing of that name exists
// (ErrExist otherwise), and returns it open with an exclusive flock held:
// whoever finds the file can tell, with Locked, whether its creator is still
// at work. The lock goes when the file is closed or the process dies. The
// file has no other name at any time (createAnon): a claim killed before
// it is linked leaves nothing (TestReviewKilledFirstAdd's 5 ms kill found
// a named temp file left there).
func Claim(dir, name string, data []byte) (*os.File, error) {
	dirfd, err := openDir(dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dirfd)
	f, ok, err := createAnon(dirfd, dir, data)
	if err != nil {
		return nil, err
	}
	tmp := ""
	if !ok {
		if f, tmp, err = createTemp(dirfd, dir, name, data); err != nil {
			return nil, err
		}
	}
	// Locked before it is visible under its name: nobody sees it unlocked.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		if tmp != "" {
			unix.Unlinkat(dirfd, tmp, 0)
		}
		return nil, fmt.Errorf("lock %s: %w", filepath.Join(dir, name), err)
	}
	// link(2) fails on any existing name, a symlink included.
	if tmp != "" {
		err = unix.Linkat(dirfd, tmp, dirfd, name, 0)
		unix.Unlinkat(dirfd, tmp, 0)
	} else {
		err = linkAnon(f, dirfd, name)
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EEXIST) {
			return nil, ErrExist
		}
		return nil, fmt.Errorf("create %s: %w", filepath.Join(dir, name), err)
	}
	return f, nil
}

// ReadFile reads a regular file without following a symlink in its place.
func ReadFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%s is a symlink: refusing to follow it", path)
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return io.ReadAll(f)
}

// Locked tells whether someone holds the flock Claim took on path.
func Locked(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	return false, err
}

// TryLock takes the exclusive flock of the file at path without waiting
// and returns it open, with the file's bytes as read under the lock; nil,
// nil, nil when someone else holds it. The caller checks the bytes: path
// may have been replaced since (by a rename), so what it opened is
// compared with what path names now, and a file no longer under path is
// ErrNotExist.
func TryLock(path string) (*os.File, []byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("lock %s: %w", path, err)
	}
	var held, named unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &held); err != nil {
		f.Close()
		return nil, nil, err
	}
	if err := unix.Lstat(path, &named); err != nil || named.Ino != held.Ino || named.Dev != held.Dev {
		f.Close()
		return nil, nil, fmt.Errorf("%s was replaced while being locked: %w", path, os.ErrNotExist)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, b, nil
}
