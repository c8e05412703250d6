package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Record is what ADD leaves on disk for one attachment, so DEL and GC can
// undo it without prevResult, netns or veth.
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
}

func recordDir(stateDir, network string) string {
	return filepath.Join(stateDir, network)
}

func recordPath(stateDir, network, containerID, ifname string) string {
	return filepath.Join(recordDir(stateDir, network), containerID+"_"+ifname+".json")
}

func writeRecord(stateDir, network string, r *Record) error {
	dir := recordDir(stateDir, network)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create state directory %s: %w", dir, err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	p := recordPath(stateDir, network, r.ContainerID, r.IfName)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write state record %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write state record %s: %w", p, err)
	}
	return nil
}

// readRecord returns nil, nil when there is no record.
func readRecord(stateDir, network, containerID, ifname string) (*Record, error) {
	b, err := os.ReadFile(recordPath(stateDir, network, containerID, ifname))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := &Record{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("decode state record: %w", err)
	}
	return r, nil
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
	ents, err := os.ReadDir(recordDir(stateDir, network))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Record
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(recordDir(stateDir, network), e.Name()))
		if err != nil {
			continue
		}
		r := &Record{}
		if json.Unmarshal(b, r) == nil {
			out = append(out, r)
		}
	}
	return out, nil
}
