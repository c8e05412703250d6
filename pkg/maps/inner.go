package maps

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The tables of the maps of maps (cni_stack_flow_parts, cni_pol_ct_parts,
// cni_pol_frag_parts) are pinned where they are made, at
// <maps dir>/tables/<outer>/<key in hex>: an outer map yields only a
// table's ID, and opening a map by ID (BPF_MAP_GET_FD_BY_ID) needs
// CAP_SYS_ADMIN, which the DaemonSet's agent lacks. Opening a pin needs
// only access to bpffs. The per-packet path is untouched: programs still
// look the table up in the outer map.

// innerDir is the directory of the pins of outer's tables under dir.
func innerDir(dir, outer string) string { return filepath.Join(dir, "tables", outer) }

// innerPin is the pin path of outer's table at key (the raw key bytes).
func innerPin(dir, outer string, key []byte) string {
	return filepath.Join(innerDir(dir, outer), hex.EncodeToString(key))
}

// keyBytes is a fixed-size key as the kernel sees it.
func keyBytes(k any) []byte {
	var b bytes.Buffer
	if err := binary.Write(&b, binary.NativeEndian, k); err != nil {
		panic(fmt.Sprintf("key %T of a map of maps: %v", k, err)) // fixed-size by construction
	}
	return b.Bytes()
}

// putInner pins inner and stores it in outer at key (flags: ebpf.UpdateAny
// or UpdateNoExist). The pin replaces any earlier table's; when the update
// fails, the pin goes again unless another table is in place. Under the
// tables' lock: an ADD's table and the agent's (EnsureStackFlowPart) racing
// for one key could otherwise leave the pin of the one that lost.
func (m *Maps) putInner(outerName string, key any, inner *ebpf.Map, flags ebpf.MapUpdateFlags) error {
	kb := keyBytes(key)
	p := innerPin(m.dir, outerName, kb)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("create the pin directory of %s's tables: %w", outerName, err)
	}
	unlock, err := innerLock(m.dir, true)
	if err != nil {
		return err
	}
	defer unlock()
	outer := m.get(outerName)
	if outerName == nameStackFlowParts {
		// Before the table is there: the programs look the map up
		// again (SyncNoParts sets the flag only under this lock).
		if err := m.setConfigFlags(hpConfigSFNoParts, false); err != nil {
			return err
		}
	}
	if flags == ebpf.UpdateNoExist {
		// Someone else's table may be in place and pinned: pin only ours.
		if err := outer.Update(kb, inner, flags); err != nil {
			return err
		}
		return replacePin(inner, p)
	}
	if err := replacePin(inner, p); err != nil {
		return err
	}
	if err := outer.Update(kb, inner, flags); err != nil {
		os.Remove(p)
		return err
	}
	return nil
}

// replacePin pins mp at p, over whatever was pinned there.
func replacePin(mp *ebpf.Map, p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the stale table pin %s: %w", p, err)
	}
	if mp.IsPinned() {
		// Pin would move that pin (a table of an older layout's
		// directory): pin a second handle instead.
		c, err := mp.Clone()
		if err != nil {
			return fmt.Errorf("pin a table at %s: %w", p, err)
		}
		defer c.Close()
		mp = c
	}
	if err := mp.Pin(p); err != nil {
		return fmt.Errorf("pin a table at %s: %w", p, err)
	}
	return nil
}

// unpinInner removes the pin of outer's table at key (after the entry).
func (m *Maps) unpinInner(outerName string, key any) error {
	kb := keyBytes(key)
	p := innerPin(m.dir, outerName, kb)
	unlock, err := innerLock(m.dir, true)
	if err != nil {
		return err
	}
	defer unlock()
	var id uint32
	if err := m.get(outerName).Lookup(kb, &id); err == nil {
		return nil // a new table at key since (a re-ADD): its pin stays
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the table pin %s: %w", p, err)
	}
	return nil
}

// ErrInnerUnreachable: a table of a map of maps has no pin (made by a
// build that did not pin them) and this process may not open it by ID.
var ErrInnerUnreachable = errors.New("table not pinned (made by an older build) and opening a map by ID needs CAP_SYS_ADMIN")

// innerLock takes an exclusive flock on the pin directory of the tables
// under dir (created when create), for changes of an entry and its pin
// together; a separate inode from the maps directory's lock (Maps.lock), so
// neither waits on the other. Without create and no directory, there is
// nothing to lock (no pins: a layout made before them).
func innerLock(dir string, create bool) (func(), error) {
	td := filepath.Join(dir, "tables")
	if create {
		if err := os.MkdirAll(td, 0o700); err != nil {
			return nil, fmt.Errorf("create the pin directory of the tables %s: %w", td, err)
		}
	}
	fd, err := unix.Open(td, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s for locking: %w", td, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", td, err)
	}
	return func() { unix.Close(fd) }, nil
}

// loadInnerPin opens the pin at p if it holds table id.
func loadInnerPin(p string, id ebpf.MapID) (*ebpf.Map, bool, error) {
	t, err := loadPinnedMap(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("open the table pin %s: %w", p, err)
	}
	if got, ierr := mapID(t); ierr == nil && got == id {
		return t, true, nil
	}
	t.Close()
	return nil, false, nil
}

// mapID is m's ID from BPF_OBJ_GET_INFO_BY_FD alone (the kernel fills as
// much of bpf_map_info as info_len asks for): Map.Info also reads and parses
// /proc/self/fdinfo, and a DEL opens every taken stack-flow table (issue 30).
func mapID(m *ebpf.Map) (ebpf.MapID, error) {
	var info struct{ typ, id uint32 }
	attr := struct {
		fd      uint32
		infoLen uint32
		info    uint64
	}{fd: uint32(m.FD()), infoLen: uint32(unsafe.Sizeof(info)), info: uint64(uintptr(unsafe.Pointer(&info)))}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET_INFO_BY_FD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(&info)
	runtime.KeepAlive(m)
	if errno != 0 {
		return 0, fmt.Errorf("map info: %w", errno)
	}
	return ebpf.MapID(info.id), nil
}

// openInner opens the table the outer map outerName lists at key with id:
// by its pin under dir, else (a table made before pins) by ID, which needs
// CAP_SYS_ADMIN. A pin that does not hold id is looked at again under the
// tables' lock with the outer map's current entry (a writer was between
// the entry and the pin). A table gone meanwhile is os.ErrNotExist.
func openInner(dir string, outer *ebpf.Map, outerName string, key []byte, id ebpf.MapID) (*ebpf.Map, error) {
	p := innerPin(dir, outerName, key)
	if t, ok, err := loadInnerPin(p, id); ok || err != nil {
		return t, err
	}
	if unlock, err := innerLock(dir, false); err == nil {
		var cur uint32
		err := outer.Lookup(key, &cur)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			unlock()
			return nil, os.ErrNotExist
		}
		if err == nil {
			id = ebpf.MapID(cur)
		}
		t, ok, err := loadInnerPin(p, id)
		unlock()
		if ok || err != nil {
			return t, err
		}
	}
	t, err := ebpf.NewMapFromID(id)
	if errors.Is(err, os.ErrPermission) {
		return nil, fmt.Errorf("open the table of %s at key %x (map %d): %w", outerName, key, id, ErrInnerUnreachable)
	}
	return t, err
}

// innerEntry is one entry of a map of maps.
type innerEntry struct {
	key []byte
	id  ebpf.MapID
}

// innerEntries lists outer's entries.
func innerEntries(outer *ebpf.Map, name string) ([]innerEntry, error) {
	var (
		out []innerEntry
		id  uint32
	)
	k := make([]byte, outer.KeySize())
	it := outer.Iterate()
	for it.Next(&k, &id) {
		out = append(out, innerEntry{append([]byte(nil), k...), ebpf.MapID(id)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("scan %s: %w", name, err)
	}
	return out, nil
}

// eachInner calls fn with every table of outerName (opened by pin, closed
// after fn); tables dropped meanwhile are skipped, any other failure to
// open one is an error (never a silent skip).
func (m *Maps) eachInner(outerName string, fn func(key []byte, t *ebpf.Map) error) error {
	es, err := innerEntries(m.get(outerName), outerName)
	if err != nil {
		return err
	}
	for _, e := range es {
		t, err := openInner(m.dir, m.get(outerName), outerName, e.key, e.id)
		if errors.Is(err, os.ErrNotExist) {
			continue // dropped meanwhile
		}
		if err != nil {
			return err
		}
		err = fn(e.key, t)
		t.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// StaleTablePins lists the table pins that hold no table of their outer
// map (a process killed between a table's entry and its pin: the pin
// would keep the table's memory for good).
func (m *Maps) StaleTablePins() ([]string, error) {
	var out []string
	for outerName := range innerSpecs {
		ents, err := os.ReadDir(innerDir(m.dir, outerName))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list the table pins of %s: %w", outerName, err)
		}
		for _, e := range ents {
			kb, err := hex.DecodeString(e.Name())
			if err != nil || len(kb) != int(m.get(outerName).KeySize()) || !m.pinCurrent(outerName, kb) {
				out = append(out, filepath.Join(innerDir(m.dir, outerName), e.Name()))
			}
		}
	}
	return out, nil
}

// pinCurrent: the pin of outer's table at key holds the table the outer
// map has there.
func (m *Maps) pinCurrent(outerName string, key []byte) bool {
	var id uint32
	if err := m.get(outerName).Lookup(key, &id); err != nil {
		return false
	}
	t, ok, _ := loadInnerPin(innerPin(m.dir, outerName, key), ebpf.MapID(id))
	if ok {
		t.Close()
	}
	return ok
}

// RemoveStaleTablePin removes the pin p (of StaleTablePins) if it is
// still stale, under the tables' lock (a verb may have put a table there
// since).
func (m *Maps) RemoveStaleTablePin(p string) error {
	unlock, err := innerLock(m.dir, true)
	if err != nil {
		return err
	}
	defer unlock()
	outerName := filepath.Base(filepath.Dir(p))
	if kb, err := hex.DecodeString(filepath.Base(p)); err == nil && m.get(outerName) != nil &&
		len(kb) == int(m.get(outerName).KeySize()) && m.pinCurrent(outerName, kb) {
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the stale table pin %s: %w", p, err)
	}
	return nil
}
