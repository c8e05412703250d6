package agent

import (
	"fmt"
	"path/filepath"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// ResolveSizing decides what the node's maps are sized for: the sizing of
// the ebpf-cni networks of confDir and of the conflist template the agent
// writes (""; none) that use pinRoot (which must all agree), else the
// defaults, with the agent's flags on top (maxPods 0 and hostPortsPerPod
// -1: not given). The template counts because at a node's first start the
// agent writes the conflist only after its first list of the Nodes, after
// pinning the maps; the file of confDir it writes over (same base name)
// does not, being the template's to replace. Flags that disagree with a network are
// an error naming both: the plugin refuses to ADD into a datapath sized
// otherwise than its network says, so the mistake is reported at the
// agent's start rather than at the first ADD.
func ResolveSizing(confDir, template, pinRoot string, maxPods, hostPortsPerPod int) (maps.Sizing, error) {
	s := maps.DefaultSizing
	nets, _ := LoadNetworks(confDir, pinRoot)
	if template != "" {
		tn, err := LoadNetworkFile(template, pinRoot)
		if err != nil {
			return s, fmt.Errorf("conflist template: %w", err)
		}
		for _, n := range nets {
			if filepath.Base(n.File) != filepath.Base(template) {
				tn = append(tn, n)
			}
		}
		nets = tn
	}
	for i, n := range nets {
		if i == 0 {
			s = n.Net.Sizing()
		} else if ns := n.Net.Sizing(); ns != s {
			return s, fmt.Errorf("networks %q (%s) and %q (%s) size the datapath at %s differently (%s; %s): they must agree",
				nets[0].Name, nets[0].File, n.Name, n.File, pinRoot, s, ns)
		}
	}
	flags := s
	if maxPods != 0 {
		flags.MaxPods = maxPods
	}
	if hostPortsPerPod >= 0 {
		flags.HostPortsPerPod = hostPortsPerPod
	}
	if err := flags.Validate(); err != nil {
		return s, err
	}
	if len(nets) > 0 && flags != s {
		return s, fmt.Errorf("the agent's flags size the datapath at %s for %s, network %q (%s) for %s: they must agree",
			pinRoot, flags, nets[0].Name, nets[0].File, s)
	}
	return flags, nil
}
