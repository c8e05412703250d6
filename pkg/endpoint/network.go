package endpoint

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/utils"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/safedir"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Network is what the attachments of one network share: the plugin's own
// configuration keys (decoded from the network configuration beside the
// standard ones) and where the node keeps the datapath and the records.
// The plugin and the agent both read it from the configuration with
// Complete, so defaults and checks have one owner.
type Network struct {
	// Name is the network's name (the standard "name"): a directory
	// under StateDir.
	Name string `json:"-"`
	// MTU of both veth ends; 0 keeps the kernel default.
	MTU int `json:"mtu,omitempty"`
	// PinDir is the bpffs directory of the node's datapath.
	PinDir string `json:"pinDir,omitempty"`
	// StateDir holds the per-attachment records.
	StateDir string `json:"stateDir,omitempty"`
	// AttachMode is auto (tcx, else tc), tcx or tc.
	AttachMode string `json:"attachMode,omitempty"`
	// CgroupRoot is the cgroup2 directory of the node-wide socket hooks
	// (hostPort, TCP pacing); "" finds the cgroup2 mount (/sys/fs/cgroup,
	// /sys/fs/cgroup/unified).
	CgroupRoot string `json:"cgroupRoot,omitempty"`

	// MaxPods and MaxHostPortsPerPod size the node's maps (maps.Sizing):
	// they must be the same in every network sharing PinDir and in the
	// agent's flags. 0 takes the default (110 and 32).
	MaxPods            int  `json:"maxPods,omitempty"`
	MaxHostPortsPerPod *int `json:"maxHostPortsPerPod,omitempty"`

	// IPAMType is the IPAM plugin (the standard ipam.type); "" for none.
	IPAMType string `json:"-"`
	// IPv4Only: the IPAM configuration gives IPv4 addresses only (the
	// plugin knows it of host-local's subnet and ranges); the host veths
	// then carry no IPv6 (see disableIPv6).
	IPv4Only bool `json:"-"`

	sizing maps.Sizing

	attachMode datapath.AttachMode
}

// ParseNetwork reads the network's keys from a network configuration (as
// the runtime passes it to the plugin), defaults applied and checked.
func ParseNetwork(conf []byte) (*Network, error) {
	var c struct {
		Name string `json:"name"`
		IPAM struct {
			Type string `json:"type"`
		} `json:"ipam"`
		Network
	}
	if err := json.Unmarshal(conf, &c); err != nil {
		return nil, Errorf(ErrDecode, "decode network config: %w", err)
	}
	n := c.Network
	if err := n.Complete(c.Name, c.IPAM.Type); err != nil {
		return nil, err
	}
	return &n, nil
}

// MinMTU6 is the least MTU a link may have for IPv6 (RFC 8200); the kernel
// disables IPv6 on a smaller one.
const MinMTU6 = 1280

// Complete validates the network's keys and applies the defaults; name and
// ipamType are the standard keys' values. Every problem is error 7 naming
// the field.
func (n *Network) Complete(name, ipamType string) error {
	n.Name, n.IPAMType = name, ipamType
	// The name is a directory under stateDir: "../x" must not leave it.
	if err := utils.ValidateNetworkName(n.Name); err != nil {
		return ConfError("name %q: %s", n.Name, strings.TrimSuffix(err.Msg, ":"))
	}
	if n.MTU != 0 && (n.MTU < 68 || n.MTU > 65535) {
		return ConfError("mtu %d is out of range (68-65535)", n.MTU)
	}
	if n.PinDir == "" {
		n.PinDir = datapath.DefaultPinRoot
	}
	if !filepath.IsAbs(n.PinDir) {
		return ConfError("pinDir %q must be an absolute path", n.PinDir)
	}
	if n.StateDir == "" {
		n.StateDir = state.DefaultDir
	}
	if !filepath.IsAbs(n.StateDir) {
		return ConfError("stateDir %q must be an absolute path", n.StateDir)
	}
	if n.CgroupRoot != "" && !filepath.IsAbs(n.CgroupRoot) {
		return ConfError("cgroupRoot %q must be an absolute path", n.CgroupRoot)
	}
	n.sizing = maps.DefaultSizing
	if n.MaxPods != 0 {
		n.sizing.MaxPods = n.MaxPods
	}
	if n.MaxHostPortsPerPod != nil {
		n.sizing.HostPortsPerPod = *n.MaxHostPortsPerPod
	}
	if err := n.sizing.Validate(); err != nil {
		return ConfError("%w", err)
	}
	mode, err := datapath.ParseAttachMode(n.AttachMode)
	if err != nil {
		return ConfError("attachMode: %w", err)
	}
	n.attachMode = mode
	return nil
}

// Store is where the network's attachment records live.
func (n *Network) Store() state.Store { return state.Store{Root: n.StateDir, Network: n.Name} }

// CheckDirs refuses a pin or state directory that another user owns or may
// write to (see safedir), before anything in them is read or written.
func (n *Network) CheckDirs() error {
	if err := safedir.Check(n.PinDir); err != nil {
		return ConfError("pinDir: %w", err)
	}
	if err := safedir.Check(n.StateDir); err != nil {
		return ConfError("stateDir: %w", err)
	}
	if err := safedir.Check(n.Store().Dir()); err != nil {
		return ConfError("stateDir: %w", err)
	}
	return nil
}

// nodeHookOptions are the node hooks' settings of this network.
func (n *Network) nodeHookOptions() datapath.NodeHookOptions {
	return datapath.NodeHookOptions{CgroupRoot: n.CgroupRoot}
}

// Sizing is what the network says the node's maps are sized for.
func (n *Network) Sizing() maps.Sizing { return n.sizing }

// ensureDatapath opens the node's datapath, setting it up on first use. A
// datapath sized otherwise than this network says, or an older layout too
// big for these sizes, is a configuration error (7); anything else means
// the datapath cannot be used (50). Programs are opened as ADD needs them
// (datapath.EnsureLean).
func (n *Network) ensureDatapath() (*datapath.Datapath, error) {
	dp, err := datapath.EnsureLean(n.PinDir, n.sizing)
	if err != nil {
		var mig *datapath.MigrationError
		switch {
		case maps.IsSizingError(err):
			return nil, ConfError("pinDir %s: %w", n.PinDir, err)
		case errors.As(err, &mig) && errors.Is(err, maps.ErrFull):
			return nil, ConfError("pinDir %s: %w (maxPods %d is too small for the pods the older build attached)", n.PinDir, err, n.sizing.MaxPods)
		}
		return nil, Errorf(ErrUnavailable, "datapath at %s: %w", n.PinDir, err)
	}
	return dp, nil
}
