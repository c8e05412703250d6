package netpol

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/safedir"
)

// watchRecords calls changed whenever an attachment record under stateDir
// is written into place or removed (every network's directory, including
// those created later), so a new pod is programmed as soon as its ADD
// commits its record rather than at the next resync. It returns when ctx
// ends, or at once with an error when inotify is not available.
func watchRecords(ctx context.Context, stateDir string, changed func()) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "inotify") // the runtime poller wakes Read
	defer f.Close()
	go func() {
		<-ctx.Done()
		f.Close()
	}()
	const recordMask = unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_Q_OVERFLOW
	dirs := map[int32]string{}
	watch := func(dir string, mask uint32) {
		if wd, err := unix.InotifyAddWatch(fd, dir, mask|unix.IN_ONLYDIR); err == nil {
			dirs[int32(wd)] = dir
		}
	}
	// The plugin creates it at the first ADD; created now (as it would
	// be), it can be watched from the start.
	if err := safedir.MkdirAll(stateDir); err != nil {
		return err
	}
	watch(stateDir, unix.IN_CREATE|unix.IN_MOVED_TO)
	ents, _ := os.ReadDir(stateDir)
	for _, e := range ents {
		if e.IsDir() {
			watch(filepath.Join(stateDir, e.Name()), recordMask)
		}
	}
	changed() // whatever was written before the watches
	buf := make([]byte, 64*1024)
	for {
		n, err := f.Read(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, os.ErrClosed) {
				return nil
			}
			return err
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				for i, c := range raw {
					if c == 0 {
						raw = raw[:i]
						break
					}
				}
				name = string(raw)
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if dir, ok := dirs[ev.Wd]; ok && dir == stateDir && ev.Mask&unix.IN_ISDIR != 0 && name != "" {
				watch(filepath.Join(stateDir, name), recordMask) // a new network
			}
		}
		changed()
	}
}
