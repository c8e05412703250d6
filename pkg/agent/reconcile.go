package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Stale is one piece of state that belongs to no live pod.
type Stale struct {
	Kind string `json:"kind"` // endpoint, link-entry, counters, limit, nat, stack-flows, netns, link-pin, attachment
	What string `json:"what"`
}

// Reconciled is what `reconcile` removed (or, DryRun, would remove).
type Reconciled struct {
	Stale  []Stale
	DryRun bool
}

// MarshalJSON is the list itself.
func (r Reconciled) MarshalJSON() ([]byte, error) {
	if r.Stale == nil {
		return []byte("[]"), nil
	}
	return json.Marshal(r.Stale)
}

func (r Reconciled) Tables() []inspect.Table {
	col, verb := "REMOVED", "removed"
	if r.DryRun {
		col, verb = "WOULD REMOVE", "would remove"
	}
	t := inspect.Table{Header: []string{"KIND", col}, Footer: fmt.Sprintf("%s %d items", verb, len(r.Stale))}
	for _, s := range r.Stale {
		t.Rows = append(t.Rows, []string{s.Kind, s.What})
	}
	return []inspect.Table{t}
}

// NetworkConf is an ebpf-cni network found in the CNI configuration
// directory, as the runtime would pass it to the plugin.
type NetworkConf struct {
	Name  string
	File  string
	Bytes []byte
	Net   *endpoint.Network
}

// LoadNetworks reads confDir for conflists and confs whose plugin of type
// ebpf-cni uses pinRoot, and returns each as plugin configuration bytes with
// the list's name and cniVersion injected (as libcni does).
func LoadNetworks(confDir, pinRoot string) ([]NetworkConf, error) {
	files, err := libcni.ConfFiles(confDir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []NetworkConf
	for _, f := range files {
		nets, err := LoadNetworkFile(f, pinRoot)
		if err != nil {
			continue // not ours to judge; the runtime reports broken files
		}
		out = append(out, nets...)
	}
	return out, nil
}

// LoadNetworkFile is LoadNetworks for one file; a file libcni cannot read
// is an error.
func LoadNetworkFile(f, pinRoot string) ([]NetworkConf, error) {
	var (
		list *libcni.NetworkConfigList
		err  error
	)
	if strings.HasSuffix(f, ".conflist") {
		list, err = libcni.ConfListFromFile(f)
	} else {
		var one *libcni.NetworkConfig
		if one, err = libcni.ConfFromFile(f); err == nil {
			list, err = libcni.ConfListFromConf(one)
		}
	}
	if err != nil {
		return nil, err
	}
	var out []NetworkConf
	for _, p := range list.Plugins {
		if p.Network.Type != "ebpf-cni" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(p.Bytes, &m); err != nil {
			continue
		}
		m["name"], m["cniVersion"] = list.Name, list.CNIVersion
		b, _ := json.Marshal(m)
		n, err := endpoint.ParseNetwork(b)
		if err != nil || filepath.Clean(n.PinDir) != filepath.Clean(pinRoot) {
			continue
		}
		out = append(out, NetworkConf{Name: list.Name, File: f, Bytes: b, Net: n})
	}
	return out, nil
}

// linkExists tells whether an ifindex names a link in this netns.
func linkExists(ifindex uint32) bool {
	_, err := netlink.LinkByIndex(int(ifindex))
	return err == nil
}

// ReconcileMaps finds, and unless dryRun removes, datapath state of pods
// whose host veth is gone: endpoint and link entries, counters, limits, link
// pins, masquerade and stack-flow entries, and netns entries no attachment
// record refers to.
func ReconcileMaps(pinRoot, stateDir string, dryRun bool) ([]Stale, error) {
	dp, err := datapath.Open(pinRoot)
	if err != nil {
		return nil, err
	}
	defer dp.Close()
	w := &mapSweep{m: dp.Maps, dryRun: dryRun}
	w.podEntries()
	w.masq()
	w.stackFlows()
	w.policyTables(stateDir)
	w.netns(stateDir)
	w.linkPins(pinRoot)
	return w.out, w.errs
}

// mapSweep is one ReconcileMaps pass: what it found stale, and the errors
// of reading and (unless dryRun) removing it.
type mapSweep struct {
	m      *maps.Maps
	dryRun bool
	out    []Stale
	errs   error
}

func (w *mapSweep) act(kind, what string, f func() error) {
	w.out = append(w.out, Stale{kind, what})
	if !w.dryRun {
		w.errs = errors.Join(w.errs, f())
	}
}

func (w *mapSweep) join(err error) { w.errs = errors.Join(w.errs, err) }

// podEntries: address entries, link entries, limits and counters of gone
// veths.
func (w *mapSweep) podEntries() {
	m := w.m
	eps, err := m.Endpoints().List()
	w.join(err)
	for _, e := range eps {
		if !linkExists(e.Info.Ifindex) {
			ip, idx := e.IP, int(e.Info.Ifindex)
			w.act("endpoint", fmt.Sprintf("%s -> ifindex %d", ip, idx), func() error { return m.Endpoints().Delete(ip, idx) })
		}
	}
	var goneLinks []uint32
	links, err := m.Links().Ifindexes()
	for _, k := range links {
		if !linkExists(k) {
			goneLinks = append(goneLinks, k)
		}
	}
	w.join(err)
	for _, idx := range goneLinks {
		idx := int(idx)
		w.act("link-entry", fmt.Sprintf("ifindex %d", idx), func() error { return m.Links().Delete(idx) })
	}
	lims, err := m.Bandwidth().ListLimits()
	w.join(err)
	for _, l := range lims {
		if !linkExists(l.Ifindex) {
			idx := int(l.Ifindex)
			w.act("limit", fmt.Sprintf("%s of ifindex %d", l.Dir, idx), func() error { return m.Bandwidth().DeleteLimits(idx) })
		}
	}
	all, err := m.Stats().All()
	w.join(err)
	for idx := range all {
		if !linkExists(idx) {
			idx := int(idx)
			w.act("counters", fmt.Sprintf("ifindex %d", idx), func() error { return m.Stats().Reset(idx) })
		}
	}
}

// masq: masqueraded flows and flow counts of gone veths.
func (w *mapSweep) masq() {
	m := w.m
	// Masquerade entries of gone veths (DEL removes them; this catches pods
	// that vanished without one). The programs ignore them anyway.
	snat, err := m.Masq().ListSNAT()
	w.join(err)
	goneNAT := map[int]int{}
	for _, f := range snat {
		if !linkExists(uint32(f.Ifindex)) {
			goneNAT[f.Ifindex]++
		}
	}
	// A gone veth's count of flows (its quota) goes with them, flows or not.
	counts, err := m.Masq().ListPods()
	w.join(err)
	for _, c := range counts {
		if _, ok := goneNAT[c.Ifindex]; !ok && c.Ifindex != 0 && !linkExists(uint32(c.Ifindex)) {
			goneNAT[c.Ifindex] = 0
		}
	}
	for idx, n := range goneNAT {
		idx := idx
		w.act("nat", fmt.Sprintf("%d flows of ifindex %d", n, idx), func() error { _, err := m.Masq().DeleteSNATOf(idx); return err })
	}
}

// stackFlows: stack-flow records and tables of gone veths.
func (w *mapSweep) stackFlows() {
	m := w.m
	// Stack flows of gone veths, likewise.
	sflows, err := m.StackFlows().List()
	w.join(err)
	goneSF := map[int]int{}
	for _, f := range sflows {
		if !linkExists(uint32(f.Ifindex)) {
			goneSF[f.Ifindex]++
		}
	}
	// A gone veth's own table of stack-flow records goes with them.
	parts, err := m.StackFlows().Parts()
	w.join(err)
	for _, idx := range parts {
		if _, ok := goneSF[idx]; !ok && !linkExists(uint32(idx)) {
			goneSF[idx] = 0
		}
	}
	for idx, n := range goneSF {
		idx := idx
		w.act("stack-flows", fmt.Sprintf("%d flows of ifindex %d", n, idx), func() error { _, err := m.StackFlows().DeleteOf(idx); return err })
	}
}

// policyTables: pins of tables no outer map holds, and the policy flow
// tables of gone veths and of live ones without them.
func (w *mapSweep) policyTables(stateDir string) {
	m := w.m
	// Pins of tables no outer map holds (a verb killed between the two):
	// each keeps its table's memory.
	stale, err := m.StaleTablePins()
	w.join(err)
	for _, p := range stale {
		p := p
		w.act("table-pins", p, func() error { return m.RemoveStaleTablePin(p) })
	}

	// A gone veth's NetworkPolicy flow tables (its DEL never ran).
	polTables, err := m.Policy().FlowTables()
	w.join(err)
	hasTables := map[int]bool{}
	for _, idx := range polTables {
		hasTables[idx] = true
		if !linkExists(uint32(idx)) {
			idx := idx
			w.act("policy-flows", fmt.Sprintf("flow tables of ifindex %d", idx), func() error { return m.Policy().DeleteFlowTables(idx) })
		}
	}
	// A live policy interface without them (attached by a build that kept
	// every pod's flows in one node-wide table) gets its own: without, its
	// allowed flows are not recorded and their replies are judged by the
	// rules alone.
	if recs, err := state.ListAll(stateDir); err == nil {
		for _, r := range recs {
			if r.Policy && !r.Provisional && r.HostIfindex > 0 && !hasTables[r.HostIfindex] && linkExists(uint32(r.HostIfindex)) {
				idx := r.HostIfindex
				w.act("policy-flows", fmt.Sprintf("flow tables for ifindex %d", idx), func() error { return m.Policy().AddFlowTables(idx) })
			}
		}
	} else {
		w.join(err)
	}
}

// netns: netns entries no record names.
func (w *mapSweep) netns(stateDir string) {
	m := w.m
	// netns entries: the node's stays; a pod's stays while a record names it.
	// The entries are listed before the records: an ADD writes its record
	// (with the cookie) before the entry, so an entry listed here has its
	// record on disk by the time the records are read.
	nss, err := m.Bandwidth().ListNetns()
	w.join(err)
	known := make(map[uint64]bool)
	recs, _ := state.ListAll(stateDir)
	for _, r := range recs {
		if r.NetnsCookie != 0 {
			known[r.NetnsCookie] = true
		}
	}
	for cookie, v := range nss {
		if v.Flags&maps.FlagNetnsNode == 0 && !known[cookie] {
			c := cookie
			w.act("netns", fmt.Sprintf("cookie %d", c), func() error { return m.Bandwidth().DeleteNetns(c) })
		}
	}
}

// linkPins: link pins of gone host veths.
func (w *mapSweep) linkPins(pinRoot string) {
	// Link pins of host veths that are gone.
	// Looked at and removed under one hold of the links lock (see
	// datapath.ForOrphanVethLinkPins).
	w.join(datapath.ForOrphanVethLinkPins(pinRoot, func(p datapath.VethLinkPin) error {
		path := p.Path
		w.act("link-pin", filepath.Base(path), func() error { return os.Remove(path) })
		return nil
	}))
}

// ReconcileAll reconciles attachments of every ebpf-cni network in the CNI
// configuration directory that uses this pin root, then the maps and pins.
func ReconcileAll(o Options, dryRun bool) ([]Stale, error) {
	var (
		out  []Stale
		errs error
	)
	nets, err := LoadNetworks(o.ConfDir, o.PinRoot)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = errors.Join(errs, err)
	}
	for _, n := range nets {
		done, err := endpoint.Reconcile(n.Net, n.Bytes, o.CNIPath, dryRun)
		for _, d := range done {
			out = append(out, Stale{Kind: "attachment", What: d})
		}
		errs = errors.Join(errs, err)
	}
	st, err := ReconcileMaps(o.PinRoot, o.StateDir, dryRun)
	if errors.Is(err, os.ErrNotExist) {
		err = nil // nothing pinned yet
	}
	return append(out, st...), errors.Join(errs, err)
}
