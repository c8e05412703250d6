package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// UninstallOptions configure `ebpf-agent uninstall`.
type UninstallOptions struct {
	Options // PinRoot, StateDir, ConfDir, CNIPath, CgroupRoot
	// ConfFiles are conflists to remove besides those in ConfDir whose
	// ebpf-cni plugin uses PinRoot (the agent's rendered conflist is one of
	// those; a template's base name names it when its networks cannot be
	// read).
	ConfFiles []string
	// Force tears down the attachments of pods that still exist, as their
	// DEL would (IPAM release included): those pods lose their interface.
	Force bool
	// Warn is told about the pods Force takes the network from.
	Warn func(string)
	// AgentStopped: the caller is the agent, its work stopped, holding the
	// agent lock until it exits (`run --uninstall-on-stop`).
	AgentStopped bool
}

// Uninstalled is what an uninstall removed.
type Uninstalled struct {
	Removed []datapath.Removal
	// Where it looked, for the report of a node with nothing to remove.
	PinDir, StateDir, ConfDir string
}

// MarshalJSON is the list, empty rather than null.
func (u Uninstalled) MarshalJSON() ([]byte, error) {
	if u.Removed == nil {
		return []byte("[]"), nil
	}
	return json.Marshal(u.Removed)
}

func (u Uninstalled) Tables() []inspect.Table {
	if len(u.Removed) == 0 {
		return []inspect.Table{{Lines: []string{fmt.Sprintf(
			"nothing of ebpf-cni found on this node (pin dir %s, state dir %s, conf dir %s): nothing to remove",
			u.PinDir, u.StateDir, u.ConfDir)}}}
	}
	t := inspect.Table{Header: []string{"KIND", "REMOVED"}, Footer: fmt.Sprintf("removed %d traces of ebpf-cni", len(u.Removed))}
	for _, r := range u.Removed {
		t.Rows = append(t.Rows, []string{r.Kind, r.What})
	}
	return []inspect.Table{t}
}

// PodsPresentError refuses an uninstall while pods use the datapath.
type PodsPresentError struct{ Pods []string }

func (e *PodsPresentError) Error() string {
	return fmt.Sprintf("uninstall: %d pod interfaces still use ebpf-cni on this node (%s); delete or drain the pods first, or pass --force to take their network away",
		len(e.Pods), strings.Join(e.Pods, "; "))
}

// livePod is an attachment the uninstall must not take away unasked.
type livePod struct {
	net *NetworkConf
	rec *state.Record
	st  state.Status
}

func (p livePod) String() string {
	s := fmt.Sprintf("%s/%s of network %s", p.rec.ContainerID, p.rec.IfName, p.net.Name)
	if l := p.rec.PodLabel(); l != "" {
		s += " (" + l + ")"
	}
	if p.st == state.Adding {
		s += " (ADD in progress)"
	}
	return s
}

// Uninstall removes every trace of the datapath from the node (this netns
// and the cgroup root of the socket hooks): the attachments (DEL's
// teardown, IPAM release included), veths of ours left without a record,
// handed-off veths, the node hooks on uplinks and the cgroup root, stray
// links and tc filters running our programs, the routes the agent
// installed (RouteProtocol), the tunnel device and the neighbour entries
// the agent made managed toward other nodes, the pin directory, the state directory's
// records and the conflists of networks using this pin directory. It
// refuses, changing nothing, while an agent runs on the pin directory, and
// while pods use the datapath unless Force. A node with nothing left is no
// error: the report is empty.
func Uninstall(o UninstallOptions) (Uninstalled, error) {
	// One spelling of each path: `a/../b` is b, and conflists compare clean.
	o.PinRoot, o.StateDir, o.ConfDir = filepath.Clean(o.PinRoot), filepath.Clean(o.StateDir), filepath.Clean(o.ConfDir)
	u := Uninstalled{PinDir: o.PinRoot, StateDir: o.StateDir, ConfDir: o.ConfDir}
	// A path naming more than ours (the bpffs root, <ours>/..) would have
	// other tools' pins removed with it: refused before anything is done.
	if err := datapath.CheckPinDir(o.PinRoot); err != nil {
		return u, fmt.Errorf("uninstall: %w", err)
	}
	if !o.AgentStopped && datapath.AgentAlive(o.PinRoot) {
		return u, fmt.Errorf("uninstall: an agent runs on %s (it would set the node hooks up again): stop it first (delete the DaemonSet, or stop ebpf-agent run)", o.PinRoot)
	}
	// Held until it returns: an ADD claiming after this refuses, one that
	// claimed before is in the records judged below; a second uninstall is
	// refused.
	release, err := datapath.HoldUninstall(o.PinRoot)
	if err != nil {
		return u, fmt.Errorf("uninstall: %w", err)
	}
	defer func() { release(len(u.Removed) == 0) }()
	x := &uninstaller{o: o, u: &u}
	x.nets, err = LoadNetworks(o.ConfDir, o.PinRoot)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		x.errs = errors.Join(x.errs, err)
	}
	sc := newScope(o, x.nets)
	live, stale, err := judgeAttachments(o, sc)
	if err != nil {
		return u, err
	}
	ours := datapath.Runs(o.PinRoot)
	if err := refuseLive(o, live, ourVeths(sc, ours, live, stale)); err != nil {
		return u, err
	}
	// The attachments while their network's IPAM configuration is on disk
	// (a run killed after the conflists went could release no address),
	// then the conflists, so the runtime starts no pod on the network.
	x.tear(live, stale)
	endpoint.Crashpoint("uninstall-teardown")
	x.removeConflists()
	endpoint.Crashpoint("uninstall-conflists")
	// An ADD that started before the conflists went is judged again.
	sc.owned = nil
	live, stale, err = judgeAttachments(o, sc)
	if err != nil {
		return u, errors.Join(x.errs, err)
	}
	if len(live) > 0 && !o.Force {
		var pods []string
		for _, p := range live {
			pods = append(pods, p.String())
		}
		return u, errors.Join(x.errs, fmt.Errorf("uninstall: pods were started while it ran (%s): the datapath stays; delete them and run it again, or pass --force", strings.Join(pods, "; ")))
	}
	x.tear(live, stale)
	x.removeVeths(sc, ours)
	x.detachHooks()
	if x.errs != nil {
		// Keep the pins: a second run finds the rest by them.
		return u, x.errs
	}
	// The records before the pin directory (and its uninstall lock): an ADD
	// claiming after the lock is gone is a new install's, its record kept.
	rs, err := removeState(sc)
	u.Removed, x.errs = append(u.Removed, rs...), errors.Join(x.errs, err)
	if x.errs != nil {
		return u, x.errs
	}
	endpoint.Crashpoint("uninstall-state")
	rs, err = datapath.RemovePinDir(o.PinRoot)
	u.Removed, x.errs = append(u.Removed, rs...), errors.Join(x.errs, err)
	return u, x.errs
}

// refuseLive refuses an uninstall without Force while pods use the
// datapath: live attachments, or veths of ours without a record.
func refuseLive(o UninstallOptions, live []livePod, orphans []netlink.Link) error {
	if (len(live) == 0 && len(orphans) == 0) || o.Force {
		return nil
	}
	pe := &PodsPresentError{}
	for _, p := range live {
		pe.Pods = append(pe.Pods, p.String())
	}
	for _, l := range orphans {
		pe.Pods = append(pe.Pods, fmt.Sprintf("veth %s (%s) without a record", l.Attrs().Name, l.Attrs().Alias))
	}
	return pe
}

// uninstaller is one run of Uninstall: what it removed and what failed.
type uninstaller struct {
	o    UninstallOptions
	u    *Uninstalled
	nets []NetworkConf
	errs error
}

func (x *uninstaller) add(kind, what string) {
	x.u.Removed = append(x.u.Removed, datapath.Removal{Kind: kind, What: what})
}

// tear tears the attachments down (live ones only with --force, warned).
func (x *uninstaller) tear(live, stale []livePod) {
	for _, p := range live {
		if x.o.Warn != nil {
			x.o.Warn(fmt.Sprintf("--force: tearing down %s: the pod loses this interface", p))
		}
	}
	for _, p := range append(stale, live...) {
		kind := "attachment"
		if p.st == state.Abandoned {
			kind = "attachment (ADD killed part way)"
		}
		if err := tearDown(x.o, p); err != nil {
			x.errs = errors.Join(x.errs, err)
			continue
		}
		x.add(kind, fmt.Sprintf("%s/%s (host veth %s, IPs %s)", p.rec.ContainerID, p.rec.IfName, p.rec.HostIf, strings.Join(p.rec.IPs, " ")))
	}
}

// removeConflists removes the conflists of the networks using this pin
// directory, and those named by --conf-file.
func (x *uninstaller) removeConflists() {
	files := map[string]bool{}
	for _, n := range x.nets {
		files[n.File] = true
	}
	for _, f := range x.o.ConfFiles {
		if _, err := os.Stat(f); err == nil && !othersConf(f, x.o.PinRoot) {
			files[f] = true
		}
	}
	for _, f := range sortedKeys(files) {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			x.errs = errors.Join(x.errs, fmt.Errorf("remove conflist %s: %w", f, err))
			continue
		}
		x.add("conflist", f)
	}
}

// removeVeths deletes the veths of ours the records do not name (records
// removed by hand; the pod end goes with them) and the handed-off ones.
func (x *uninstaller) removeVeths(sc *scope, ours func(netlink.Link) bool) {
	for _, l := range ourVeths(sc, ours) {
		if err := netlink.LinkDel(l); err != nil {
			x.errs = errors.Join(x.errs, fmt.Errorf("delete veth %s: %w", l.Attrs().Name, err))
			continue
		}
		x.add("veth", fmt.Sprintf("%s (%s)", l.Attrs().Name, l.Attrs().Alias))
	}
	if n, err := endpoint.ReapAll(context.Background(), x.o.PinRoot, nil); err != nil {
		x.errs = errors.Join(x.errs, err)
	} else if n > 0 {
		x.add("handed-off veths", fmt.Sprintf("%d deleted", n))
	}
}

// detachHooks detaches the node hooks, the stray links and filters running
// our programs, and removes the agent's peer routes.
func (x *uninstaller) detachHooks() {
	cgroupRoot := x.o.CgroupRoot
	if cgroupRoot == "" {
		for _, n := range x.nets {
			if n.Net.CgroupRoot != "" {
				cgroupRoot = n.Net.CgroupRoot
				break
			}
		}
	}
	if cgroupRoot == "" {
		cgroupRoot, _ = datapath.CgroupRoot("")
	}
	rs, err := datapath.DetachNodeHooks(x.o.PinRoot)
	x.u.Removed, x.errs = append(x.u.Removed, rs...), errors.Join(x.errs, err)
	endpoint.Crashpoint("uninstall-hooks")
	rs, err = datapath.DetachStrays(x.o.PinRoot, cgroupRoot)
	x.u.Removed, x.errs = append(x.u.Removed, rs...), errors.Join(x.errs, err)
	endpoint.Crashpoint("uninstall-strays")
	routes, err := removePeerRoutes()
	for _, r := range routes {
		x.add("route", r)
	}
	x.errs = errors.Join(x.errs, err)
	// The pods' rules and routes to other nodes' addresses (tunnelnodes.go).
	if err := PurgeTunnelNodeRouting(); err != nil {
		x.errs = errors.Join(x.errs, err)
	}
	// The tunnel device (its routes went with the peer routes).
	if datapath.TunnelIfindex() != 0 {
		if err := datapath.RemoveTunnel(x.o.PinRoot); err != nil {
			x.errs = errors.Join(x.errs, err)
		} else {
			x.add("link", datapath.TunnelDevice)
		}
	}
	// The next hops toward nodes the agent made managed (tunnelhops.go).
	hops, err := RemoveTunnelHops()
	for _, h := range hops {
		x.add("neighbour", h)
	}
	x.errs = errors.Join(x.errs, err)
}

// scope is what of the state and conf directories is this pin
// directory's: networks of other pin directories may share both.
type scope struct {
	pinRoot string
	ours    map[string]*NetworkConf // networks in the conf dir using this pin directory, by name
	foreign map[string]bool         // ebpf-cni networks in the conf dir using another one
	// stateDirs are --state-dir and those of our networks.
	stateDirs []string
	// owned are the records' directories (<stateDir>/<network>) judged ours.
	owned []string
	// runsOurs and runsForeign tell a host veth of this pin directory from
	// another's (datapath.Runs, datapath.RunsForeign).
	runsOurs, runsForeign func(netlink.Link) bool
}

func newScope(o UninstallOptions, nets []NetworkConf) *scope {
	sc := &scope{pinRoot: o.PinRoot, ours: map[string]*NetworkConf{}, foreign: map[string]bool{},
		runsOurs: datapath.Runs(o.PinRoot), runsForeign: datapath.RunsForeign(o.PinRoot)}
	dirs := map[string]bool{filepath.Clean(o.StateDir): true}
	sc.stateDirs = []string{filepath.Clean(o.StateDir)}
	for i := range nets {
		sc.ours[nets[i].Name] = &nets[i]
		if d := filepath.Clean(nets[i].Net.StateDir); !dirs[d] {
			dirs[d] = true
			sc.stateDirs = append(sc.stateDirs, d)
		}
	}
	for name := range foreignNetworks(o.ConfDir, o.PinRoot) {
		if sc.ours[name] == nil {
			sc.foreign[name] = true
		}
	}
	return sc
}

// foreignNetworks names the ebpf-cni networks of the conf dir whose pinDir
// is not pinRoot.
func foreignNetworks(confDir, pinRoot string) map[string]bool {
	out := map[string]bool{}
	files, _ := libcni.ConfFiles(confDir, []string{".conf", ".conflist", ".json"})
	for _, f := range files {
		var list struct {
			Name    string            `json:"name"`
			Type    string            `json:"type"`
			PinDir  string            `json:"pinDir"`
			Plugins []json.RawMessage `json:"plugins"`
		}
		b, err := os.ReadFile(f)
		if err != nil || json.Unmarshal(b, &list) != nil {
			continue
		}
		plugins := list.Plugins
		if len(plugins) == 0 {
			plugins = []json.RawMessage{b} // a single .conf
		}
		for _, raw := range plugins {
			var p struct {
				Type   string `json:"type"`
				PinDir string `json:"pinDir"`
			}
			if json.Unmarshal(raw, &p) != nil || p.Type != "ebpf-cni" {
				continue
			}
			if p.PinDir == "" {
				p.PinDir = datapath.DefaultPinRoot
			}
			if filepath.Clean(p.PinDir) != filepath.Clean(pinRoot) {
				out[list.Name] = true
			}
		}
	}
	return out
}

// othersConf tells whether a conflist that a template's base name names is
// readable and holds no ebpf-cni plugin of pinRoot: another CNI's (or
// another pin directory's), written under that name, which stays. One that
// cannot be read is taken for the agent's rendering, broken.
func othersConf(f, pinRoot string) bool {
	b, err := os.ReadFile(f)
	if err != nil {
		return false
	}
	var list struct {
		Plugins []json.RawMessage `json:"plugins"`
	}
	if json.Unmarshal(b, &list) != nil {
		return false
	}
	plugins := list.Plugins
	if len(plugins) == 0 {
		plugins = []json.RawMessage{b} // a single .conf
	}
	for _, raw := range plugins {
		var p struct {
			Type   string `json:"type"`
			PinDir string `json:"pinDir"`
		}
		if json.Unmarshal(raw, &p) != nil || p.Type != "ebpf-cni" {
			continue
		}
		if p.PinDir == "" {
			p.PinDir = datapath.DefaultPinRoot
		}
		if filepath.Clean(p.PinDir) == filepath.Clean(pinRoot) {
			return false
		}
	}
	return true
}

// judgeAttachments sorts the records of every network of ours under the
// state directories into attachments of live pods (their host veth exists,
// a link under its name that another tool made since the veth went being
// none, or an ADD of them runs) and stale ones (veth gone, or half made by a
// killed ADD). A network of the state directory with no conflist at all is
// taken for ours (its conflist went first); one whose conflist names
// another pin directory is not. Nothing is changed.
func judgeAttachments(o UninstallOptions, sc *scope) (live, stale []livePod, err error) {
	for _, dir := range sc.stateDirs {
		names, err := state.Networks(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("read state directory %s: %w", dir, err)
		}
		for _, name := range names {
			if sc.foreign[name] {
				continue
			}
			nc := sc.ours[name]
			if nc != nil && filepath.Clean(nc.Net.StateDir) != dir {
				// Same name, another state directory: not this network's records.
				continue
			}
			if nc == nil && !sc.recordsOfOurs(dir, name) {
				continue
			}
			if nc == nil {
				// Its conflist is gone: teardown from the record alone, without
				// an IPAM release (there is no IPAM configuration to run).
				conf, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": name, "type": "ebpf-cni",
					"pinDir": o.PinRoot, "stateDir": dir})
				n, perr := endpoint.ParseNetwork(conf)
				if perr != nil {
					return nil, nil, fmt.Errorf("network %s: %w", name, perr)
				}
				nc = &NetworkConf{Name: name, Bytes: conf, Net: n}
			}
			sc.owned = append(sc.owned, filepath.Join(dir, name))
			store := state.Store{Root: dir, Network: name}
			recs, err := store.List()
			if err != nil {
				return nil, nil, fmt.Errorf("read records of network %s: %w", name, err)
			}
			for _, r := range recs {
				st, now, err := store.Recheck(r)
				if err != nil {
					return nil, nil, err
				}
				if st == state.Gone {
					continue
				}
				p := livePod{net: nc, rec: now, st: st}
				switch {
				case st == state.Adding:
					live = append(live, p)
				case st == state.Abandoned:
					stale = append(stale, p)
				default:
					// Live while its veth is there: the link under its name,
					// unless another tool's made since the veth went
					// (endpoint.ReplacedHostVeth, the teardown's rule).
					l, err := netlinksafe.LinkByName(state.HostIfName(now.ContainerID, now.IfName))
					if err == nil && !endpoint.ReplacedHostVeth(l, now, nc.Net.Name) {
						live = append(live, p)
					} else {
						stale = append(stale, p)
					}
				}
			}
		}
	}
	return live, stale, nil
}

// recordsOfOurs judges a directory of a state directory whose network has
// no conflist in the conf dir (its conflist went first, or lives elsewhere,
// as a Multus network's does): ours only if it holds nothing but records
// (not host-local's, libcni's or another tool's files beside ours, as under
// /var/lib/cni), and none of its pods' host veths runs another pin
// directory's programs. One that is not ours is foreign from then on.
func (sc *scope) recordsOfOurs(dir, network string) bool {
	ents, err := os.ReadDir(filepath.Join(dir, network))
	if err != nil {
		return false
	}
	for _, e := range ents {
		if !isRecordFile(e) {
			sc.foreign[network] = true
			return false
		}
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		r, err := state.ReadFile(filepath.Join(dir, network, e.Name()))
		if err != nil || r == nil || r.ContainerID == "" {
			sc.foreign[network] = true
			return false
		}
		// Only the record's own veth tells: not a link another tool made
		// under its name since (endpoint.ReplacedHostVeth).
		l, err := netlinksafe.LinkByName(state.HostIfName(r.ContainerID, r.IfName))
		if err == nil && !endpoint.ReplacedHostVeth(l, r, network) && sc.runsForeign(l) && !sc.runsOurs(l) {
			sc.foreign[network] = true
			return false
		}
	}
	return true
}

// isRecordFile: a record (<containerID>_<ifname>.json) or the temp file of
// its write (.<name>.<hex>.tmp), a regular file.
func isRecordFile(e os.DirEntry) bool {
	if !e.Type().IsRegular() {
		return false
	}
	n := e.Name()
	if strings.HasPrefix(n, ".") {
		return strings.HasSuffix(n, ".tmp")
	}
	return strings.HasSuffix(n, ".json")
}

// tearDown removes one attachment as DEL would, IPAM release included.
func tearDown(o UninstallOptions, p livePod) error {
	st := p.st
	if st != state.Abandoned {
		st = state.Complete
	}
	sweep := &endpoint.Sweep{Net: p.net.Net, Conf: p.net.Bytes, CNIPath: o.CNIPath}
	ok, err := sweep.TearDown(p.rec, st)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("tear down %s/%s: its claim is held by another process now", p.rec.ContainerID, p.rec.IfName)
	}
	return nil
}

// ourVeths lists the host veths of ours (named and aliased by ADD) that
// none of the given attachments names. Another pin directory's veths (its
// network's conflist names it, or the veth runs none of our programs and
// its alias names no network of ours) are not ours.
func ourVeths(sc *scope, runsOurs func(netlink.Link) bool, groups ...[]livePod) []netlink.Link {
	named := map[string]bool{}
	for _, g := range groups {
		for _, p := range g {
			named[state.HostIfName(p.rec.ContainerID, p.rec.IfName)] = true
		}
	}
	owned := map[string]bool{}
	for _, d := range sc.owned {
		owned[filepath.Base(d)] = true
	}
	links, _ := netlinksafe.LinkList()
	var out []netlink.Link
	for _, l := range links {
		a := l.Attrs()
		owner, ok := endpoint.ParseOwnerAlias(a.Alias)
		if l.Type() != "veth" || !strings.HasPrefix(a.Name, state.HostIfPrefix) || !ok || named[a.Name] {
			continue
		}
		network := owner.Network
		if sc.foreign[network] {
			continue
		}
		if runsOurs(l) || sc.ours[network] != nil || owned[network] {
			out = append(out, l)
		}
	}
	return out
}

// removePeerRoutes deletes every route of RouteProtocol (the agent's
// routes to other nodes' pod CIDRs), in every table.
func removePeerRoutes() ([]string, error) {
	var (
		out  []string
		errs error
	)
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Protocol: RouteProtocol, Table: 0}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		for _, r := range rs {
			r := r
			what := fmt.Sprintf("%v via %v (proto %d)", r.Dst, r.Gw, RouteProtocol)
			if err := netlink.RouteDel(&r); err != nil {
				errs = errors.Join(errs, fmt.Errorf("remove route %s: %w", what, err))
				continue
			}
			out = append(out, what)
		}
	}
	return out, errs
}

// removeState removes the records' directories judged ours (only files
// the plugin writes are in them: records, their temp files) and each state
// directory left empty. A state directory still holding another pin
// directory's networks stays.
func removeState(sc *scope) ([]datapath.Removal, error) {
	var (
		out  []datapath.Removal
		errs error
	)
	for _, p := range sc.owned {
		files, err := os.ReadDir(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		// Only what the plugin writes there goes, and symlinks (removed,
		// never followed): anything else someone put beside the records
		// stays, and so does the directory then.
		n, kept := 0, 0
		for _, f := range files {
			if !isRecordFile(f) && f.Type()&os.ModeSymlink == 0 {
				kept++
				continue
			}
			if err := os.Remove(filepath.Join(p, f.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = errors.Join(errs, err)
				continue
			}
			n++
		}
		if kept > 0 {
			out = append(out, datapath.Removal{Kind: "state", What: fmt.Sprintf("%s (%d files; the directory kept: %d entries ebpf-cni did not write)", p, n, kept)})
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = errors.Join(errs, err)
			continue
		}
		out = append(out, datapath.Removal{Kind: "state", What: fmt.Sprintf("%s (%d files)", p, n)})
	}
	for _, d := range sc.stateDirs {
		ents, err := os.ReadDir(d)
		if err != nil || len(ents) > 0 {
			continue // missing, or another's records remain
		}
		if err := os.Remove(d); err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		out = append(out, datapath.Removal{Kind: "state directory", What: d})
	}
	return out, errs
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
