package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// Kernel features the datapath uses beyond what every kernel it runs on
// has. Each is probed once per process, when the datapath is loaded or
// inspected (never per packet, never on a verb's fast path), and reported
// by `ebpf-agent status` and the STATUS verb: what is in use, what is
// missing and what replaces it. Nothing falls back silently.
//
// EBPF_CNI_FORCE_FALLBACK (a comma-separated list of the names below, or
// "all") makes the datapath take the fallback of a feature the kernel has,
// so the paths of older kernels are exercised on a new one. Every process
// of a node (the plugin, the agent) must be given the same list.

// ForceFallbackEnv names the environment variable that forces fallbacks.
const ForceFallbackEnv = "EBPF_CNI_FORCE_FALLBACK"

// Feature names, as EBPF_CNI_FORCE_FALLBACK and the reports spell them.
const (
	FeatTCX          = "tcx"
	FeatFibSrc       = "fibsrc"
	FeatRedirectPeer = "redirect_peer"
	FeatRedirectNeig = "redirect_neigh"
	FeatTimer        = "bpf_timer"
	FeatLoop         = "bpf_loop"
	FeatSockAddr     = "cgroup_sock_addr"
	FeatSockOpsNetns = "sockops_netns_cookie"
	FeatNetnsCookie  = "so_netns_cookie"
	FeatReadKernel   = "probe_read_kernel"
)

// Feature is one kernel facility, as probed.
type Feature struct {
	Name     string `json:"name"`
	Kernel   string `json:"kernel"`             // first mainline release with it
	Probe    string `json:"probe"`              // what decides
	Fallback string `json:"fallback,omitempty"` // what replaces it; "" when required
	Have     bool   `json:"have"`               // the kernel has it
	Forced   bool   `json:"forced,omitempty"`   // EBPF_CNI_FORCE_FALLBACK names it
	Err      string `json:"error,omitempty"`    // a probe that failed for another reason
}

// InUse tells whether the datapath uses the feature (the kernel has it and
// its fallback is not forced).
func (f Feature) InUse() bool { return f.Have && !f.Forced }

// Missing tells whether a feature without fallback is absent.
func (f Feature) Missing() bool { return !f.Have && f.Fallback == "" }

// featureTable is the table of docs/compat.md, in its order.
var featureTable = []Feature{
	{Name: FeatRedirectPeer, Kernel: "5.10", Probe: "bpf_redirect_peer helper in a sched_cls program (cilium/ebpf features.HaveProgramHelper)"},
	{Name: FeatRedirectNeig, Kernel: "5.10", Probe: "bpf_redirect_neigh helper in a sched_cls program"},
	{Name: FeatTimer, Kernel: "5.15", Probe: "bpf_timer_init helper in a sched_cls program",
		Fallback: "the compat build (with bpf_loop's): no flow timers; a flow past its timeout is treated as absent, its entry freed by a port probe or the LRU"},
	{Name: FeatLoop, Kernel: "5.17", Probe: "bpf_loop helper in a sched_cls program",
		Fallback: "the compat build (with bpf_timer's): masquerade's port probes in a bounded loop"},
	{Name: FeatSockOpsNetns, Kernel: "5.15", Probe: "bpf_get_netns_cookie helper in a sock_ops program",
		Fallback: "no TCP pacing program: rate limits hold as token buckets alone (docs/bandwidth.md)"},
	{Name: FeatNetnsCookie, Kernel: "5.14", Probe: "getsockopt(SO_NETNS_COOKIE) (how the node hooks and pacing learn the node's and the pods' netns)",
		Fallback: "a cgroup connect4 program (bpf_get_netns_cookie, 5.7) attached for an instant to the process's cgroup learns the node's netns cookie; pods' cookies are not recorded without pacing (DEL then trusts CNI_NETNS)"},
	{Name: FeatSockAddr, Kernel: "4.17", Probe: "cgroup_sock_addr program type, and a cgroup2 mount",
		Fallback: "hostPorts are served to remote clients only (not to the node's own processes); no TCP pacing"},
	{Name: FeatReadKernel, Kernel: "5.13", Probe: "bpf_probe_read_kernel helper in a sched_cls program (needs CAP_PERFMON; refused under lockdown=confidentiality)",
		Fallback: "the compat build (with bpf_timer's and bpf_loop's): no conntrack read, so NetworkPolicy sees kube-proxy's masqueraded traffic by the node address it carries (docs/networkpolicy.md)"},
	{Name: FeatTCX, Kernel: "6.6", Probe: "BPF_PROG_QUERY of tcx egress on lo",
		Fallback: "clsact qdisc + direct-action cls_bpf filters, on host veths and uplinks"},
	{Name: FeatFibSrc, Kernel: "6.7", Probe: "a test run of bpf_fib_lookup with BPF_FIB_LOOKUP_SRC (-EINVAL without it)",
		Fallback: "masquerade source: the first address of the family on the uplink the FIB picks (route prefsrc not honoured)"},
}

// forcible are the features whose fallback EBPF_CNI_FORCE_FALLBACK can force.
var forcible = map[string]bool{FeatTCX: true, FeatFibSrc: true, FeatTimer: true, FeatLoop: true, FeatReadKernel: true, FeatSockOpsNetns: true, FeatNetnsCookie: true}

var (
	forceOnce sync.Once
	forced    map[string]bool
	forceErr  error
)

// Forced returns the fallbacks EBPF_CNI_FORCE_FALLBACK forces; an unknown
// name is an error (reported by status and the agent, never ignored there).
func Forced() (map[string]bool, error) {
	forceOnce.Do(func() {
		forced = map[string]bool{}
		for _, n := range strings.Split(os.Getenv(ForceFallbackEnv), ",") {
			n = strings.TrimSpace(n)
			switch {
			case n == "":
			case n == "all":
				for f := range forcible {
					forced[f] = true
				}
			case n == FeatTimer || n == FeatLoop || n == FeatReadKernel:
				// One compat build replaces all three.
				forced[FeatTimer], forced[FeatLoop], forced[FeatReadKernel] = true, true, true
			case forcible[n]:
				forced[n] = true
			default:
				names := make([]string, 0, len(forcible))
				for f := range forcible {
					names = append(names, f)
				}
				sort.Strings(names)
				forceErr = fmt.Errorf("%s: %q has no fallback to force (known: %s, all)", ForceFallbackEnv, n, strings.Join(names, ", "))
			}
		}
	})
	return forced, forceErr
}

func isForced(name string) bool {
	f, _ := Forced()
	return f[name]
}

var (
	probeOnce sync.Once
	probed    []Feature
)

// Features probes every feature of the table, once per process.
func Features() []Feature {
	probeOnce.Do(func() {
		for _, f := range featureTable {
			var err error
			switch f.Name {
			case FeatRedirectPeer:
				err = features.HaveProgramHelper(ebpf.SchedCLS, asm.FnRedirectPeer)
			case FeatRedirectNeig:
				err = features.HaveProgramHelper(ebpf.SchedCLS, asm.FnRedirectNeigh)
			case FeatTimer:
				err = features.HaveProgramHelper(ebpf.SchedCLS, asm.FnTimerInit)
			case FeatLoop:
				err = features.HaveProgramHelper(ebpf.SchedCLS, asm.FnLoop)
			case FeatReadKernel:
				err = features.HaveProgramHelper(ebpf.SchedCLS, asm.FnProbeReadKernel)
			case FeatSockOpsNetns:
				err = features.HaveProgramHelper(ebpf.SockOps, asm.FnGetNetnsCookie)
			case FeatNetnsCookie:
				if _, err = soNetnsCookie(); err != nil && errors.Is(err, unix.ENOPROTOOPT) {
					err = ebpf.ErrNotSupported
				}
			case FeatSockAddr:
				if err = features.HaveProgramType(ebpf.CGroupSockAddr); err == nil {
					_, err = CgroupRoot("")
				}
			case FeatTCX:
				err = kernelHasTCX()
			case FeatFibSrc:
				err = probeFibSrc()
			}
			f.Have = err == nil
			if err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
				f.Err = err.Error()
			}
			if f.Name == FeatReadKernel && f.Have {
				// The helper alone reads nothing: say so when there is no
				// nf_conn to relocate the read against.
				if err := conntrackBTF(); err != nil {
					f.Err = err.Error()
				}
			}
			f.Forced = f.Have && isForced(f.Name)
			if f.Name == FeatNetnsCookie && !f.InUse() {
				// Its fallback needs a cgroup2 mount: say so here, not at an ADD.
				if _, err := bpfNetnsCookie(); err != nil {
					f.Err = "the fallback fails: " + err.Error()
				}
			}
			probed = append(probed, f)
		}
	})
	return probed
}

// FeatureByName is the probed feature of that name.
func FeatureByName(name string) Feature {
	for _, f := range Features() {
		if f.Name == name {
			return f
		}
	}
	return Feature{Name: name}
}

// MissingRequired names the features without fallback the kernel lacks,
// with their kernel version ("bpf_loop (5.17)"), for the errors of a
// datapath that cannot load.
func MissingRequired() []string {
	var out []string
	for _, f := range Features() {
		if f.Missing() {
			out = append(out, fmt.Sprintf("%s (%s)", f.Name, f.Kernel))
		}
	}
	return out
}

// FallbackSummary is one line naming what the datapath uses and what it
// replaces: "in use: tcx, fibsrc; fallback: none; missing: none".
func FallbackSummary() string {
	var use, fb, miss []string
	for _, f := range Features() {
		switch {
		case f.InUse():
			use = append(use, f.Name)
		case f.Fallback != "" && f.Forced:
			fb = append(fb, f.Name+" (forced"+errNote(f.Err, "; ")+")")
		case f.Fallback != "":
			fb = append(fb, f.Name+errNote(f.Err, " ("))
		default:
			miss = append(miss, f.Name+" (needs "+f.Kernel+")")
		}
	}
	none := func(s []string) string {
		if len(s) == 0 {
			return "none"
		}
		return strings.Join(s, ", ")
	}
	return fmt.Sprintf("kernel features in use: %s; fallback for: %s; missing: %s", none(use), none(fb), none(miss))
}

// errNote is err after sep ("; err" or " (err)"), or "" without one.
func errNote(err, sep string) string {
	switch {
	case err == "":
		return ""
	case sep == " (":
		return " (" + err + ")"
	}
	return sep + err
}

// conntrackBTF tells whether the kernel's BTF has struct nf_conn, which the
// conntrack read (bpf/lib/nfct.h) is relocated against when the programs
// load: vmlinux's when conntrack is built in, else the nf_conntrack
// module's, only while that module is loaded. Without it the read is
// relocated away and NetworkPolicy judges masqueraded traffic by the node
// address it carries until the programs are loaded again.
func conntrackBTF() error {
	const why = "struct nf_conn is in no kernel BTF (nf_conntrack not loaded?): until the programs are loaded again, NetworkPolicy judges masqueraded traffic by its node address"
	var ct *btf.Struct
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("%s: kernel BTF: %w", why, err)
	}
	if spec.TypeByName("nf_conn", &ct) == nil {
		return nil
	}
	mod, err := btf.LoadKernelModuleSpec("nf_conntrack")
	if err != nil || mod.TypeByName("nf_conn", &ct) != nil {
		return errors.New(why)
	}
	return nil
}

// probeFibSrc runs bpf_fib_lookup with BPF_FIB_LOOKUP_SRC once (a test run
// on lo): kernels without the flag refuse it with -EINVAL before looking.
func probeFibSrc() error { return probeFibFlag(1 << 4) }

// probeFibFlag tells whether bpf_fib_lookup takes flag.
func probeFibFlag(flag int32) error {
	const (
		fibParamsSize = 64
		afInet        = 2
		einval        = 22
	)
	insns := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1), asm.Mov.Imm(asm.R0, 0)}
	for off := int16(-fibParamsSize); off < 0; off += 8 {
		insns = append(insns, asm.StoreMem(asm.RFP, off, asm.R0, asm.DWord))
	}
	insns = append(insns,
		asm.Mov.Imm(asm.R0, afInet),
		asm.StoreMem(asm.RFP, -fibParamsSize, asm.R0, asm.Byte), // family
		asm.Mov.Imm(asm.R0, 1),
		asm.StoreMem(asm.RFP, -fibParamsSize+8, asm.R0, asm.Word), // ifindex: lo
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -fibParamsSize),
		asm.Mov.Imm(asm.R3, fibParamsSize),
		asm.Mov.Imm(asm.R4, flag),
		asm.FnFibLookup.Call(),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: insns})
	if err != nil {
		return fmt.Errorf("load the BPF_FIB_LOOKUP_SRC probe: %w", err)
	}
	defer prog.Close()
	ret, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
	if err != nil {
		return fmt.Errorf("run the BPF_FIB_LOOKUP_SRC probe: %w", err)
	}
	if int32(ret) == -einval {
		return ebpf.ErrNotSupported
	}
	return nil
}

// The build a node runs is decided once, by the first process that loads
// its datapath, and recorded under pinDir as an empty directory (bpffs
// holds no files), so later verbs read it with one stat instead of probing.
const (
	markerCompat   = "build-compat"
	markerFull     = "build-full"
	markerNoPacing = "pacing-off"
	markerPacing   = "pacing-on"
)

var (
	choiceMu    sync.Mutex
	choiceCache = map[string]bool{}
)

// nodeChoice is a per-node decision made once: forced (true wins), else
// the marker directory under pinRoot (yes or no) a process recorded, else
// decide() (probes), recorded for the next processes.
func nodeChoice(pinRoot, yes, no string, forced bool, decide func() bool) bool {
	choiceMu.Lock()
	defer choiceMu.Unlock()
	key := pinRoot + "\x00" + yes
	if c, ok := choiceCache[key]; ok {
		return c
	}
	c := forced
	if !c {
		switch {
		case dirExists(filepath.Join(pinRoot, yes)):
			c = true
		case dirExists(filepath.Join(pinRoot, no)):
		default:
			c = decide()
			marker := no
			if c {
				marker = yes
			}
			// Only on bpffs (a pinDir elsewhere is refused by every verb);
			// pinRoot may not exist yet: decided again then.
			var st unix.Statfs_t
			if unix.Statfs(pinRoot, &st) == nil && st.Type == unix.BPF_FS_MAGIC {
				_ = os.Mkdir(filepath.Join(pinRoot, marker), 0o700)
			}
		}
	}
	choiceCache[key] = c
	return c
}

// CompatBuild tells whether the node at pinRoot runs the compat build of
// the programs (EBPF_CNI_COMPAT: no bpf_timer, no bpf_loop, no conntrack
// read): where the kernel lacks one of them for sched_cls, or
// EBPF_CNI_FORCE_FALLBACK names one.
func CompatBuild(pinRoot string) bool {
	forced := isForced(FeatTimer) || isForced(FeatLoop) || isForced(FeatReadKernel)
	return nodeChoice(pinRoot, markerCompat, markerFull, forced, func() bool {
		return !FeatureByName(FeatTimer).Have || !FeatureByName(FeatLoop).Have || !FeatureByName(FeatReadKernel).Have
	})
}

// NoPacing tells whether the node at pinRoot goes without the TCP pacing
// program (the kernel's sock_ops lacks bpf_get_netns_cookie, or it is
// forced off): rate limits hold as token buckets alone.
func NoPacing(pinRoot string) bool {
	return nodeChoice(pinRoot, markerNoPacing, markerPacing, isForced(FeatSockOpsNetns), func() bool {
		return !FeatureByName(FeatSockOpsNetns).Have
	})
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
