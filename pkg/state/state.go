// Package state owns what ebpf-cni keeps on disk per attachment: the record
// ADD writes so DEL, GC, CHECK and the agent can find and undo an attachment
// without prevResult, netns or veth, and the host veth's name, which DEL
// derives with no state at all. It is the one parser of records: the plugin,
// the agent and the tests read them through it.
//
// Layout: <stateDir>/<network>/<containerID>_<ifname>.json, one file per
// attachment, written through safedir (no symlink is ever followed, every
// write is a fresh temp file renamed into place).
package state

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/safedir"
)

// DefaultDir keeps one record per attachment; it survives reboots like
// host-local's reservations, so GC after a reboot can release them.
const DefaultDir = "/var/lib/cni/ebpf-cni"

// Record is what ADD leaves on disk for one attachment.
//
// ADD claims the attachment with a provisional record before it creates
// anything (veth, IPAM reservation, map entries) and holds an flock on it
// while it works; the complete record replaces it at the end. A provisional
// record nobody holds is what a killed ADD left: DEL, GC and the agent's
// reconcile tear it down. A second ADD of the same attachment finds the
// record and is refused before it touches anything.
type Record struct {
	ContainerID  string   `json:"containerID"`
	IfName       string   `json:"ifname"`
	Netns        string   `json:"netns"`
	HostIf       string   `json:"hostIf"`
	HostIfindex  int      `json:"hostIfindex"`
	HostMAC      string   `json:"hostMAC"`
	PodMAC       string   `json:"podMAC"`
	IPs          []string `json:"ips"`
	NetnsCookie  uint64   `json:"netnsCookie,omitempty"`
	PodNamespace string   `json:"podNamespace,omitempty"`
	PodName      string   `json:"podName,omitempty"`
	// HostPorts are the pod's hostPort map entries; nil when it has none.
	HostPorts []HostPort `json:"hostPorts,omitempty"`
	// Masq: the pod's traffic is masqueraded (DEL purges its cni_snat entries).
	Masq bool `json:"masq,omitempty"`
	// Policy: the interface has networkPolicy (a state in cni_pol_state).
	Policy bool `json:"policy,omitempty"`
	// PodTable is the routing table of the interface inside the pod; DEL
	// removes the pod's rules that point at it. 0 in records of builds
	// before per-interface tables.
	PodTable int `json:"podTable,omitempty"`

	// Provisional: written by an ADD that has not finished (or was killed).
	Provisional bool `json:"provisional,omitempty"`
	// Pid of the ADD that wrote a provisional record, for messages.
	Pid int `json:"pid,omitempty"`
	// Created is when ADD claimed the attachment.
	Created time.Time `json:"created,omitzero"`
}

// WriterGone tells whether the process that wrote a provisional record
// is known to have ended: a lock on such a record is then GC's or
// reconcile's, tearing the remains of that ADD down (Hold). A reused pid
// makes it look alive.
func (r Record) WriterGone() bool {
	return r.Pid > 0 && errors.Is(unix.Kill(r.Pid, 0), unix.ESRCH)
}

// HostPort is one hostPort map entry as the record keeps it, for DEL and GC.
type HostPort struct {
	HostIP        string `json:"hostIP,omitempty"`
	IPv6          bool   `json:"ipv6,omitempty"`
	Protocol      string `json:"protocol"`
	HostPort      uint16 `json:"hostPort"`
	PodIP         string `json:"podIP"`
	ContainerPort uint16 `json:"containerPort"`
}

// PodLabel is "namespace/name" when the runtime passed K8S_POD_*, else "".
func (r Record) PodLabel() string {
	if r.PodName == "" {
		return ""
	}
	return r.PodNamespace + "/" + r.PodName
}

// HostIfName is the deterministic host-side veth name of an attachment, so
// DEL finds it with no state: "ebpf" + 11 hex digits (15 chars, IFNAMSIZ-1).
func HostIfName(containerID, ifname string) string {
	h := sha256.Sum256([]byte(containerID + "/" + ifname))
	return "ebpf" + hex.EncodeToString(h[:])[:11]
}

// HostIfPrefix starts every host veth name (see HostIfName).
const HostIfPrefix = "ebpf"

// HandedOffPrefix starts the name of a host veth that DEL handed off to the
// agent (see HandedOffName).
const HandedOffPrefix = "ebpz"

// HandedOffName is what DEL renames a host veth (and its pod end) to when
// it hands the pair off to the agent for deletion: "ebpz" + the host end's
// ifindex, unique on the node while that link exists, so the attachment's
// own name is free at once for a new ADD of the same pod (which may be
// handed off again before the first pair is gone).
func HandedOffName(ifindex int) string { return HandedOffPrefix + strconv.Itoa(ifindex) }

// HandedOffIfindex is the host ifindex a HandedOffName carries.
func HandedOffIfindex(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, HandedOffPrefix)
	if !ok || rest == "" {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n <= 0 || strconv.Itoa(n) != rest {
		return 0, false
	}
	return n, true
}

// Store is the records of one network under a state directory.
type Store struct {
	Root    string // the configured stateDir
	Network string // the network name: a directory under Root
}

// Dir is the directory holding the network's records.
func (s Store) Dir() string { return filepath.Join(s.Root, s.Network) }

// fileName is containerID_ifname.json. The spec puts no limit on the length
// of a container ID, a file name is at most 255 bytes: long IDs are hashed
// (the record inside keeps the real one). So are IDs with a "_", which an
// interface name may hold too: (pod_x, eth0) and (pod, x_eth0) would share
// a file.
func fileName(containerID, ifname string) string {
	if name := legacyFileName(containerID, ifname); name != "" && !strings.Contains(containerID, "_") {
		return name
	}
	h := sha256.Sum256([]byte(containerID))
	return "sha256-" + hex.EncodeToString(h[:]) + "_" + ifname + ".json"
}

// legacyFileName is the name earlier builds gave every record short
// enough, "" for a long one: Read and Remove also look there, and use what
// they find only when the record inside is the attachment's.
func legacyFileName(containerID, ifname string) string {
	if name := containerID + "_" + ifname + ".json"; len(name) <= 200 { // room for the temp file's prefix and suffix
		return name
	}
	return ""
}

// Path is the record file of an attachment.
func (s Store) Path(containerID, ifname string) string {
	return filepath.Join(s.Dir(), fileName(containerID, ifname))
}

// paths are the files that may hold the record of an attachment: its own,
// then the name an earlier build gave it.
func (s Store) paths(containerID, ifname string) []string {
	out := []string{s.Path(containerID, ifname)}
	if l := legacyFileName(containerID, ifname); l != "" && l != fileName(containerID, ifname) {
		out = append(out, filepath.Join(s.Dir(), l))
	}
	return out
}

// owns tells whether r, read from one of an attachment's paths, is that
// attachment's record (and not another's under an ambiguous legacy name).
func owns(r *Record, containerID, ifname string) bool {
	return r.ContainerID == containerID && r.IfName == ifname
}

// ensureDir creates the network's directory when missing; an existing one
// is checked by the caller's safedir.Check (once per verb, not per write).
func (s Store) ensureDir() error {
	dir := s.Dir()
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	return safedir.MkdirAll(dir)
}

// Write writes (or replaces) the record of an attachment.
func (s Store) Write(r *Record) error {
	if err := s.ensureDir(); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := safedir.WriteFile(s.Dir(), fileName(r.ContainerID, r.IfName), b); err != nil {
		return fmt.Errorf("write state record: %w", err)
	}
	return nil
}

// ErrClaimed: a record of the attachment exists already.
var ErrClaimed = errors.New("attachment has a record")

// Claim writes the provisional record of an attachment only if it has none,
// and returns it locked (closing the file releases the lock; so does the
// process dying). ErrClaimed when a record exists.
func (s Store) Claim(r *Record) (*os.File, error) {
	if err := s.ensureDir(); err != nil {
		return nil, err
	}
	// A record an earlier build left under the legacy name claims it too
	// (no build writes that name any more, so it cannot appear after this
	// look): without this, a held or complete one would not stop an ADD.
	for _, p := range s.paths(r.ContainerID, r.IfName)[1:] {
		if old, err := ReadFile(p); err == nil && old != nil && owns(old, r.ContainerID, r.IfName) {
			return nil, ErrClaimed
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	f, err := safedir.Claim(s.Dir(), fileName(r.ContainerID, r.IfName), b)
	if errors.Is(err, safedir.ErrExist) {
		return nil, ErrClaimed
	}
	return f, err
}

// Read returns the record of an attachment; nil, nil when there is none.
func (s Store) Read(containerID, ifname string) (*Record, error) {
	for _, p := range s.paths(containerID, ifname) {
		r, err := ReadFile(p)
		if err != nil {
			return nil, err
		}
		if r != nil && owns(r, containerID, ifname) {
			return r, nil
		}
	}
	return nil, nil
}

// ReadFile reads one record file; nil, nil when it does not exist.
func ReadFile(path string) (*Record, error) {
	b, err := safedir.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := &Record{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("decode state record %s: %w", path, err)
	}
	return r, nil
}

// Busy tells whether an ADD is still working on a provisional record.
func (s Store) Busy(r *Record) bool {
	if !r.Provisional {
		return false
	}
	return s.held(r.ContainerID, r.IfName)
}

// held tells whether a file of the attachment's names holding its record
// is locked: an ADD at work, or GC holding a dead one's claim (Hold), which
// may sit under the legacy name an earlier build gave it.
func (s Store) held(containerID, ifname string) bool {
	for _, p := range s.paths(containerID, ifname) {
		if locked, err := safedir.Locked(p); err != nil || !locked {
			continue
		}
		if r, err := ReadFile(p); err == nil && r != nil && owns(r, containerID, ifname) {
			return true
		}
	}
	return false
}

// Status is what a listed record stands for now, as GC and the agent's
// reconcile must judge it before they tear its attachment down.
type Status int

const (
	// Complete: a final record, as listed: its ADD succeeded.
	Complete Status = iota
	// Adding: provisional and locked: an ADD is making it.
	Adding
	// Abandoned: provisional and nobody holds it: its ADD died part way.
	Abandoned
	// Completed: provisional when listed, final now: its ADD ended after
	// the listing (or final when listed, DELed and ADDed again since).
	// Whatever the caller decided before the listing (GC's valid
	// attachments) does not know it.
	Completed
	// Gone: no record any more (its ADD failed, or a DEL ran).
	Gone
)

// Recheck tells what a record List returned stands for now, and returns
// the record as it is now (nil when Gone). A final record is read again
// (see recheckFinal). A provisional record found unlocked is read again:
// the ADD that held it may have ended after the listing, its final record
// replacing the file (and so the lock), and its pod is alive then; only
// what is still provisional and unlocked is half made.
func (s Store) Recheck(r *Record) (Status, *Record, error) {
	if !r.Provisional {
		return s.recheckFinal(r)
	}
	if s.Busy(r) {
		return Adding, r, nil
	}
	recheckStep("reread")
	now, err := s.Read(r.ContainerID, r.IfName)
	switch {
	case err != nil:
		return Gone, nil, err
	case now == nil:
		return Gone, nil, nil
	case !now.Provisional:
		return Completed, now, nil
	}
	recheckStep("relock")
	if s.Busy(now) {
		return Adding, now, nil // a new ADD claimed it after a DEL
	}
	// The same race once more: the claim just read may be a new ADD's that
	// ended before that look at its lock. Abandoned only if the file still
	// holds that very claim.
	again, err := s.Read(r.ContainerID, r.IfName)
	switch {
	case err != nil:
		return Gone, nil, err
	case again == nil:
		return Gone, nil, nil
	case !again.Provisional:
		return Completed, again, nil
	case again.Pid != now.Pid || !again.Created.Equal(now.Created):
		return Adding, again, nil // yet another claim: the next look decides
	}
	return Abandoned, again, nil
}

// recheckFinal reads a final record List returned again: DELed and ADDed
// anew since, it is a new ADD's (Completed, or Adding while that one is at
// work), which whatever was decided before the listing does not know.
func (s Store) recheckFinal(r *Record) (Status, *Record, error) {
	now, err := s.Read(r.ContainerID, r.IfName)
	switch {
	case err != nil:
		return Gone, nil, err
	case now == nil:
		return Gone, nil, nil
	case now.Provisional:
		return Adding, now, nil // a new claim: the next look decides
	case !now.Created.Equal(r.Created) || now.HostIfindex != r.HostIfindex:
		return Completed, now, nil
	}
	return Complete, now, nil
}

// Hold takes the lock of a claim Recheck found Abandoned, as the ADD that
// died held it, so that while the caller (GC, the agent's reconcile) tears
// it down no DEL or ADD of the attachment runs: a new ADD is refused with
// 11, a DEL waits (see Busy). ok is false, and nothing held, when someone
// else holds it or the file no longer holds that very claim (a DEL and a
// new ADD came between): the next look decides. release drops the lock.
func (s Store) Hold(r *Record) (release func(), ok bool, err error) {
	for _, p := range s.paths(r.ContainerID, r.IfName) {
		f, b, err := safedir.TryLock(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return nil, false, err
		case f == nil:
			return nil, false, nil // someone holds it
		}
		held := &Record{}
		if err := json.Unmarshal(b, held); err != nil || !owns(held, r.ContainerID, r.IfName) {
			f.Close()
			continue // not this attachment's (an ambiguous legacy name)
		}
		if !held.Provisional || held.Pid != r.Pid || !held.Created.Equal(r.Created) {
			f.Close()
			return nil, false, nil
		}
		return func() { f.Close() }, true, nil
	}
	return nil, false, nil
}

// recheckStep is a test seam: Recheck calls it before each of its looks.
var recheckStep = func(step string) {}

// WaitIdle waits up to timeout for the ADD holding an attachment's record
// to end; true when it did (or nobody held it).
func (s Store) WaitIdle(containerID, ifname string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for s.held(containerID, ifname) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// Remove deletes the record of an attachment; absent is fine. A file of its
// names holding another attachment's record stays; an unreadable one goes.
func (s Store) Remove(containerID, ifname string) error {
	for _, p := range s.paths(containerID, ifname) {
		if r, err := ReadFile(p); err == nil && r != nil && !owns(r, containerID, ifname) {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// List returns every record of the network; unreadable ones are left out
// (DEL of their attachment falls back to what it can derive).
func (s Store) List() ([]*Record, error) {
	dir := s.Dir()
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Record
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue // temp files of writes in progress (or killed)
		}
		r, err := ReadFile(filepath.Join(dir, e.Name()))
		if err == nil && r != nil {
			out = append(out, r)
		}
	}
	return out, nil
}

// StaleTempAge is how old a record write's temp file must be before GC
// takes it for one a killed plugin left: a live plugin renames its temp
// file within milliseconds.
const StaleTempAge = time.Minute

// RemoveStaleTemps drops the temp files of record writes that a killed
// plugin left between creating and renaming them.
func (s Store) RemoveStaleTemps() error {
	dir := s.Dir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var errs error
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".tmp") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > StaleTempAge {
			if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = errors.Join(errs, err)
			}
		}
	}
	return errs
}

// Networks lists the networks that have a record directory under root.
func Networks(root string) ([]string, error) {
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// ListAll returns the records of every network under a state directory.
func ListAll(root string) ([]*Record, error) {
	nets, err := Networks(root)
	if err != nil {
		return nil, err
	}
	var out []*Record
	for _, n := range nets {
		rs, err := Store{Root: root, Network: n}.List()
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

// ByHostIfindex indexes complete records by their host veth's ifindex, for
// the dumps and metrics that name a map entry's pod.
func ByHostIfindex(recs []*Record) map[int]*Record {
	out := make(map[int]*Record, len(recs))
	for _, r := range recs {
		if r.HostIfindex > 0 {
			out[r.HostIfindex] = r
		}
	}
	return out
}
