package inspect

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// StatusReport is the datapath's health as `ebpf-agent status` prints it.
type StatusReport struct {
	Healthy     bool              `json:"healthy"`
	Problems    []string          `json:"problems,omitempty"`
	Version     string            `json:"version"`
	Kernel      string            `json:"kernel"`
	PinDir      string            `json:"pinDir"`
	MapLayout   int               `json:"mapLayout"`
	Maps        map[string]int    `json:"maps"`     // name -> entries
	Programs    []ProgramStatus   `json:"programs"` // pinned programs
	Attachments AttachmentSummary `json:"attachments"`
}

// ProgramStatus is one pinned program.
type ProgramStatus struct {
	Pin     string `json:"pin"`
	ID      uint32 `json:"id"`
	Current bool   `json:"current"` // this build's program
}

// AttachmentSummary counts the pinned links.
type AttachmentSummary struct {
	HostVethLinks int      `json:"hostVethLinks"`
	Defunct       int      `json:"defunct"` // device gone, pin left
	NodeHooks     []string `json:"nodeHooks"`
}

// Status inspects the pinned datapath read-only: `status`.
func Status(src Source, version string) *StatusReport {
	pinRoot := src.PinDir
	r := &StatusReport{Version: version, PinDir: pinRoot, MapLayout: maps.LayoutVersion, Maps: map[string]int{}}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		r.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	problem := func(f string, a ...any) { r.Problems = append(r.Problems, fmt.Sprintf(f, a...)) }

	var st unix.Statfs_t
	if err := unix.Statfs(pinRoot, &st); err != nil {
		problem("pin directory %s: %v", pinRoot, err)
	} else if st.Type != unix.BPF_FS_MAGIC {
		problem("pin directory %s is not on bpffs", pinRoot)
	}
	dp, err := datapath.Open(pinRoot)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			problem("datapath not set up by this build (no ADD or agent start yet, or another build pinned it): %v", err)
		} else {
			problem("%v", err)
		}
	} else {
		defer dp.Close()
		for _, name := range dp.Maps.Names() {
			r.Maps[name] = countEntries(dp.Maps.Map(name))
		}
	}
	for _, p := range datapath.ProgramPins(pinRoot) {
		prog, err := ebpf.LoadPinnedProgram(p.Path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			problem("program pin %s: %v", p.Path, err)
			continue
		}
		ps := ProgramStatus{Pin: p.Name, Current: p.Current}
		if info, err := prog.Info(); err == nil {
			id, _ := info.ID()
			ps.ID = uint32(id)
		}
		if !ps.Current {
			problem("program pin %s is not this build's (run `ebpf-agent upgrade`)", ps.Pin)
		}
		prog.Close()
		r.Programs = append(r.Programs, ps)
	}
	for _, p := range datapath.NodeHookPins(pinRoot) {
		r.Attachments.NodeHooks = append(r.Attachments.NodeHooks, p.Name)
	}
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
	if r.Attachments.Defunct > 0 {
		problem("%d link pins of deleted devices (run `ebpf-agent reconcile`)", r.Attachments.Defunct)
	}
	r.Healthy = len(r.Problems) == 0
	return r
}

func countEntries(m *ebpf.Map) int {
	n := 0
	k := make([]byte, m.KeySize())
	it := m.Iterate()
	var v []byte
	if m.Type() == ebpf.PerCPUHash || m.Type() == ebpf.PerCPUArray {
		var pv [][]byte
		for it.Next(&k, &pv) {
			n++
		}
		return n
	}
	for it.Next(&k, &v) {
		n++
	}
	return n
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
	for _, p := range r.Problems {
		sum.Lines = append(sum.Lines, "problem:    "+p)
	}
	ms := Table{Header: []string{"MAP", "ENTRIES"}}
	names := make([]string, 0, len(r.Maps))
	for name := range r.Maps {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		ms.Rows = append(ms.Rows, []string{name, itoa(r.Maps[name])})
	}
	ps := Table{Header: []string{"PROGRAM PIN", "ID", "THIS BUILD"}}
	for _, p := range r.Programs {
		ps.Rows = append(ps.Rows, []string{p.Pin, itoa(p.ID), fmt.Sprint(p.Current)})
	}
	ps.Footer = fmt.Sprintf("host veth links: %d (%d defunct); node hooks: %s", r.Attachments.HostVethLinks,
		r.Attachments.Defunct, dash(strings.Join(r.Attachments.NodeHooks, ", ")))
	return []Table{sum, ms, ps}
}
