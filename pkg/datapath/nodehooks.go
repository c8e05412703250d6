package datapath

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Node hooks, attached once per node by whoever needs them first (an ADD
// with portMappings or ipMasq, or the agent) and pinned under node/ so they
// outlive that process:
//
//   - cni_from_uplink on tcx ingress and cni_to_uplink on tcx egress of every
//     uplink: the links holding a node address (not lo, not a pod's host
//     veth), Ethernet only;
//   - eight cgroup sock_addr programs on the cgroup2 root, for hostPort
//     connections the node's own processes make. A root hook sees every
//     netns of the machine; the programs act only in the netns whose cookie
//     cni_hp_config holds, the one the attaching process runs in;
//   - the sock_ops pacing program on the cgroup2 root (EnsurePacing), with
//     the first bandwidth limit.

// DefaultCgroupRoots are tried in order when no cgroup root is configured.
var DefaultCgroupRoots = []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}

// NodeHookOptions configure the node hooks.
type NodeHookOptions struct {
	// CgroupRoot is the cgroup2 directory the socket hooks attach to; ""
	// takes the first cgroup2 mount of DefaultCgroupRoots.
	CgroupRoot string
	// MustRefresh makes a call on a node already set up fail rather than skip
	// the address refresh when the address dump keeps being interrupted (the
	// agent, whose job the refresh is, retries; an ADD just goes on).
	MustRefresh bool
}

// NodeHooks describes the node hooks as set up.
type NodeHooks struct {
	NetnsCookie uint64
	CgroupRoot  string
	Uplinks     []string       // names of the links carrying the uplink programs
	NodeIPs     map[string]int // address -> ifindex, as in cni_node_ips
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
	// sources are masquerade's source per uplink ifindex, one per family,
	// where BPF_FIB_LOOKUP_SRC is missing: the uplink's first usable
	// address of the family in the kernel's order (its primary IPv4).
	sources map[int][]net.IP
}

// discoverNode lists the node's addresses as the hostPort programs need
// them: every address of every link, but loopback (127.0.0.0/8 and ::1:
// the socket hooks know those) and IPv6 link-local ones, so pods' host
// veths (link-local only) drop out by themselves. Uplinks are the Ethernet
// links other than lo holding any of them but IPv4 link-local ones.
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
		// lint:raw-netlink-dump: an interrupted dump must be known as one
		// (netlinksafe returns its possibly half list without saying so).
		addrs, err = netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
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
	v := &nodeView{addrs: map[string]int{}, uplinks: map[string]int{}, sources: map[int][]net.IP{}}
	candidates := map[int]bool{}
	type fam struct {
		idx int
		v4  bool
	}
	firstOf := map[fam]net.IP{}
	// The tunnel device holds an address for the masquerade's source
	// into it (the agent's syncTunnelAddrs: its pod CIDR's network
	// address, or a copy of the node's): no uplink.
	tunnel := TunnelIfindex()
	for _, a := range addrs {
		ip := a.IP
		if ip == nil || ip.IsLoopback() || ip.IsMulticast() || ip.IsUnspecified() || (tunnel != 0 && a.LinkIndex == tunnel) {
			continue
		}
		if ip.IsLinkLocalUnicast() {
			// An IPv4 one (node-local DNS's 169.254.20.10) is the node's as
			// any other: a pod's packet to it is delivered, not forwarded,
			// so its egress policy is judged before (lib/policy.h). It
			// makes no uplink. IPv6 ones are each link's own.
			if ip.To4() != nil {
				v.addrs[ip.String()] = a.LinkIndex
			}
			continue
		}
		v.addrs[ip.String()] = a.LinkIndex
		candidates[a.LinkIndex] = true
		// The stack's own choice skips these too.
		if a.Flags&(unix.IFA_F_SECONDARY|unix.IFA_F_DEPRECATED|unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
			continue
		}
		if f := (fam{a.LinkIndex, ip.To4() != nil}); firstOf[f] == nil {
			firstOf[f] = ip
		}
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
		for _, v4 := range []bool{true, false} {
			if ip := firstOf[fam{idx, v4}]; ip != nil {
				v.sources[idx] = append(v.sources[idx], ip)
			}
		}
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

// EnsureNodeHooks sets up the node hooks if they are not (idempotent, safe
// from concurrent processes) and refreshes cni_node_ips.
// It must run in the node's network namespace. Once set up, a call costs
// an address listing and a few stats.
func (dp *Datapath) EnsureNodeHooks(opts NodeHookOptions) (*NodeHooks, error) {
	// Without a cgroup2 mount the socket hooks (node-local clients) cannot be
	// attached, but remote clients via the uplinks still can be served: set
	// those up and report the rest.
	root, rootErr := CgroupRoot(opts.CgroupRoot)
	if rootErr != nil {
		rootErr = fmt.Errorf("hostPort socket hooks for node-local clients not attached: %w", rootErr)
	}
	cookie, cfg, err := dp.nodeHookCookie(rootErr != nil)
	if err != nil {
		return nil, err
	}
	ready := dp.nodeHooksSet(cfg, cookie, rootErr == nil)
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
		// Fast path: only the addresses can have changed (and a pin set
		// of an older build may lack the uplinks in cni_after_links).
		if err := dp.syncNodeIPs(view); err != nil {
			return nil, err
		}
		if err := dp.syncAfterUplinks(view); err != nil {
			return nil, err
		}
		return hooks, rootErr
	}
	if err := dp.installNodeHooks(view, cookie, root, rootErr == nil); err != nil {
		return nil, err
	}
	return hooks, rootErr
}

// nodeHookCookie is this network namespace's cookie and the node config;
// an error when the pin directory serves another namespace. noCgroup: no
// cgroup2 mount, so a cookie that cannot be learnt keys nothing.
func (dp *Datapath) nodeHookCookie(noCgroup bool) (uint64, maps.NodeConfig, error) {
	cookie, err := NetnsCookie()
	if err != nil {
		if !noCgroup || NetnsCookieCheap() {
			return 0, maps.NodeConfig{}, err
		}
		// No SO_NETNS_COOKIE and no cgroup2 for the program that stands in:
		// the cookie keys only the socket hooks, which cannot be attached
		// either. 0 is no netns' cookie (they start at 1).
		cookie = 0
	}
	cfg, err := dp.Maps.Node().Config()
	if err != nil {
		return 0, cfg, fmt.Errorf("read hostPort config: %w", err)
	}
	if cookie == 0 && cfg.Enabled() {
		cookie = cfg.NetnsCookie // not knowable here: the hooks' own, unchecked
	}
	// 0: set up by a process that could not learn it (above); re-keyed below.
	if cfg.Enabled() && cfg.NetnsCookie != cookie && cfg.NetnsCookie != 0 {
		return 0, cfg, fmt.Errorf("pin directory %s serves another network namespace (cookie %d, this one is %d): each node needs its own pinDir",
			dp.PinRoot, cfg.NetnsCookie, cookie)
	}
	return cookie, cfg, nil
}

// nodeHooksSet: cfg says this build set the hooks up for cookie, and the
// socket hooks are live (when cgroups). Whether BPF_FIB_LOOKUP_SRC is used
// is decided (probed) when the hooks are set up; a fallback forced since
// makes them be set up again.
func (dp *Datapath) nodeHooksSet(cfg maps.NodeConfig, cookie uint64, cgroups bool) bool {
	return cfg.Enabled() && cfg.NetnsCookie == cookie && cfg.HooksId == hooksID(dp.PinRoot) && dp.cgroupHooksLive(cgroups) &&
		(!isForced(FeatFibSrc) || cfg.FibNoSrc())
}

// installNodeHooks sets the node hooks up under the pin directory's lock:
// addresses, uplink programs, socket hooks (when cgroups), then the config
// that says it is done.
func (dp *Datapath) installNodeHooks(view *nodeView, cookie uint64, root string, cgroups bool) error {
	unlock, err := lockDir(dp.PinRoot)
	if err != nil {
		return err
	}
	defer unlock()
	if err := dp.syncNodeIPs(view); err != nil {
		return err
	}
	// Whoever held the lock before may have done it all.
	if cfg, err := dp.Maps.Node().Config(); err == nil && dp.nodeHooksSet(cfg, cookie, cgroups) && dp.uplinkHooksLive(view) {
		return nil
	}
	progs, err := loadPrograms(dp.PinRoot, dp.Maps, nodeHookPrograms(), loadMissing)
	if err != nil {
		return err
	}
	defer closePrograms(progs)
	if err := syncUplinks(dp.PinRoot, progs, view.uplinks); err != nil {
		return err
	}
	if err := dp.syncAfterUplinks(view); err != nil {
		return err
	}
	crashpoint("nodehooks-uplinks") // a half-done install: uplinks attached, socket hooks not
	for _, p := range socketPrograms() {
		if !cgroups {
			break
		}
		if err := ensureCgroupHook(dp.PinRoot, root, p, progs[p.Name]); err != nil {
			return err
		}
	}
	return dp.Maps.Node().Enable(cookie, hooksID(dp.PinRoot), !FeatureByName(FeatFibSrc).InUse())
}

// syncNodeIPs writes the node's addresses and the uplinks' masquerade
// sources (kept whether or not BPF_FIB_LOOKUP_SRC is used: a few entries).
func (dp *Datapath) syncNodeIPs(view *nodeView) error {
	if err := dp.Maps.Node().SyncIPs(view.addrs); err != nil {
		return err
	}
	return dp.Maps.Node().SyncUplinkSources(view.sources)
}

// syncAfterUplinks lists the uplinks, to_uplink running on each, in
// cni_after_links: from_container defers a pod's denied egress only to a
// route leaving by a link that judges it again (bpf/lib/policy.h).
func (dp *Datapath) syncAfterUplinks(view *nodeView) error {
	idx := make([]int, 0, len(view.uplinks))
	for _, i := range view.uplinks {
		idx = append(idx, i)
	}
	return dp.Maps.Policy().SyncAfterLinks(maps.AfterLinkUplink, idx)
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
	for _, p := range socketPrograms() {
		info, err := pinnedLinkInfo(nodePin(dp.PinRoot, p, ""))
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
	tc := haveTCX() != nil
	for name, idx := range view.uplinks {
		for _, p := range uplinkPrograms() {
			if tc {
				if f, err := uplinkFilter(idx, p); err != nil || f == nil {
					return false
				}
				continue
			}
			info, err := pinnedLinkInfo(nodePin(dp.PinRoot, p, name))
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

// ensureCgroupHook makes the pinned cgroup link of p run prog.
func ensureCgroupHook(pinRoot, cgroupRoot string, p Program, prog *ebpf.Program) error {
	path := nodePin(pinRoot, p, "")
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
	if err := mkdirFor(path); err != nil {
		return err
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupRoot, Attach: p.Attach, Program: prog})
	if err != nil {
		return fmt.Errorf("attach %s to cgroup %s: %w", p.Name, cgroupRoot, err)
	}
	defer l.Close()
	if err := l.Pin(path); err != nil {
		return fmt.Errorf("pin cgroup link %s: %w", path, err)
	}
	return nil
}

// syncUplinks makes the uplink programs run on ingress and egress of
// exactly the given links (name -> ifindex): pinned tcx links, or cls_bpf
// filters where tcx is missing or forced off (uplinktc.go).
func syncUplinks(pinRoot string, progs map[string]*ebpf.Program, uplinks map[string]int) error {
	for _, p := range uplinkPrograms() {
		// Drop pins of links that are gone or no longer uplinks.
		for name, path := range uplinkPins(pinRoot, p) {
			if _, keep := uplinks[name]; !keep {
				dropLinkPin(path)
			}
		}
	}
	tc := haveTCX() != nil
	for name, idx := range uplinks {
		for _, p := range uplinkPrograms() {
			var err error
			if tc {
				err = ensureUplinkTC(pinRoot, p, progs[p.Name], name, idx)
			} else {
				err = ensureUplinkHook(pinRoot, p, progs[p.Name], name, idx)
			}
			if err != nil {
				return err
			}
		}
	}
	// Filters of links no longer uplinks, and of uplinks now on tcx links
	// (in place above: the link's verdict ends the hook before them).
	fs, err := UplinkFilters()
	if err != nil {
		return err
	}
	for _, f := range fs {
		if idx, keep := uplinks[f.Link]; !keep || idx != f.Ifindex || !tc {
			removeUplinkTC(f.Ifindex)
		}
	}
	return nil
}

// ensureUplinkHook makes the pinned link of hook p of uplink name run prog
// on the device that has that name now (ifindex idx).
func ensureUplinkHook(pinRoot string, p Program, prog *ebpf.Program, name string, idx int) error {
	want, err := progID(prog)
	if err != nil {
		return err
	}
	path := nodePin(pinRoot, p, name)
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
	if err := foreignUplinkProgram(p, idx, name, want, ours); err != nil {
		return err
	}
	if err := mkdirFor(path); err != nil {
		return err
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: idx, Program: prog, Attach: p.Attach})
	if err != nil {
		return fmt.Errorf("attach %s to tcx %s of uplink %s: %w", p.Name, p.Attach, name, err)
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
func foreignUplinkProgram(p Program, idx int, name string, want, ours ebpf.ProgramID) error {
	res, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: p.Attach})
	if err != nil {
		return fmt.Errorf("list tcx %s programs of uplink %s: %w", p.Attach, name, err)
	}
	for _, q := range res.Programs {
		if q.ID == want || q.ID == ours {
			continue
		}
		prog, err := ebpf.NewProgramFromID(q.ID)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := prog.Info()
		prog.Close()
		if err == nil && info.Name == kernelProgName(p.Name) {
			return fmt.Errorf("uplink %s already runs %s (program id %d) of another pin directory: "+
				"one pinDir serves a network namespace (give every network of this node the same pinDir)", name, p.Name, q.ID)
		}
	}
	return nil
}

// CheckNodeHooks verifies that the node hooks are in place: enabled for
// this netns, every socket hook attached to the cgroup root, and the
// uplink programs on every uplink. The error names the first problem.
func (dp *Datapath) CheckNodeHooks(opts NodeHookOptions) error {
	cookie, err := NetnsCookie()
	if err != nil {
		return err
	}
	cfg, err := dp.Maps.Node().Config()
	if err != nil {
		return fmt.Errorf("read hostPort config: %w", err)
	}
	if !cfg.Enabled() {
		return errors.New("hostPort hooks are not set up on this node")
	}
	if cfg.NetnsCookie != cookie {
		return fmt.Errorf("hostPort hooks serve netns cookie %d, not this netns (%d)", cfg.NetnsCookie, cookie)
	}
	for _, p := range socketPrograms() {
		info, err := pinnedLinkInfo(nodePin(dp.PinRoot, p, ""))
		if err != nil {
			return fmt.Errorf("socket hook %s: %w", p.Link, err)
		}
		if c := info.Cgroup(); c == nil || c.CgroupId == 0 {
			return fmt.Errorf("socket hook %s is not attached to a cgroup", p.Link)
		}
	}
	view, err := discoverNode(20)
	if err != nil {
		return err
	}
	tc := haveTCX() != nil
	for name, idx := range view.uplinks {
		for _, p := range uplinkPrograms() {
			if tc {
				f, err := uplinkFilter(idx, p)
				if err != nil || f == nil {
					return fmt.Errorf("uplink %s has no %s filter %s (tcx missing or forced off): %v", name, p.Name, uplinkFilterName(p), err)
				}
				continue
			}
			info, err := pinnedLinkInfo(nodePin(dp.PinRoot, p, name))
			if err != nil {
				return fmt.Errorf("uplink %s has no %s program: %w", name, p.Name, err)
			}
			if info.TCX() == nil || int(info.TCX().Ifindex) != idx {
				return fmt.Errorf("uplink %s: %s is not attached to it", name, p.Name)
			}
		}
	}
	return nil
}

// EnsurePacing attaches the sock_ops program to the cgroup2 root once per
// node (a pinned link, so it outlives the process) and registers the calling
// thread's netns as the node's. Cheap when already done: one stat.
func (dp *Datapath) EnsurePacing(cgroupRoot string) error {
	if NoPacing(dp.PinRoot) {
		return nil // token buckets alone (features.go, status says so)
	}
	path := PacingLinkPin(dp.PinRoot)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	unlock, err := lockDir(dp.PinRoot)
	if err != nil {
		return err
	}
	defer unlock()
	// A node an older build set up has the link under links/: moved, not
	// attached twice.
	if err := migratePacingPin(dp.PinRoot); err != nil {
		return err
	}
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	root, err := CgroupRoot(cgroupRoot)
	if err != nil {
		return err
	}
	cookie, err := NetnsCookie()
	if err != nil {
		return err
	}
	if err := dp.Maps.Bandwidth().PutNetns(cookie, 0, maps.FlagNetnsNode); err != nil {
		return err
	}
	if err := mkdirFor(path); err != nil {
		return err
	}
	prog, err := dp.program(progSockOps)
	if err != nil {
		return err
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: root, Attach: progSockOps.Attach, Program: prog})
	if err != nil {
		return fmt.Errorf("attach sock_ops to cgroup %s: %w", root, err)
	}
	defer l.Close()
	if err := l.Pin(path); err != nil {
		return fmt.Errorf("pin sock_ops link at %s: %w", path, err)
	}
	return nil
}
