package cni

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/safedir"
)

// Record is what ADD leaves on disk for one attachment, so DEL and GC can
// undo it without prevResult, netns or veth.
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
	HostPorts []hostPortRecord `json:"hostPorts,omitempty"`
	// Masq: the pod's traffic is masqueraded (DEL purges its cni_snat entries).
	Masq bool `json:"masq,omitempty"`
	// PodTable is the routing table of the interface inside the pod (see
	// configurePod); DEL removes the pod's rules that point at it.
	PodTable int `json:"podTable,omitempty"`

	// Provisional: written by an ADD that has not finished (or was killed).
	Provisional bool `json:"provisional,omitempty"`
	// Pid of the ADD that wrote a provisional record, for messages.
	Pid int `json:"pid,omitempty"`
	// Created is when ADD claimed the attachment.
	Created time.Time `json:"created,omitzero"`
}

func recordDir(stateDir, network string) string {
	return filepath.Join(stateDir, network)
}

// recordName is containerID_ifname.json. The spec puts no limit on the length
// of a container ID, a file name is at most 255 bytes: long IDs are hashed
// (the record inside keeps the real one).
func recordName(containerID, ifname string) string {
	name := containerID + "_" + ifname + ".json"
	if len(name) <= 200 { // room for the temp file's prefix and suffix
		return name
	}
	h := sha256.Sum256([]byte(containerID))
	return "sha256-" + hex.EncodeToString(h[:]) + "_" + ifname + ".json"
}

func recordPath(stateDir, network, containerID, ifname string) string {
	return filepath.Join(recordDir(stateDir, network), recordName(containerID, ifname))
}

// writeRecord writes (or replaces) the record of an attachment.
func writeRecord(stateDir, network string, r *Record) error {
	dir := recordDir(stateDir, network)
	if _, err := os.Stat(dir); err != nil { // else checked already (checkDirs)
		if err := safedir.MkdirAll(dir); err != nil {
			return err
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := safedir.WriteFile(dir, recordName(r.ContainerID, r.IfName), b); err != nil {
		return fmt.Errorf("write state record: %w", err)
	}
	return nil
}

// errClaimed: a record of the attachment exists already.
var errClaimed = errors.New("attachment has a record")

// claimRecord writes the provisional record of an attachment only if it has
// none, and returns it locked (closing the file releases the lock; so does
// the process dying). errClaimed when a record exists.
func claimRecord(stateDir, network string, r *Record) (*os.File, error) {
	dir := recordDir(stateDir, network)
	if _, err := os.Stat(dir); err != nil { // checked already when it exists (checkDirs)
		if err := safedir.MkdirAll(dir); err != nil {
			return nil, err
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	f, err := safedir.Claim(dir, recordName(r.ContainerID, r.IfName), b)
	if errors.Is(err, safedir.ErrExist) {
		return nil, errClaimed
	}
	return f, err
}

// readRecord returns nil, nil when there is no record.
func readRecord(stateDir, network, containerID, ifname string) (*Record, error) {
	return readRecordFile(recordPath(stateDir, network, containerID, ifname))
}

func readRecordFile(path string) (*Record, error) {
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

// recordBusy tells whether an ADD is still working on a provisional record.
func recordBusy(stateDir, network string, r *Record) bool {
	if !r.Provisional {
		return false
	}
	locked, err := safedir.Locked(recordPath(stateDir, network, r.ContainerID, r.IfName))
	return err == nil && locked
}

func removeRecord(stateDir, network, containerID, ifname string) error {
	err := os.Remove(recordPath(stateDir, network, containerID, ifname))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// ListRecords returns every record of a network.
func ListRecords(stateDir, network string) ([]*Record, error) {
	dir := recordDir(stateDir, network)
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
			continue
		}
		r, err := readRecordFile(filepath.Join(dir, e.Name()))
		if err == nil && r != nil {
			out = append(out, r)
		}
	}
	return out, nil
}

// ListAllRecords returns the records of every network under stateDir.
func ListAllRecords(stateDir string) ([]*Record, error) {
	ents, err := os.ReadDir(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Record
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		rs, err := ListRecords(stateDir, e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}
