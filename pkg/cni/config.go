// Package cni implements the CNI verbs of ebpf-cni: ADD, DEL, CHECK, STATUS
// and GC, on top of pkg/datapath.
package cni

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// DefaultStateDir keeps one record per attachment; it survives reboots like
// host-local's reservations, so GC after a reboot can release them.
const DefaultStateDir = "/var/lib/cni/ebpf-cni"

// NetConf is the network configuration of the plugin.
type NetConf struct {
	types.NetConf

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
	// IPMasq (as ptp and bridge name it): the pod's IPv4 traffic to
	// destinations outside ClusterCIDRs leaves with the node's address,
	// translated in BPF.
	IPMasq bool `json:"ipMasq,omitempty"`
	// ClusterCIDRs are never masqueraded; default: the subnets of the
	// pod's addresses as the IPAM result gives them.
	ClusterCIDRs []string `json:"clusterCIDRs,omitempty"`

	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitempty"`

	attachMode   datapath.AttachMode
	portMappings []portMapping // validated runtimeConfig.portMappings
	clusterCIDRs []netip.Prefix
}

// minMTU6 is the least MTU a link may have for IPv6 (RFC 8200); the kernel
// disables IPv6 on a smaller one.
const minMTU6 = 1280

// Error codes the spec defines that the types package does not name.
const (
	errPluginNotAvailable uint = 50
)

func confError(format string, a ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(format, a...), "")
}

// parseConf decodes and validates stdin. Every problem is a CNI error naming the field.
func parseConf(stdin []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode network config: %v", err), "")
	}
	// The name is a directory under stateDir: "../x" must not leave it.
	if err := utils.ValidateNetworkName(conf.Name); err != nil {
		return nil, confError("name %q: %s", conf.Name, strings.TrimSuffix(err.Msg, ":"))
	}
	if conf.MTU != 0 && (conf.MTU < 68 || conf.MTU > 65535) {
		return nil, confError("mtu %d is out of range (68-65535)", conf.MTU)
	}
	if conf.PinDir == "" {
		conf.PinDir = datapath.DefaultPinRoot
	}
	if !filepath.IsAbs(conf.PinDir) {
		return nil, confError("pinDir %q must be an absolute path", conf.PinDir)
	}
	if conf.StateDir == "" {
		conf.StateDir = DefaultStateDir
	}
	if !filepath.IsAbs(conf.StateDir) {
		return nil, confError("stateDir %q must be an absolute path", conf.StateDir)
	}
	if conf.CgroupRoot != "" && !filepath.IsAbs(conf.CgroupRoot) {
		return nil, confError("cgroupRoot %q must be an absolute path", conf.CgroupRoot)
	}
	mode, err := datapath.ParseAttachMode(conf.AttachMode)
	if err != nil {
		return nil, confError("attachMode: %v", err)
	}
	conf.attachMode = mode
	for i, c := range conf.ClusterCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, confError("clusterCIDRs[%d]: %q is not a CIDR", i, c)
		}
		conf.clusterCIDRs = append(conf.clusterCIDRs, p.Masked())
	}
	if err := version.ParsePrevResult(&conf.NetConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode prevResult: %v", err), "")
	}
	return conf, nil
}

// validateIPAM checks that an ipam block exists and that the address fields
// common to IPAM plugins parse, so a typo is error 4 naming the field rather
// than an opaque failure deep in the IPAM plugin.
func validateIPAM(stdin []byte, conf *NetConf) error {
	if conf.IPAM.Type == "" {
		return confError("ipam: missing (need an \"ipam\" object with a \"type\", e.g. host-local)")
	}
	var raw struct {
		IPAM struct {
			Subnet  string `json:"subnet"`
			Gateway string `json:"gateway"`
			Ranges  [][]struct {
				Subnet     string `json:"subnet"`
				RangeStart string `json:"rangeStart"`
				RangeEnd   string `json:"rangeEnd"`
				Gateway    string `json:"gateway"`
			} `json:"ranges"`
			Routes []struct {
				Dst string `json:"dst"`
				GW  string `json:"gw"`
			} `json:"routes"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(stdin, &raw); err != nil {
		return confError("ipam: %v", err)
	}
	cidr := func(field, v string) error {
		if v == "" {
			return nil
		}
		ip, _, err := net.ParseCIDR(v)
		if err != nil {
			return confError("%s: %q is not a CIDR", field, v)
		}
		if ip.To4() == nil && conf.MTU != 0 && conf.MTU < minMTU6 {
			return confError("mtu %d is below %d, the least IPv6 works with, and %s %s is IPv6", conf.MTU, minMTU6, field, v)
		}
		return nil
	}
	addr := func(field, v string) error {
		if v != "" && net.ParseIP(v) == nil {
			return confError("%s: %q is not an IP address", field, v)
		}
		return nil
	}
	ip := raw.IPAM
	if err := cidr("ipam.subnet", ip.Subnet); err != nil {
		return err
	}
	if err := addr("ipam.gateway", ip.Gateway); err != nil {
		return err
	}
	for i, set := range ip.Ranges {
		for j, r := range set {
			f := fmt.Sprintf("ipam.ranges[%d][%d]", i, j)
			if r.Subnet == "" {
				return confError("%s.subnet: missing", f)
			}
			if err := cidr(f+".subnet", r.Subnet); err != nil {
				return err
			}
			for name, v := range map[string]string{"rangeStart": r.RangeStart, "rangeEnd": r.RangeEnd, "gateway": r.Gateway} {
				if err := addr(f+"."+name, v); err != nil {
					return err
				}
			}
		}
	}
	for i, r := range ip.Routes {
		f := fmt.Sprintf("ipam.routes[%d]", i)
		if r.Dst == "" {
			return confError("%s.dst: missing", f)
		}
		if err := cidr(f+".dst", r.Dst); err != nil {
			return err
		}
		if err := addr(f+".gw", r.GW); err != nil {
			return err
		}
	}
	return nil
}

// validateRuntimeConfig checks the capabilities the runtime passed. Only ADD
// and CHECK call it: DEL must clean up whatever it is given.
func validateRuntimeConfig(conf *NetConf) error {
	if err := validateHostPorts(conf); err != nil {
		return err
	}
	return validateBandwidth(conf)
}

// prevResult returns the previous result as the current result type.
func (c *NetConf) prevResult() (*current.Result, error) {
	if c.PrevResult == nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "prevResult: missing (CHECK needs the result of ADD)", "")
	}
	r, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("prevResult: %v", err), "")
	}
	return r, nil
}
