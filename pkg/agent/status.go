package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

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

// Status inspects the pinned datapath read-only.
func Status(pinRoot, version string) StatusReport {
	r := StatusReport{Version: version, PinDir: pinRoot, MapLayout: maps.LayoutVersion, Maps: map[string]int{}}
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

// WriteStatus prints the report as text or JSON.
func WriteStatus(w io.Writer, r StatusReport, format string) error {
	if format == "json" {
		return writeJSON(w, r)
	}
	if format != "" && format != "table" {
		return fmt.Errorf("unknown output format %q (want table or json)", format)
	}
	health := "healthy"
	if !r.Healthy {
		health = "UNHEALTHY"
	}
	fmt.Fprintf(w, "datapath:   %s\nversion:    %s\nkernel:     %s\npin dir:    %s (map layout v%d)\n",
		health, r.Version, r.Kernel, r.PinDir, r.MapLayout)
	for _, p := range r.Problems {
		fmt.Fprintf(w, "problem:    %s\n", p)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nMAP\tENTRIES")
	names := make([]string, 0, len(r.Maps))
	for name := range r.Maps {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(tw, "%s\t%d\n", name, r.Maps[name])
	}
	fmt.Fprintln(tw, "\nPROGRAM PIN\tID\tTHIS BUILD")
	for _, p := range r.Programs {
		fmt.Fprintf(tw, "%s\t%d\t%v\n", p.Pin, p.ID, p.Current)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nhost veth links: %d (%d defunct); node hooks: %s\n", r.Attachments.HostVethLinks,
		r.Attachments.Defunct, dash(strings.Join(r.Attachments.NodeHooks, ", ")))
	return nil
}
