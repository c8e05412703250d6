package inspect

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// StatusReport is the datapath's health as `ebpf-agent status` prints it.
type StatusReport struct {
	Healthy     bool              `json:"healthy"`
	Problems    []string          `json:"problems,omitempty"`
	Version     string            `json:"version"`
	Kernel      string            `json:"kernel"`
	PinDir      string            `json:"pinDir"`
	MapLayout   int               `json:"mapLayout"`
	Sizing      *maps.Sizing      `json:"sizing,omitempty"` // what the pinned maps are sized for
	Maps        []maps.Usage      `json:"maps"`
	Memory      MemorySummary     `json:"memory"`
	Programs    []ProgramStatus   `json:"programs"` // pinned programs
	Attachments AttachmentSummary `json:"attachments"`
	// Masq: the masquerade ports against the node's own (when an ipMasq ADD configured them).
	Masq *MasqPortStatus `json:"masq,omitempty"`
	// Features are the kernel features the datapath uses, as probed, with
	// what replaces each one the kernel lacks (or that is forced off).
	Features []datapath.Feature `json:"features"`
	// Build is the programs' build the node runs: "full", or "compat"
	// (no bpf_timer, no bpf_loop: docs/compat.md).
	Build string `json:"build"`
	// Warnings do not make the datapath unhealthy: maps above 90% full,
	// masquerade ports the node's kernel may pick for its own connections.
	Warnings []string `json:"warnings,omitempty"`
}

// MasqPortStatus compares cni_masq_config with the ports the node's kernel
// picks for its own connections (ip_local_port_range but
// ip_local_reserved_ports): each port in both may carry a node connection
// and a masqueraded flow to the same peer at once, and the reply of one
// goes to the other. ADD refuses such a configuration; widening
// ip_local_port_range (or dropping a reservation) afterwards makes one.
type MasqPortStatus struct {
	Ports     string `json:"ports"`
	Ephemeral string `json:"ephemeral"` // ip_local_port_range
	Reserved  string `json:"reserved"`  // ip_local_reserved_ports
	Overlap   int    `json:"overlap"`   // masquerade ports the kernel may pick
}

// MemorySummary is the kernel memory of the maps (memlock, as the kernel
// accounts it) on this node.
type MemorySummary struct {
	CPUs         int    `json:"possibleCPUs"`
	MemlockBytes uint64 `json:"memlockBytes"` // now
	FullBytes    uint64 `json:"fullBytes"`    // with every map full (maps not preallocated grow)
}

// ProgramStatus is one pinned program.
type ProgramStatus struct {
	Pin     string `json:"pin"`
	ID      uint32 `json:"id"`
	Current bool   `json:"current"` // this build's program
}

// AttachmentSummary counts the pinned links and the host veths by how
// their hooks are attached.
type AttachmentSummary struct {
	HostVethLinks int      `json:"hostVethLinks"`
	Defunct       int      `json:"defunct"` // device gone, pin left
	NodeHooks     []string `json:"nodeHooks"`
	// NodeHookUsers counts what needs the node hooks: hostPort entries,
	// endpoints masqueraded (ipMasq) and rate limits (TCP pacing). With
	// hooks attached and no user they are idle: they stay until
	// `ebpf-agent uninstall` (docs/uninstall.md says why).
	NodeHookUsers NodeHookUsers `json:"nodeHookUsers"`
	NodeHooksIdle bool          `json:"nodeHooksIdle"`
	// UplinkFilters are the uplink hooks run by cls_bpf filters where tcx
	// is missing or forced off ("uplink0 ingress (cls_bpf)"): no pin.
	UplinkFilters []string `json:"uplinkFilters,omitempty"`
	// Host veths by datapath.AttachmentOf: tcx, tc, "tc, tcx pending"
	// (ADD attached cls_bpf while the agent ran; it moves them when no
	// verb runs), "tc+tcx, moving", none.
	HostVeths map[string]int `json:"hostVeths"`
	// HandedOff are the veths DEL handed off that the agent has not
	// deleted yet (or their link pins, the veth gone with its pod's netns).
	HandedOff []string `json:"handedOff"`
	// AgentRunning: an agent holds the node's agent lock.
	AgentRunning bool `json:"agentRunning"`
}

// NodeHookUsers counts the map entries that need the node hooks.
type NodeHookUsers struct {
	HostPorts      int `json:"hostPorts"`
	MasqEndpoints  int `json:"masqEndpoints"`
	BandwidthLimit int `json:"bandwidthLimits"`
}

func (u NodeHookUsers) none() bool { return u.HostPorts+u.MasqEndpoints+u.BandwidthLimit == 0 }

// nodeHookUsers reads the users off the maps.
func nodeHookUsers(m *maps.Maps) (NodeHookUsers, error) {
	var u NodeHookUsers
	hps, err := m.HostPorts().List()
	if err != nil {
		return u, err
	}
	u.HostPorts = len(hps)
	eps, err := m.Endpoints().List()
	if err != nil {
		return u, err
	}
	for _, e := range eps {
		if e.Info.Flags&maps.EndpointFlagMasq != 0 {
			u.MasqEndpoints++
		}
	}
	lims, err := m.Bandwidth().ListLimits()
	u.BandwidthLimit = len(lims)
	return u, err
}

// Status inspects the pinned datapath read-only: `status`.
func Status(src Source, version string) *StatusReport {
	pinRoot := src.PinDir
	r := &StatusReport{Version: version, PinDir: pinRoot, MapLayout: maps.LayoutVersion}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		r.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	var st unix.Statfs_t
	if err := unix.Statfs(pinRoot, &st); err != nil {
		r.problem("pin directory %s: %v", pinRoot, err)
	} else if st.Type != unix.BPF_FS_MAGIC {
		r.problem("pin directory %s is not on bpffs", pinRoot)
	}
	dp, err := datapath.Open(pinRoot)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			r.problem("datapath not set up by this build (no ADD or agent start yet, or another build pinned it): %v", err)
		} else {
			r.problem("%v", err)
		}
	} else {
		defer dp.Close()
		r.mapsStatus(dp.Maps)
	}
	for _, d := range datapath.OlderLayoutDirs(pinRoot) {
		r.problem("maps of an older layout are still pinned at %s (run `ebpf-agent upgrade`)", d)
	}
	r.programsStatus(pinRoot)
	r.nodeHooksStatus(pinRoot, dp)
	r.attachmentsStatus(pinRoot, src.StateDir)
	if _, err := datapath.Forced(); err != nil {
		r.problem("%v", err)
	}
	r.Features = datapath.Features()
	r.Build = "full"
	if datapath.CompatBuild(pinRoot) {
		r.Build = "compat"
	}
	if miss := datapath.MissingRequired(); len(miss) > 0 {
		r.problem("the kernel lacks %s, which the datapath needs (docs/compat.md)", strings.Join(miss, ", "))
	}
	r.Healthy = len(r.Problems) == 0
	return r
}

func (r *StatusReport) problem(f string, a ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(f, a...))
}

// mapsStatus: the sizing, each map's fill and memory, the masquerade ports;
// a warning per map nearly full.
func (r *StatusReport) mapsStatus(m *maps.Maps) {
	sz := maps.SizingOf(m)
	r.Sizing = &sz
	us, err := m.Usage()
	if err != nil {
		r.problem("read the maps: %v", err)
	}
	r.Maps = us
	if len(us) > 0 {
		r.Memory.CPUs = us[0].CPUs
		r.Memory.MemlockBytes, r.Memory.FullBytes = maps.Footprint(us, us[0].CPUs)
	}
	if ms, w := masqPortStatus(m); ms != nil || w != "" {
		r.Masq = ms
		if w != "" {
			r.Warnings = append(r.Warnings, w)
		}
	}
	for _, u := range us {
		if u.Fill() > maps.FullWarn {
			what := "ADDs or flows that need another entry fail"
			if strings.HasPrefix(u.Type, "LRU") {
				what = "the least recently used flows are evicted"
			}
			r.Warnings = append(r.Warnings, fmt.Sprintf("map %s is %.0f%% full (%d of %d entries): %s",
				u.Name, 100*u.Fill(), u.Entries, u.MaxEntries, what))
		}
	}
}

// programsStatus: each pinned program, and whether it is this build's.
func (r *StatusReport) programsStatus(pinRoot string) {
	for _, p := range datapath.ProgramPins(pinRoot) {
		prog, err := ebpf.LoadPinnedProgram(p.Path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			r.problem("program pin %s: %v", p.Path, err)
			continue
		}
		ps := ProgramStatus{Pin: p.Name, Current: p.Current}
		if info, err := prog.Info(); err == nil {
			id, _ := info.ID()
			ps.ID = uint32(id)
		}
		if !ps.Current {
			r.problem("program pin %s is not this build's (run `ebpf-agent upgrade`)", ps.Pin)
		}
		prog.Close()
		r.Programs = append(r.Programs, ps)
	}
}

// nodeHooksStatus: the node hooks' pins, the uplinks' cls_bpf filters and
// the map entries that need the hooks (dp nil: not set up).
func (r *StatusReport) nodeHooksStatus(pinRoot string, dp *datapath.Datapath) {
	for _, p := range datapath.NodeHookPins(pinRoot) {
		r.Attachments.NodeHooks = append(r.Attachments.NodeHooks, p.Name)
	}
	if fs, err := datapath.UplinkFilters(); err == nil {
		for _, f := range fs {
			dir := "egress"
			if f.Hook.Attach == ebpf.AttachTCXIngress {
				dir = "ingress"
			}
			r.Attachments.UplinkFilters = append(r.Attachments.UplinkFilters, fmt.Sprintf("%s %s (cls_bpf)", f.Link, dir))
		}
	}
	if dp != nil {
		u, err := nodeHookUsers(dp.Maps)
		if err != nil {
			r.problem("read the node hooks' users: %v", err)
		}
		r.Attachments.NodeHookUsers = u
		r.Attachments.NodeHooksIdle = err == nil && u.none() && len(r.Attachments.NodeHooks) > 0
	}
}

// attachmentsStatus: the host veths' link pins and states, the handed-off
// veths, the agent; a problem for work no one is left to do.
func (r *StatusReport) attachmentsStatus(pinRoot, stateDir string) {
	recs := recordsByHostIfindex(stateDir) // none readable: the links' names alone
	for _, p := range datapath.VethLinkPins(pinRoot) {
		r.Attachments.HostVethLinks++
		if l, err := link.LoadPinnedLink(p.Path, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
			if info, err := l.Info(); err == nil {
				if tcx := info.TCX(); tcx != nil && tcx.Ifindex == 0 {
					r.Attachments.Defunct++
				}
			}
			l.Close()
		}
	}
	r.Attachments.AgentRunning = datapath.AgentAlive(pinRoot)
	r.Attachments.HostVeths = map[string]int{}
	if links, err := netlinksafe.LinkList(); err == nil {
		for _, l := range links {
			if name, ok := hostVethOf(l, recs); ok {
				r.Attachments.HostVeths[datapath.AttachmentOf(pinRoot, l.Attrs().Index, name)]++
			}
		}
	}
	if hs, err := endpoint.ListHandedOff(pinRoot); err == nil {
		for _, h := range hs {
			r.Attachments.HandedOff = append(r.Attachments.HandedOff, h.Name)
		}
	}
	if n := len(r.Attachments.HandedOff); n > 0 && !r.Attachments.AgentRunning {
		r.problem("%d veths handed off by DEL and no agent running to delete them (start it, or a CNI GC deletes them)", n)
	}
	// Pods on cls_bpf waiting for tcx (HostVeths) are no problem without an
	// agent: ADD attaches them so in attachMode auto (issue 30), they run
	// the same programs, and the first agent moves them.
	if r.Attachments.Defunct > 0 {
		r.problem("%d link pins of deleted devices (run `ebpf-agent reconcile`)", r.Attachments.Defunct)
	}
}

// featureState is how the datapath stands with a feature.
func featureState(f datapath.Feature) string {
	switch {
	case f.InUse():
		return "in use"
	case f.Forced && f.Err != "":
		return "fallback (forced by " + datapath.ForceFallbackEnv + "; " + f.Err + ")"
	case f.Forced:
		return "fallback (forced by " + datapath.ForceFallbackEnv + ")"
	case f.Fallback != "" && f.Err != "":
		return "fallback (kernel lacks it; " + f.Err + ")"
	case f.Fallback != "":
		return "fallback (kernel lacks it)"
	}
	return "MISSING"
}

func (r *StatusReport) Tables() []Table {
	health := "healthy"
	if !r.Healthy {
		health = "UNHEALTHY"
	}
	sum := Table{Lines: []string{
		"datapath:   " + health,
		"version:    " + r.Version,
		"kernel:     " + r.Kernel,
		fmt.Sprintf("pin dir:    %s (map layout v%d)", r.PinDir, r.MapLayout),
	}}
	if r.Sizing != nil {
		sum.Lines = append(sum.Lines, "sized for:  "+r.Sizing.String())
	}
	if m := r.Masq; m != nil {
		sum.Lines = append(sum.Lines, fmt.Sprintf("masquerade: ports %s; node's ephemeral %s, reserved %s: %d in both",
			m.Ports, m.Ephemeral, dash(m.Reserved), m.Overlap))
	}
	for _, p := range r.Problems {
		sum.Lines = append(sum.Lines, "problem:    "+p)
	}
	for _, w := range r.Warnings {
		sum.Lines = append(sum.Lines, "warning:    "+w)
	}
	ms := Table{Header: []string{"MAP", "TYPE", "ENTRIES", "MAX", "FILL", "MEMLOCK"}}
	for _, u := range r.Maps {
		entries, fill := "-", "-"
		if u.Entries >= 0 {
			entries, fill = itoa(u.Entries), fmt.Sprintf("%.0f%%", 100*u.Fill())
		}
		ms.Rows = append(ms.Rows, []string{u.Name, u.Type, entries, itoa(u.MaxEntries), fill, humanBytes(u.Memlock)})
	}
	if r.Memory.CPUs > 0 {
		ms.Footer = fmt.Sprintf("map memory (memlock): %s now, %s with every map full (%d possible CPUs)",
			humanBytes(r.Memory.MemlockBytes), humanBytes(r.Memory.FullBytes), r.Memory.CPUs)
	}
	ps := Table{Header: []string{"PROGRAM PIN", "ID", "THIS BUILD"}}
	for _, p := range r.Programs {
		ps.Rows = append(ps.Rows, []string{p.Pin, itoa(p.ID), fmt.Sprint(p.Current)})
	}
	ps.Footer = fmt.Sprintf("host veth links: %d (%d defunct); node hooks: %s", r.Attachments.HostVethLinks,
		r.Attachments.Defunct, dash(strings.Join(append(r.Attachments.NodeHooks, r.Attachments.UplinkFilters...), ", ")))
	var states []string
	for st, n := range r.Attachments.HostVeths {
		states = append(states, fmt.Sprintf("%s %d", st, n))
	}
	sort.Strings(states)
	agent := "not running"
	if r.Attachments.AgentRunning {
		agent = "running"
	}
	sum.Lines = append(sum.Lines,
		"host veths: "+dash(strings.Join(states, ", ")),
		fmt.Sprintf("handed off: %d waiting for deletion (agent %s)", len(r.Attachments.HandedOff), agent))
	if u := r.Attachments.NodeHookUsers; r.Attachments.NodeHooksIdle {
		sum.Lines = append(sum.Lines, "node hooks: idle (no hostPort, ipMasq or rate-limited pod uses them); they stay attached until `ebpf-agent uninstall` (docs/uninstall.md)")
	} else if len(r.Attachments.NodeHooks) > 0 {
		sum.Lines = append(sum.Lines, fmt.Sprintf("node hooks: in use by %d hostPort entries, %d masqueraded endpoints, %d rate limits", u.HostPorts, u.MasqEndpoints, u.BandwidthLimit))
	}
	fs := Table{Header: []string{"KERNEL FEATURE", "SINCE", "STATE", "FALLBACK"}, Footer: "programs: the " + r.Build + " build"}
	for _, f := range r.Features {
		fs.Rows = append(fs.Rows, []string{f.Name, f.Kernel, featureState(f), dash(f.Fallback)})
	}
	return []Table{sum, fs, ms, ps}

}

// humanBytes is a byte count in KiB or MiB.
func humanBytes(b uint64) string {
	if b >= 1<<20 {
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
}

// masqPortStatus is nil when no ipMasq ADD configured the ports; the
// warning is non-empty when they overlap the node's own.
func masqPortStatus(m *maps.Maps) (*MasqPortStatus, string) {
	p, err := m.Masq().Config()
	if err != nil || len(p.Ranges) == 0 {
		return nil, ""
	}
	n, err := endpoint.ReadNodePorts()
	if err != nil {
		return nil, fmt.Sprintf("masquerade ports %s: read the node's ephemeral ports: %v", p, err)
	}
	res := make([]string, 0, len(n.Reserved))
	for _, r := range n.Reserved {
		res = append(res, fmt.Sprintf("%d-%d", r[0], r[1]))
	}
	s := &MasqPortStatus{Ports: p.String(), Ephemeral: fmt.Sprintf("%d-%d", n.Ephemeral[0], n.Ephemeral[1]),
		Reserved: strings.Join(res, ","), Overlap: n.MasqOverlap(p)}
	if s.Overlap == 0 {
		return s, ""
	}
	return s, fmt.Sprintf("masquerade ports %s overlap the node's ip_local_port_range %s in %d ports not in ip_local_reserved_ports: "+
		"the node's own connections may take a masqueraded flow's port and collide with it; narrow ip_local_port_range or reserve the ports",
		s.Ports, s.Ephemeral, s.Overlap)
}

// hostVethOf tells whether node link l is a pod's host veth, as the
// teardown identifies one: the veth a record names (endpoint.
// RecordedHostVeth: at its ifindex, under whatever name, an operator may
// have renamed it; another plugin's veth made at the ifindex once ours
// went is not), else a veth whose peer is in another netns (ADD makes the
// pair with the peer in the pod) under a host veth name; and it returns
// the attachment's host veth name, under which its link pins are (the
// record's, else the link's).
func hostVethOf(l netlink.Link, recs map[int]netRecord) (string, bool) {
	a := l.Attrs()
	if l.Type() != "veth" || a.NetNsID < 0 {
		return "", false
	}
	if rec, ok := recs[a.Index]; ok && endpoint.RecordedHostVeth(l, rec.Record, rec.network) {
		return state.HostIfName(rec.ContainerID, rec.IfName), true
	}
	return a.Name, strings.HasPrefix(a.Name, state.HostIfPrefix)
}
