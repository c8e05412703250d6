package datapath

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Node-level hostPort hooks, attached once per node by whoever needs them
// first (an ADD with portMappings, or the agent) and pinned under
// <pinRoot>/node so they outlive that process:
//
//   - cni_from_uplink on tcx ingress and cni_to_uplink on tcx egress of every
//     uplink: the links holding a node address (not lo, not a pod's host
//     veth), Ethernet only;
//   - eight cgroup sock_addr programs on the cgroup2 root, for connections
//     the node's own processes make. A root hook sees every netns of the
//     machine; the programs act only in the netns whose cookie
//     cni_hp_config holds, the one the attaching process runs in.

// DefaultCgroupRoots are tried in order when no cgroup root is configured.
var DefaultCgroupRoots = []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}

// HostPortOptions configure the node-level hostPort hooks.
type HostPortOptions struct {
	// CgroupRoot is the cgroup2 directory the socket hooks attach to; ""
	// takes the first cgroup2 mount of DefaultCgroupRoots.
	CgroupRoot string
	// MustRefresh makes a call on a node already set up fail rather than skip
	// the address refresh when the address dump keeps being interrupted (the
	// agent, whose job the refresh is, retries; an ADD just goes on).
	MustRefresh bool
}

// NodeHooks describes the node-level hostPort hooks as set up.
type NodeHooks struct {
	NetnsCookie uint64
	CgroupRoot  string
	Uplinks     []string       // names of the links carrying the uplink programs
	NodeIPs     map[string]int // address -> ifindex, as in cni_node_ips
}

type sockHook struct {
	prog   string // C function name in bpf/sock.c
	attach ebpf.AttachType
	pin    string
}

var sockHooks = []sockHook{
	{"cni_sock_connect4", ebpf.AttachCGroupInet4Connect, "connect4"},
	{"cni_sock_sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, "sendmsg4"},
	{"cni_sock_recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, "recvmsg4"},
	{"cni_sock_peer4", ebpf.AttachCgroupInet4GetPeername, "getpeername4"},
	{"cni_sock_connect6", ebpf.AttachCGroupInet6Connect, "connect6"},
	{"cni_sock_sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, "sendmsg6"},
	{"cni_sock_recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, "recvmsg6"},
	{"cni_sock_peer6", ebpf.AttachCgroupInet6GetPeername, "getpeername6"},
}

// uplinkHook is one attach point of every uplink.
type uplinkHook struct {
	prog   string // C function name
	attach ebpf.AttachType
	pin    string // prefix of the link pin's name, before the interface name
}

var uplinkHooks = []uplinkHook{
	{"cni_from_uplink", ebpf.AttachTCXIngress, "uplink_"},
	{"cni_to_uplink", ebpf.AttachTCXEgress, "uplink-egress_"},
}

// NodeHookDir is where the node-level hook links are pinned (not under
// links/, whose entries GC matches to host veths).
func NodeHookDir(pinRoot string) string { return filepath.Join(pinRoot, "node") }

func cgroupPinPath(pinRoot, name string) string {
	return filepath.Join(NodeHookDir(pinRoot), "cgroup_"+name)
}

func uplinkPinPath(pinRoot string, h uplinkHook, ifname string) string {
	return filepath.Join(NodeHookDir(pinRoot), h.pin+ifname)
}

// hooksID identifies this build's node programs, so a node whose hooks a
// different build attached takes the slow path and updates them.
func hooksID() uint32 {
	h := sha256.New()
	h.Write(_FromUplinkBytes)
	h.Write(_ToUplinkBytes)
	h.Write(_SockBytes)
	return binary.LittleEndian.Uint32(h.Sum(nil))
}

// CgroupRoot resolves the cgroup2 directory for the socket hooks.
func CgroupRoot(configured string) (string, error) {
	isV2 := func(p string) bool {
		var st unix.Statfs_t
		return unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
	}
	if configured != "" {
		if !isV2(configured) {
			return "", fmt.Errorf("cgroupRoot %s is not a cgroup2 directory", configured)
		}
		return configured, nil
	}
	for _, p := range DefaultCgroupRoots {
		if isV2(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("no cgroup2 mount at %s (set cgroupRoot)", strings.Join(DefaultCgroupRoots, " or "))
}

var errDumpBusy = errors.New("list node addresses: the address dump kept being interrupted by changes")

// nodeView is what discovery found in the current netns.
type nodeView struct {
	addrs   map[string]int // node address -> ifindex
	uplinks map[string]int // uplink name -> ifindex
}

// discoverNode lists the node's addresses as the hostPort programs need
// them: every address of every link, but loopback (127.0.0.0/8 and ::1:
// the socket hooks know those) and link-local ones, so pods' host veths
// (link-local only) drop out by themselves. Uplinks are the Ethernet links
// other than lo holding any of them.
//
// A dump is interrupted when addresses change meanwhile, which pods coming
// and going (their veths' link-local addresses) do all the time on a busy
// node: it is retried up to attempts times, then errDumpBusy is returned.
func discoverNode(attempts int) (*nodeView, error) {
	var (
		addrs []netlink.Addr
		err   error
	)
	for i := 0; i < attempts; i++ {
		if i > 0 {
			time.Sleep(time.Duration(i) * 5 * time.Millisecond)
		}
		addrs, err = netlink.AddrList(nil, netlink.FAMILY_ALL)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, errDumpBusy
	}
	if err != nil {
		return nil, fmt.Errorf("list node addresses: %w", err)
	}
	v := &nodeView{addrs: map[string]int{}, uplinks: map[string]int{}}
	candidates := map[int]bool{}
	for _, a := range addrs {
		ip := a.IP
		if ip == nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() || ip.IsUnspecified() {
			continue
		}
		v.addrs[ip.String()] = a.LinkIndex
		candidates[a.LinkIndex] = true
	}
	for idx := range candidates {
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			continue // gone meanwhile
		}
		at := l.Attrs()
		if at.Flags&net.FlagLoopback != 0 || at.EncapType != "ether" {
			continue
		}
		v.uplinks[at.Name] = idx
	}
	return v, nil
}

func (v *nodeView) uplinkNames() []string {
	out := make([]string, 0, len(v.uplinks))
	for n := range v.uplinks {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// EnsureHostPorts sets up the node-level hostPort hooks if they are not
// (idempotent, safe from concurrent processes) and refreshes cni_node_ips.
// It must run in the node's network namespace. Once set up, a call costs
// an address listing and a few stats.
func (dp *Datapath) EnsureHostPorts(opts HostPortOptions) (*NodeHooks, error) {
	cookie, err := NetnsCookie()
	if err != nil {
		return nil, err
	}
	// Without a cgroup2 mount the socket hooks (node-local clients) cannot be
	// attached, but remote clients via the uplinks still can be served: set
	// those up and report the rest.
	root, rootErr := CgroupRoot(opts.CgroupRoot)
	if rootErr != nil {
		rootErr = fmt.Errorf("hostPort socket hooks for node-local clients not attached: %w", rootErr)
	}
	cfg, err := dp.Maps.HostPortConfig()
	if err != nil {
		return nil, fmt.Errorf("read hostPort config: %w", err)
	}
	if cfg.Enabled() && cfg.NetnsCookie != cookie {
		return nil, fmt.Errorf("pin directory %s serves another network namespace (cookie %d, this one is %d): each node needs its own pinDir",
			dp.PinRoot, cfg.NetnsCookie, cookie)
	}
	ready := cfg.Enabled() && cfg.HooksId == hooksID() && dp.cgroupHooksLive(rootErr == nil)
	attempts := 20
	if ready && !opts.MustRefresh {
		attempts = 3
	}
	view, err := discoverNode(attempts)
	if errors.Is(err, errDumpBusy) && ready && !opts.MustRefresh {
		// Set up already; the addresses are refreshed by the next ADD or the agent.
		return &NodeHooks{NetnsCookie: cookie, CgroupRoot: root}, rootErr
	}
	if err != nil {
		return nil, err
	}
	hooks := &NodeHooks{NetnsCookie: cookie, CgroupRoot: root, Uplinks: view.uplinkNames(), NodeIPs: view.addrs}
	if ready && dp.uplinkHooksLive(view) {
		// Fast path: only the addresses can have changed.
		if err := dp.Maps.SyncNodeIPs(view.addrs); err != nil {
			return nil, err
		}
		return hooks, rootErr
	}

	unlock, err := lockDir(dp.PinRoot)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := dp.Maps.SyncNodeIPs(view.addrs); err != nil {
		return nil, err
	}
	// Whoever held the lock before may have done it all.
	if cfg, err = dp.Maps.HostPortConfig(); err == nil && cfg.Enabled() && cfg.NetnsCookie == cookie &&
		cfg.HooksId == hooksID() && dp.cgroupHooksLive(rootErr == nil) && dp.uplinkHooksLive(view) {
		return hooks, rootErr
	}
	progs, err := dp.nodePrograms()
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, p := range progs {
			p.Close()
		}
	}()
	if err := os.MkdirAll(NodeHookDir(dp.PinRoot), 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", NodeHookDir(dp.PinRoot), err)
	}
	if err := syncUplinks(dp.PinRoot, progs, view.uplinks); err != nil {
		return nil, err
	}
	for _, h := range sockHooks {
		if rootErr != nil {
			break
		}
		if err := ensureCgroupHook(dp.PinRoot, root, h, progs[h.prog]); err != nil {
			return nil, err
		}
	}
	if err := dp.Maps.EnableHostPorts(cookie, hooksID()); err != nil {
		return nil, err
	}
	return hooks, rootErr
}

// cgroupHooksLive and uplinkHooksLive are the fast path's check, made on
// the kernel's objects, never on the pin files alone: every hook's pinned
// link is still attached, an uplink's to the device that has that name now
// (a re-created uplink has a new ifindex and needs its programs again).
// Without a cgroup2 mount (want false) the socket hooks cannot be there.
func (dp *Datapath) cgroupHooksLive(want bool) bool {
	if !want {
		return true
	}
	for _, h := range sockHooks {
		info, err := pinnedLinkInfo(cgroupPinPath(dp.PinRoot, h.pin))
		if err != nil {
			return false
		}
		if c := info.Cgroup(); c == nil || c.CgroupId == 0 {
			return false
		}
	}
	return true
}

func (dp *Datapath) uplinkHooksLive(view *nodeView) bool {
	for name, idx := range view.uplinks {
		for _, h := range uplinkHooks {
			info, err := pinnedLinkInfo(uplinkPinPath(dp.PinRoot, h, name))
			if err != nil || info.TCX() == nil || int(info.TCX().Ifindex) != idx {
				return false
			}
		}
	}
	return true
}

func pinnedLinkInfo(path string) (*link.Info, error) {
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	return l.Info()
}

// nodePrograms opens (loading and pinning on first use) the uplink and
// socket programs. Call with the pin directory locked.
func (dp *Datapath) nodePrograms() (map[string]*ebpf.Program, error) {
	out := map[string]*ebpf.Program{}
	objs := []struct {
		load  func() (*ebpf.CollectionSpec, error)
		obj   []byte
		names []string
	}{
		{loadFromUplink, _FromUplinkBytes, []string{"cni_from_uplink"}},
		{loadToUplink, _ToUplinkBytes, []string{"cni_to_uplink"}},
		{loadSock, _SockBytes, func() []string {
			var n []string
			for _, h := range sockHooks {
				n = append(n, h.prog)
			}
			return n
		}()},
	}
	closeAll := func() {
		for _, p := range out {
			p.Close()
		}
	}
	if err := os.MkdirAll(filepath.Join(dp.PinRoot, "progs"), 0o700); err != nil {
		return nil, fmt.Errorf("create program pin directory: %w", err)
	}
	for _, o := range objs {
		var missing []string
		for _, n := range o.names {
			p, err := ebpf.LoadPinnedProgram(progPinPath(dp.PinRoot, progDef{n, o.load, o.obj}), nil)
			if err != nil {
				missing = append(missing, n)
				continue
			}
			out[n] = p
		}
		if len(missing) == 0 {
			continue
		}
		spec, err := o.load()
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("parse embedded program %s: %w", missing[0], err)
		}
		repl := make(map[string]*ebpf.Map)
		for name := range spec.Maps {
			pinned := dp.Maps.Map(name)
			if pinned == nil {
				closeAll()
				return nil, fmt.Errorf("program %s uses map %s, which pkg/maps does not pin", missing[0], name)
			}
			repl[name] = pinned
		}
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
		if err != nil {
			closeAll()
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				return nil, fmt.Errorf("load program %s: %+v", missing[0], ve)
			}
			return nil, fmt.Errorf("load program %s: %w", missing[0], err)
		}
		for _, n := range missing {
			p := coll.DetachProgram(n)
			if p == nil {
				coll.Close()
				closeAll()
				return nil, fmt.Errorf("embedded object lacks program %s", n)
			}
			path := progPinPath(dp.PinRoot, progDef{n, o.load, o.obj})
			if err := p.Pin(path); err != nil {
				p.Close()
				coll.Close()
				closeAll()
				return nil, fmt.Errorf("pin program %s at %s: %w", n, path, err)
			}
			out[n] = p
		}
		coll.Close()
	}
	return out, nil
}

// ensureCgroupHook makes the pinned cgroup link of h run prog.
func ensureCgroupHook(pinRoot, cgroupRoot string, h sockHook, prog *ebpf.Program) error {
	path := cgroupPinPath(pinRoot, h.pin)
	want, err := progID(prog)
	if err != nil {
		return err
	}
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		defer l.Close()
		info, err := l.Info()
		if err == nil && info.Program == want {
			return nil
		}
		if err == nil {
			if err := l.Update(prog); err == nil {
				return nil
			}
		}
		// Unusable: drop it and attach afresh.
		_ = l.Unpin()
	} else if !errors.Is(err, os.ErrNotExist) {
		os.Remove(path)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupRoot, Attach: h.attach, Program: prog})
	if err != nil {
		return fmt.Errorf("attach %s to cgroup %s: %w", h.prog, cgroupRoot, err)
	}
	defer l.Close()
	if err := l.Pin(path); err != nil {
		return fmt.Errorf("pin cgroup link %s: %w", path, err)
	}
	return nil
}

// syncUplinks makes the uplink programs run on tcx ingress and egress of
// exactly the given links (name -> ifindex), each as a pinned link.
func syncUplinks(pinRoot string, progs map[string]*ebpf.Program, uplinks map[string]int) error {
	// Drop pins of links that are gone or no longer uplinks.
	ents, _ := os.ReadDir(NodeHookDir(pinRoot))
	for _, e := range ents {
		for _, h := range uplinkHooks {
			name, ok := strings.CutPrefix(e.Name(), h.pin)
			if !ok {
				continue
			}
			if _, keep := uplinks[name]; !keep {
				dropLinkPin(filepath.Join(NodeHookDir(pinRoot), e.Name()))
			}
		}
	}
	for name, idx := range uplinks {
		for _, h := range uplinkHooks {
			if err := ensureUplinkHook(pinRoot, h, progs[h.prog], name, idx); err != nil {
				return err
			}
		}
	}
	return nil
}

// ensureUplinkHook makes the pinned link of hook h of uplink name run prog
// on the device that has that name now (ifindex idx).
func ensureUplinkHook(pinRoot string, h uplinkHook, prog *ebpf.Program, name string, idx int) error {
	want, err := progID(prog)
	if err != nil {
		return err
	}
	path := uplinkPinPath(pinRoot, h, name)
	ours := want
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		info, ierr := l.Info()
		if ierr == nil && info.TCX() != nil && int(info.TCX().Ifindex) == idx {
			if info.Program == want {
				l.Close()
				return nil
			}
			if err := l.Update(prog); err == nil {
				l.Close()
				return nil
			}
			ours = info.Program
		}
		// A link of an earlier device of this name, or unusable.
		l.Unpin()
		l.Close()
	} else {
		os.Remove(path)
	}
	if err := foreignUplinkProgram(h, idx, name, want, ours); err != nil {
		return err
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: idx, Program: prog, Attach: h.attach})
	if err != nil {
		return fmt.Errorf("attach %s to tcx %s of uplink %s: %w", h.prog, h.attach, name, err)
	}
	err = l.Pin(path)
	l.Close()
	if err != nil {
		return fmt.Errorf("pin uplink link %s: %w", path, err)
	}
	return nil
}

// foreignUplinkProgram refuses a second pin directory in one network
// namespace: its uplink programs would keep their own hostPorts and
// masquerade ports, and answer for flows of the other. An uplink hook
// already running a program of ours by name that is neither this build's
// (want) nor the one our pinned link ran (ours) belongs to another pinDir.
func foreignUplinkProgram(h uplinkHook, idx int, name string, want, ours ebpf.ProgramID) error {
	res, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: h.attach})
	if err != nil {
		return fmt.Errorf("list tcx %s programs of uplink %s: %w", h.attach, name, err)
	}
	for _, p := range res.Programs {
		if p.ID == want || p.ID == ours {
			continue
		}
		prog, err := ebpf.NewProgramFromID(p.ID)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := prog.Info()
		prog.Close()
		if err == nil && info.Name == kernelProgName(h.prog) {
			return fmt.Errorf("uplink %s already runs %s (program id %d) of another pin directory: "+
				"one pinDir serves a network namespace (give every network of this node the same pinDir)", name, h.prog, p.ID)
		}
	}
	return nil
}

// kernelProgName is the name the kernel keeps of a program (BPF_OBJ_NAME_LEN).
func kernelProgName(n string) string {
	if len(n) > 15 {
		return n[:15]
	}
	return n
}

func dropLinkPin(path string) {
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		l.Unpin()
		l.Close()
		return
	}
	os.Remove(path)
}

// CheckHostPorts verifies that the node-level hooks are in place: enabled
// for this netns, every socket hook attached to the cgroup root, and the
// uplink program on every uplink. The error names the first problem.
func (dp *Datapath) CheckHostPorts(opts HostPortOptions) error {
	cookie, err := NetnsCookie()
	if err != nil {
		return err
	}
	cfg, err := dp.Maps.HostPortConfig()
	if err != nil {
		return fmt.Errorf("read hostPort config: %w", err)
	}
	if !cfg.Enabled() {
		return errors.New("hostPort hooks are not set up on this node")
	}
	if cfg.NetnsCookie != cookie {
		return fmt.Errorf("hostPort hooks serve netns cookie %d, not this netns (%d)", cfg.NetnsCookie, cookie)
	}
	for _, h := range sockHooks {
		path := cgroupPinPath(dp.PinRoot, h.pin)
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			return fmt.Errorf("socket hook %s: %w", h.pin, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			return fmt.Errorf("socket hook %s: %w", h.pin, err)
		}
		if c := info.Cgroup(); c == nil || c.CgroupId == 0 {
			return fmt.Errorf("socket hook %s is not attached to a cgroup", h.pin)
		}
	}
	view, err := discoverNode(20)
	if err != nil {
		return err
	}
	for name, idx := range view.uplinks {
		for _, h := range uplinkHooks {
			info, err := pinnedLinkInfo(uplinkPinPath(dp.PinRoot, h, name))
			if err != nil {
				return fmt.Errorf("uplink %s has no %s program: %w", name, h.prog, err)
			}
			if info.TCX() == nil || int(info.TCX().Ifindex) != idx {
				return fmt.Errorf("uplink %s: %s is not attached to it", name, h.prog)
			}
		}
	}
	return nil
}
