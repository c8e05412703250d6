package netpol

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// DefaultStatusDir is where the agent records what it programmed per
// interface: the maps hold addresses and ports, not the policies' names.
const DefaultStatusDir = "/run/ebpf-cni/policy"

// Status is what the controller last programmed for one interface.
type Status struct {
	Ifindex     uint32          `json:"ifindex"`
	HostIf      string          `json:"hostIf"`
	Pod         string          `json:"pod,omitempty"`
	ContainerID string          `json:"containerID,omitempty"`
	Endpoint    policy.Endpoint `json:"endpoint"`
	Applied     time.Time       `json:"applied"`
}

const statusFile = "status.json"

// writeStatus replaces the status file (temp file, rename): one file for
// every interface, so a pass costs one write however many it programmed.
func writeStatus(dir string, sts []Status) error {
	b, err := json.Marshal(sts)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".status-*.tmp")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, statusFile))
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// ReadStatus reads what the agent last programmed; none when it never did.
func ReadStatus(dir string) ([]Status, error) {
	b, err := os.ReadFile(filepath.Join(dir, statusFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Status
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, statusFile), err)
	}
	return out, nil
}
