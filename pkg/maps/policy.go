package maps

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// Go twins of the NetworkPolicy structs in bpf/lib/types.h, generated from BTF.
type (
	PolicyState   = mapsObjPolState
	PolicyAddrKey = mapsObjPolAddrKey
	PolicyAddrVal = mapsObjPolAddrVal
	PolicyPortKey = mapsObjPolPortKey
	PolicyCTKey   = mapsObjPolCtKey
	PolicyCTVal   = mapsObjPolCtVal
	// PolicyCTPartKey names one flow table of an interface (cni_pol_ct_parts).
	PolicyCTPartKey = mapsObjPolCtPartKey
	PolicyConfig    = mapsObjPolConfig
)

// Names of the NetworkPolicy maps, as bpf/lib/maps.h declares them.
var (
	namePolState     = mapName(&specNames.CniPolState)
	namePolAddrs     = mapName(&specNames.CniPolAddrs)
	namePolPorts     = mapName(&specNames.CniPolPorts)
	namePolCTParts   = mapName(&specNames.CniPolCtParts)
	namePolConfig    = mapName(&specNames.CniPolConfig)
	namePolScratch   = mapName(&specNames.CniPolScratch) // the programs' working memory, nothing to read
	namePolFragParts = mapName(&specNames.CniPolFragParts)
)

// Policy is the NetworkPolicy family of the maps: the per-interface state,
// rules and flow tables (cni_pol_*), and the links judging deferred egress
// (cni_after_links).
type Policy struct{ m *Maps }

// Policy returns the NetworkPolicy family of m.
func (m *Maps) Policy() Policy { return Policy{m} }

// polCTPartSpec is one flow table of a pod interface: struct pol_ct_part
// in bpf/lib/maps.h (TestInnerSpecs holds them equal), kept here so
// that ADD creates one without parsing the embedded object. Its 128 is the
// outer map's template and the flows a pod is sure to keep; ADD's tables
// are larger (polCTTableSpec), which a hash of maps takes (only an array's
// size is part of the inner map's shape since Linux 5.10: commit 134fede4eecf,
// "bpf: Relax max_entries check for most of the inner map types").
var polCTPartSpec = ebpf.MapSpec{Name: "cni_pol_ct_part", Type: ebpf.LRUHash, KeySize: 44, ValueSize: 24, MaxEntries: 128}

// polCTTableEntries is the size of a flow table on a node of cpus possible
// CPUs that never evicts while fewer than polCTPartSpec.MaxEntries (128)
// flows live in it, whichever CPUs record them. The kernel's common LRU
// moves free entries to a CPU in batches of t (kernel/bpf/bpf_lru_list.c)
// and, when a CPU's batch runs out and the shared free list holds fewer
// than t, evicts up to t entries at once; each other CPU may hold up to t
// free or just taken. So with l live flows the refill evicts nothing when
// entries - l - (cpus-1)t >= t: entries >= 127 + cpus*t. Since Linux 6.16
// t is clamp(entries/cpus/2, 1, 128) (commit "bpf: Adjust free target to
// avoid global starvation of LRU map"): cpus*t <= entries/2, so 256
// entries do up to 128 CPUs and 128+cpus above. Before, t is 128 whatever
// the size: 128*(cpus+1) entries would do, 8320 on 64 CPUs (1.2 MiB a
// table), so those kernels get at most polCTTableOldMax: there a table
// keeps every flow of fewer than 128 while at most 7 CPUs record into it
// (docs/networkpolicy.md, "Flow tables").
func polCTTableEntries(cpus int, clampedBatch bool) uint32 {
	if clampedBatch {
		return uint32(max(256, 128+cpus))
	}
	return uint32(min(128*(cpus+1), polCTTableOldMax))
}

// polCTTableOldMax bounds a flow table on kernels before 6.16.
const polCTTableOldMax = 1024

// lruBatchClamped tells whether the running kernel sizes the LRU's
// batches by the table (6.16 and later; an older kernel with the change
// backported gets the larger tables, which also hold).
var lruBatchClamped = sync.OnceValue(func() bool {
	var uts unix.Utsname
	if unix.Uname(&uts) != nil {
		return false
	}
	return kernelAtLeast(unix.ByteSliceToString(uts.Release[:]), 6, 16)
})

// kernelAtLeast tells whether release (uname -r: "6.18.44-fc") is
// major.minor or later; false when it does not parse.
func kernelAtLeast(release string, major, minor int) bool {
	var a, b int
	if n, _ := fmt.Sscanf(release, "%d.%d", &a, &b); n != 2 {
		return false
	}
	return a > major || a == major && b >= minor
}

// polCTTableSpec is the spec of the flow tables ADD creates on a node of
// cpus possible CPUs, on this kernel.
func polCTTableSpec(cpus int) *ebpf.MapSpec {
	s := polCTPartSpec
	s.MaxEntries = polCTTableEntries(cpus, lruBatchClamped())
	return &s
}

// polFragPartSpec is a pod interface's table of fragmented datagrams: struct
// pol_frag_part in bpf/lib/maps.h (TestInnerSpecs).
var polFragPartSpec = ebpf.MapSpec{Name: "cni_pol_frag_part", Type: ebpf.LRUHash, KeySize: 44, ValueSize: 8, MaxEntries: 16}

// Openers of a flow: the table of cni_pol_ct_parts it is kept in
// (pol_ct_part_key.opener, enum cni_dir).
var polCTOpeners = [2]uint32{uint32(DirEgress), uint32(DirIngress)}

// AddFlowTables gives the interface ifindex its two flow tables (the
// flows the pod opens, the flows its peers open) and its table of
// fragmented datagrams, replacing any an earlier interface of that ifindex
// left: no pod's flows are evicted by another's, nor the pod's own by its
// peers' (bpf/lib/maps.h). ADD, before the interface is flagged for policy
// (before MarkPending). The three go in under one hold of the tables' lock, the
// fragment table beside the flow tables' batch (putInners): one RCU grace
// period where one after the other waited out two. When anything fails,
// nothing of the interface stays (a retry puts them again).
func (pl Policy) AddFlowTables(ifindex int) error {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("count the possible CPUs for the flow tables of ifindex %d: %w", ifindex, err)
	}
	spec := polCTTableSpec(cpus)
	var tables []*ebpf.Map
	defer func() {
		for _, t := range tables {
			t.Close() // the outer maps and the pins hold them from here
		}
	}()
	frags, err := ebpf.NewMap(&polFragPartSpec)
	if err != nil {
		return fmt.Errorf("create the fragment table of ifindex %d: %w", ifindex, err)
	}
	tables = append(tables, frags)
	var keys []PolicyCTPartKey
	for _, o := range polCTOpeners {
		inner, err := ebpf.NewMap(spec)
		if err != nil {
			return fmt.Errorf("create a policy flow table of ifindex %d: %w", ifindex, err)
		}
		tables = append(tables, inner)
		keys = append(keys, PolicyCTPartKey{Ifindex: uint32(ifindex), Opener: o})
	}
	errs := pl.m.putInners(
		innerSet(namePolCTParts, keys, tables[1:]),
		innerSet(namePolFragParts, []uint32{uint32(ifindex)}, tables[:1]))
	if errs[0] != nil || errs[1] != nil {
		// Which one failed names the map; the other's error, if any, too.
		if errs[0] != nil {
			return writeErr(pl.m.get(namePolCTParts), namePolCTParts, fmt.Sprintf("the flow tables of ifindex %d", ifindex), errors.Join(errs...))
		}
		return writeErr(pl.m.get(namePolFragParts), namePolFragParts, fmt.Sprintf("the fragment table of ifindex %d", ifindex), errs[1])
	}
	return nil
}

// innerTables are tables to put into one map of maps: keys is a slice of
// its key type, inners the tables in the same order.
type innerTables struct {
	outer  string
	keys   any
	kbs    [][]byte // each key's bytes: its pin's name, the one-by-one update's key
	inners []*ebpf.Map
}

// innerSet makes the innerTables of outer's keys and tables.
func innerSet[K any](outer string, keys []K, inners []*ebpf.Map) innerTables {
	s := innerTables{outer: outer, keys: keys, inners: inners}
	for i := range keys {
		s.kbs = append(s.kbs, keyBytes(keys[i]))
	}
	return s
}

// putInners is putInner (ebpf.UpdateAny) for the tables of an interface
// at once, under one hold of the tables' lock: each set pinned, then put
// in one batched update, which waits out one RCU grace period where an
// update each waits out one each, and the sets' updates side by side
// (each its own goroutine), whose grace periods the kernel serves
// together (ADD's cost, BenchmarkPolicyFlowTables). A kernel without
// batches for maps of maps gets one update each. It returns each set's
// error in order. When any set fails, nothing of any set stays: the pins
// go, and so does each of their keys from its outer map (a batch, or the
// updates one by one, may have put the first table before the second
// failed: left there, it was a table no pin names; an earlier interface's
// table at a key was replaced by ours or its pin by our pin already).
func (m *Maps) putInners(sets ...innerTables) (errs []error) {
	errs = make([]error, len(sets))
	unlock, err := innerLock(m.dir, true)
	if err != nil {
		errs[0] = err
		return errs
	}
	defer unlock()
	// Opened here, before any change: a foreign pin panics in this
	// goroutine, where the verb recovers it (maps.RecoverPin), not in one
	// of the updates'.
	outers := make([]*ebpf.Map, len(sets))
	for si, s := range sets {
		outers[si] = m.get(s.outer)
	}
	pins := make([][]string, len(sets))
	defer func() {
		if errors.Join(errs...) == nil {
			return
		}
		for si, s := range sets {
			outer := outers[si]
			for i, p := range pins[si] {
				if p == "" {
					continue // not reached: what was there stays
				}
				if derr := outer.Delete(s.kbs[i]); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
					errs[si] = errors.Join(errs[si], fmt.Errorf("take %x out of %s again: %w", s.kbs[i], s.outer, derr))
				}
				os.Remove(p)
			}
		}
	}()
	for si, s := range sets {
		if err := os.MkdirAll(innerDir(m.dir, s.outer), 0o700); err != nil {
			errs[si] = fmt.Errorf("create the pin directory of %s's tables: %w", s.outer, err)
			return errs
		}
		pins[si] = make([]string, len(s.kbs))
		for i := range s.kbs {
			p := innerPin(m.dir, s.outer, s.kbs[i])
			if err := replacePin(s.inners[i], p); err != nil {
				errs[si] = err
				return errs
			}
			pins[si][i] = p
		}
	}
	var wg sync.WaitGroup
	for si := 1; si < len(sets); si++ {
		wg.Go(func() { errs[si] = updateInners(outers[si], sets[si]) })
	}
	errs[0] = updateInners(outers[0], sets[0])
	wg.Wait()
	return errs
}

// updateInners puts s's tables, pinned, into outer, its outer map.
func updateInners(outer *ebpf.Map, s innerTables) error {
	fds := make([]uint32, len(s.inners))
	for i, t := range s.inners {
		fds[i] = uint32(t.FD())
	}
	_, err := outer.BatchUpdate(s.keys, fds, nil)
	if errors.Is(err, ebpf.ErrNotSupported) {
		err = nil
		for i := range s.kbs {
			if err = outer.Update(s.kbs[i], s.inners[i], ebpf.UpdateAny); err != nil {
				break
			}
		}
	}
	return err
}

// FlowTables lists the ifindexes that have flow or fragment tables.
func (pl Policy) FlowTables() ([]int, error) {
	seen := map[uint32]bool{}
	var out []int
	add := func(idx uint32) {
		if !seen[idx] {
			seen[idx] = true
			out = append(out, int(idx))
		}
	}
	if err := scan(pl.m.get(namePolCTParts), func(k *PolicyCTPartKey, _ *uint32) { add(k.Ifindex) }); err != nil {
		return nil, fmt.Errorf("scan %s: %w", namePolCTParts, err)
	}
	if err := scan(pl.m.get(namePolFragParts), func(k *uint32, _ *uint32) { add(*k) }); err != nil {
		return nil, fmt.Errorf("scan %s: %w", namePolFragParts, err)
	}
	return out, nil
}

// DeleteFlowTables drops the flow and fragment tables of ifindex,
// if any (DEL; the agent's reconcile, for a veth gone without a DEL).
func (pl Policy) DeleteFlowTables(ifindex int) error {
	outer, fragOuter := pl.m.get(namePolCTParts), pl.m.get(namePolFragParts) // a foreign pin panics here, in the verb's goroutine
	// The fragment table's delete beside the flow tables': each waits out
	// an RCU grace period, which the kernel serves to both together.
	fragErr := make(chan error, 1)
	go func() {
		fk := uint32(ifindex)
		if err := fragOuter.Delete(&fk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			fragErr <- fmt.Errorf("delete the fragment table of ifindex %d from %s: %w", ifindex, namePolFragParts, err)
			return
		}
		fragErr <- pl.m.unpinInner(namePolFragParts, fk)
	}()
	var errs error
	// The tables there, deleted in one batch: one RCU grace period where a
	// delete each waits out one each (DEL's cost, BenchmarkPolicyFlowTables).
	var keys []PolicyCTPartKey
	for _, o := range polCTOpeners {
		k := PolicyCTPartKey{Ifindex: uint32(ifindex), Opener: o}
		var id uint32
		if err := outer.Lookup(&k, &id); err == nil {
			keys = append(keys, k)
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = errors.Join(errs, fmt.Errorf("read a flow table of ifindex %d from %s: %w", ifindex, namePolCTParts, err))
		}
	}
	if len(keys) > 0 {
		if _, err := outer.BatchDelete(keys, nil); err != nil {
			// No batch here, or a table gone meanwhile: one at a time.
			for i := range keys {
				if err := outer.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					errs = errors.Join(errs, fmt.Errorf("delete a flow table of ifindex %d from %s: %w", ifindex, namePolCTParts, err))
				}
			}
		}
	}
	for _, o := range polCTOpeners {
		errs = errors.Join(errs, pl.m.unpinInner(namePolCTParts, PolicyCTPartKey{Ifindex: uint32(ifindex), Opener: o}))
	}
	return errors.Join(<-fragErr, errs)
}

// eachPolicyFlowTable calls fn with every flow table (opened by its pin,
// closed after fn) and its key.
func (m *Maps) eachPolicyFlowTable(fn func(PolicyCTPartKey, *ebpf.Map) error) error {
	return m.eachInner(namePolCTParts, func(kb []byte, t *ebpf.Map) error {
		var k PolicyCTPartKey
		if err := binary.Read(bytes.NewReader(kb), binary.NativeEndian, &k); err != nil {
			return fmt.Errorf("key %x of %s: %w", kb, namePolCTParts, err)
		}
		return fn(k, t)
	})
}

// EndpointFlagPolicy is EP_F_POLICY in ep_info.flags and link_info.flags:
// the pod's traffic is judged by its NetworkPolicy (bpf/lib/policy.h).
const EndpointFlagPolicy = 1 << 4

// Modes of a direction (POL_* in bpf/lib/types.h).
const (
	PolicyOpen     = 0 // no policy selects the pod in this direction
	PolicyIsolated = 1 // only what the rules allow, replies and the node
	PolicyPending  = 2 // not programmed yet: only the node
)

// Flags of the other NetworkPolicy structs.
const (
	polAllPorts     = 1       // POL_F_ALL_PORTS
	polCfgOn        = 1       // POL_CFG_ON
	PolicyCTEgress  = 1 << 8  // POL_CT_F_EGRESS: the pod opened the flow
	PolicyCTDefer   = 1 << 9  // POL_CT_F_DEFER: judged after the stack's translation
	PolicyCTSnat    = 1 << 10 // POL_CT_F_SNAT: the peer reached the pod masqueraded; its packets are judged each time
	PolicyCTPending = 1 << 11 // POL_CT_F_PENDING: deferred, not confirmed after the stack yet: nothing enters by it
)

// Bits of an LPM key ahead of the address or port.
const (
	polAddrKeyBits = 64 // set, family, pad
	polPortKeyBits = 48 // set, proto, pad
)

// retireAfter is how long a replaced rule set stays in the tries: a packet
// that read the old state before the switch may still look it up. A program
// run takes microseconds; this is ample.
const retireAfter = 200 * time.Millisecond

// ModeName names a direction's mode for dumps.
func ModeName(m uint8) string {
	switch m {
	case PolicyOpen:
		return "open"
	case PolicyIsolated:
		return "isolated"
	case PolicyPending:
		return "pending"
	}
	return fmt.Sprintf("mode%d", m)
}

// Enable marks the node as having pod interfaces with networkPolicy
// (POL_CFG_ON): from then on the stack path looks at each forwarded
// packet's sender. Idempotent.
func (pl Policy) Enable() error {
	cm := pl.m.get(namePolConfig)
	zero := uint32(0)
	var c PolicyConfig
	if err := cm.Lookup(&zero, &c); err != nil {
		return fmt.Errorf("read %s: %w", namePolConfig, err)
	}
	if c.Flags&polCfgOn != 0 {
		return nil
	}
	c.Flags |= polCfgOn
	if err := cm.Put(&zero, &c); err != nil {
		return writeErr(cm, namePolConfig, "the node's policy flag", err)
	}
	return nil
}

// Enabled tells whether POL_CFG_ON is set.
func (pl Policy) Enabled() (bool, error) {
	zero := uint32(0)
	var c PolicyConfig
	if err := pl.m.get(namePolConfig).Lookup(&zero, &c); err != nil {
		return false, fmt.Errorf("read %s: %w", namePolConfig, err)
	}
	return c.Flags&polCfgOn != 0, nil
}

// MarkPending makes the interface pending in both directions (ADD, before
// the pod can send or receive anything, once AddFlowTables gave it its
// tables: ADD makes them while IPAM runs): only the node's traffic passes
// until the agent programs it. It replaces any state an earlier link of
// this ifindex left.
func (pl Policy) MarkPending(ifindex int) error {
	k := uint32(ifindex)
	st := PolicyState{Mode: [2]uint8{PolicyPending, PolicyPending}}
	if err := pl.m.get(namePolState).Put(&k, &st); err != nil {
		return writeErr(pl.m.get(namePolState), namePolState, fmt.Sprintf("pending state of ifindex %d", ifindex), err)
	}
	return nil
}

// StateOf returns the state of an interface; ok false when it has none.
func (pl Policy) StateOf(ifindex int) (st PolicyState, ok bool, err error) {
	k := uint32(ifindex)
	err = pl.m.get(namePolState).Lookup(&k, &st)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("read %s[%d]: %w", namePolState, ifindex, err)
	}
	return st, true, nil
}

// DeleteOf forgets an interface (DEL, GC, reconcile): its state and
// its flow tables, and (peers: the pod's addresses) every other pod's
// flows with it. Its rule sets, referenced by nothing any more, are left to the
// agent's PolicyWriter (Sweep): finding them is a scan of the tries, which
// a DEL need not pay.
func (pl Policy) DeleteOf(ifindex int, peers ...netip.Addr) error {
	k := uint32(ifindex)
	var errs error
	if err := pl.m.get(namePolState).Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = fmt.Errorf("delete %s[%d]: %w", namePolState, ifindex, err)
	}
	_, err := pl.DeleteFlowsOf(ifindex, peers...)
	return errors.Join(errs, err)
}

// DeleteFlowsOf drops the flow tables of the interface (ifindex 0:
// none), and removes every entry whose peer is one of peers from the other
// interfaces' tables, and returns how many: a scan (batched) of every
// table, as DeleteStackFlowsOf. A deleted pod's address goes to a new pod
// sooner or later: the flows other pods had with the old one must not let
// the new one in.
func (pl Policy) DeleteFlowsOf(ifindex int, peers ...netip.Addr) (int, error) {
	if ifindex != 0 {
		if err := pl.DeleteFlowTables(ifindex); err != nil {
			return 0, err
		}
	}
	if len(peers) == 0 {
		return 0, nil
	}
	n := 0
	err := pl.m.eachPolicyFlowTable(func(_ PolicyCTPartKey, t *ebpf.Map) error {
		var keys []PolicyCTKey
		err := scan(t, func(k *PolicyCTKey, v *PolicyCTVal) {
			if slices.Contains(peers, addrPort(k.PeerAddr, k.Family, 0).Addr()) {
				keys = append(keys, *k)
			}
		})
		if err != nil {
			return fmt.Errorf("scan a table of %s: %w", namePolCTParts, err)
		}
		n += len(keys)
		return deleteKeys(t, keys)
	})
	return n, err
}

// PolicyFlow is one entry of a cni_pol_ct_parts table: a flow the pod's
// policy allowed.
type PolicyFlow struct {
	Ifindex int
	Proto   uint8
	Pod     netip.AddrPort
	Peer    netip.AddrPort
	Egress  bool // the pod opened it
	Defer   bool // judged after the stack's translation (only replies pass by it)
	Flags   uint32
}

// ListFlows returns every entry of every flow table.
func (pl Policy) ListFlows() ([]PolicyFlow, error) {
	var out []PolicyFlow
	err := pl.m.eachPolicyFlowTable(func(_ PolicyCTPartKey, t *ebpf.Map) error {
		err := scan(t, func(k *PolicyCTKey, v *PolicyCTVal) {
			out = append(out, PolicyFlow{Ifindex: int(k.Ifindex), Proto: k.Proto,
				Pod: addrPort(k.PodAddr, k.Family, k.PodPort), Peer: addrPort(k.PeerAddr, k.Family, k.PeerPort),
				Egress: v.Flags&PolicyCTEgress != 0, Defer: v.Flags&PolicyCTDefer != 0, Flags: v.Flags})
		})
		if err != nil {
			return fmt.Errorf("scan a table of %s: %w", namePolCTParts, err)
		}
		return nil
	})
	return out, err
}

// ProgrammedPolicy is what the maps hold for one interface, read back.
type ProgrammedPolicy struct {
	Ifindex         int
	Mode            [2]string // "open", "isolated", "pending", indexed by policy.Direction
	Ingress, Egress policy.Rules
}

// PolicyWriter programs compiled NetworkPolicy into the maps: it implements
// policy.Writer for the agent. Apply is double-buffered: the new rules are
// written under fresh rule set ids beside the old ones, one update of the
// interface's state switches both directions to them, and the old sets are
// deleted only after retireAfter, so a packet never meets a half-written or
// half-deleted set. One writer per node (the agent); the plugin only marks
// interfaces pending and forgets them (AddFlowTables and MarkPending, DeleteOf).
type PolicyWriter struct {
	m  *Maps
	mu sync.Mutex
	// sets: the trie keys of every rule set (by id), and of every port set,
	// as last written or found by the first scan.
	addrKeys map[uint32][]PolicyAddrKey
	portKeys map[uint32][]PolicyPortKey
	portsOf  map[uint32][]uint32 // rule set -> its port sets
	applied  map[uint32]policy.Endpoint
	retired  []retiredSet
	scanned  bool
}

type retiredSet struct {
	set uint32
	at  time.Time
}

var _ policy.Writer = (*PolicyWriter)(nil)

// Writer returns the node's writer over m (which it keeps using: do
// not Close m while it is in use).
func (pl Policy) Writer() *PolicyWriter {
	return &PolicyWriter{m: pl.m, addrKeys: map[uint32][]PolicyAddrKey{}, portKeys: map[uint32][]PolicyPortKey{},
		portsOf: map[uint32][]uint32{}, applied: map[uint32]policy.Endpoint{}}
}

// load scans both tries once, so sets written by an earlier writer (an
// agent before its restart) are known: their ids are never reused, and
// Apply and Sweep can delete them. Sets no state refers to (an earlier
// writer killed between its writes, DELs since) are deleted then.
func (w *PolicyWriter) load() error {
	if w.scanned {
		return nil
	}
	var (
		ak PolicyAddrKey
		av PolicyAddrVal
		pk PolicyPortKey
		pv uint32
	)
	it := w.m.get(namePolAddrs).Iterate()
	for it.Next(&ak, &av) {
		w.addrKeys[ak.Set] = append(w.addrKeys[ak.Set], ak)
		if av.Flags&polAllPorts == 0 && av.Ports != 0 && !slices.Contains(w.portsOf[ak.Set], av.Ports) {
			w.portsOf[ak.Set] = append(w.portsOf[ak.Set], av.Ports)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("scan %s: %w", namePolAddrs, err)
	}
	it = w.m.get(namePolPorts).Iterate()
	for it.Next(&pk, &pv) {
		w.portKeys[pk.Set] = append(w.portKeys[pk.Set], pk)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("scan %s: %w", namePolPorts, err)
	}
	w.scanned = true
	_, err := w.sweep()
	return err
}

// newID returns a random nonzero id no set (rule or port) uses.
func (w *PolicyWriter) newID() (uint32, error) {
	var b [4]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		id := binary.NativeEndian.Uint32(b[:])
		if id == 0 {
			continue
		}
		if _, ok := w.addrKeys[id]; ok {
			continue
		}
		if _, ok := w.portKeys[id]; ok {
			continue
		}
		return id, nil
	}
}

// Apply programs ep for the interface ifindex (policy.Writer).
func (w *PolicyWriter) Apply(ifindex uint32, ep policy.Endpoint) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.load(); err != nil {
		return err
	}
	w.collect(false)
	if err := validateRules(ep.Ingress); err != nil {
		return fmt.Errorf("ifindex %d ingress: %w", ifindex, err)
	}
	if err := validateRules(ep.Egress); err != nil {
		return fmt.Errorf("ifindex %d egress: %w", ifindex, err)
	}
	old, hasOld, err := w.m.Policy().StateOf(int(ifindex))
	if err != nil {
		return err
	}
	// The same rules as programmed (an agent's resync): only the names change.
	if prev, ok := w.applied[ifindex]; ok && hasOld && sameRules(prev, ep) && old.Mode == modes(ep) {
		w.applied[ifindex] = ep
		return nil
	}
	var st PolicyState
	st.Mode = modes(ep)
	var written []uint32
	undo := func() {
		for _, s := range written {
			w.deleteSet(s)
		}
	}
	for d, r := range []policy.Rules{ep.Ingress, ep.Egress} {
		if !r.Isolated || len(r.Allows) == 0 {
			continue
		}
		set, err := w.writeSet(r)
		if set != 0 {
			written = append(written, set)
		}
		if err != nil {
			undo()
			return w.failClosed(ifindex, ep, old, hasOld, fmt.Errorf("ifindex %d %s: %w", ifindex, policy.Direction(d), err))
		}
		st.Rules[dirIndex(policy.Direction(d))] = set
	}
	k := ifindex
	if err := w.m.get(namePolState).Put(&k, &st); err != nil {
		undo()
		return writeErr(w.m.get(namePolState), namePolState, fmt.Sprintf("state of ifindex %d", ifindex), err)
	}
	w.applied[ifindex] = ep
	if hasOld {
		w.retire(old)
	}
	return nil
}

// failClosed is Apply's answer to rules that do not fit (a full trie):
// the interface must not keep its previous policy, which may be open or
// allow what the new rules take away. Each direction the new policy
// isolates is isolated with no rule (the node, and replies of flows
// already allowed, pass) until a retry of Apply fits; cause is returned.
//
// A restarted writer rewrites every interface beside its old sets, which a
// trie more than half full cannot hold: when the old sets already hold
// exactly ep, they are kept (read back: a scan, on this path only).
func (w *PolicyWriter) failClosed(ifindex uint32, ep policy.Endpoint, old PolicyState, hasOld bool, cause error) error {
	if hasOld && old.Mode == modes(ep) {
		if p, ok, err := w.m.Policy().Read(int(ifindex)); err == nil && ok && sameRules(policy.Endpoint{Ingress: p.Ingress, Egress: p.Egress}, ep) {
			w.applied[ifindex] = ep
			return nil
		}
	}
	delete(w.applied, ifindex) // the next Apply writes, whatever it is given
	st := PolicyState{Mode: modes(ep)}
	k := ifindex
	if err := w.m.get(namePolState).Put(&k, &st); err != nil {
		return errors.Join(cause, writeErr(w.m.get(namePolState), namePolState, fmt.Sprintf("state of ifindex %d", ifindex), err))
	}
	if hasOld {
		w.retire(old)
	}
	return cause
}

// Remove forgets the interface (policy.Writer): its state, flows and sets.
func (w *PolicyWriter) Remove(ifindex uint32) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.load(); err != nil {
		return err
	}
	old, hasOld, err := w.m.Policy().StateOf(int(ifindex))
	if err != nil {
		return err
	}
	if err := w.m.Policy().DeleteOf(int(ifindex)); err != nil {
		return err
	}
	delete(w.applied, ifindex)
	if hasOld {
		w.retire(old)
	}
	w.collect(false)
	return nil
}

// Flush deletes every retired set now, whatever its age (tests, shutdown).
func (w *PolicyWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.collect(true)
}

// Sweep deletes every set no interface's state refers to (left by a DEL,
// which forgets only the state, or by a writer killed part way) and
// returns how many. The agent calls it now and then.
func (w *PolicyWriter) Sweep() (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.load(); err != nil {
		return 0, err
	}
	return w.sweep()
}

func (w *PolicyWriter) sweep() (int, error) {
	used := map[uint32]bool{}
	var (
		k  uint32
		st PolicyState
	)
	it := w.m.get(namePolState).Iterate()
	for it.Next(&k, &st) {
		used[st.Rules[0]], used[st.Rules[1]] = true, true
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("scan %s: %w", namePolState, err)
	}
	for _, r := range w.retired {
		used[r.set] = true // deleted by collect, once old enough
	}
	n := 0
	for s := range w.addrKeys {
		if !used[s] {
			w.deleteSet(s)
			n++
		}
	}
	// Port sets of no rule set (a writer killed between the two tries).
	owned := map[uint32]bool{}
	for _, ps := range w.portsOf {
		for _, p := range ps {
			owned[p] = true
		}
	}
	for p, keys := range w.portKeys {
		if !owned[p] {
			_ = deleteKeys(w.m.get(namePolPorts), keys)
			delete(w.portKeys, p)
			n++
		}
	}
	return n, nil
}

// retire queues the sets of a replaced state for deletion.
func (w *PolicyWriter) retire(old PolicyState) {
	now := time.Now()
	for _, s := range old.Rules {
		if s != 0 {
			w.retired = append(w.retired, retiredSet{set: s, at: now})
		}
	}
}

// collect deletes the retired sets old enough (all: every one).
func (w *PolicyWriter) collect(all bool) {
	keep := w.retired[:0]
	for _, r := range w.retired {
		if all || time.Since(r.at) >= retireAfter {
			w.deleteSet(r.set)
		} else {
			keep = append(keep, r)
		}
	}
	w.retired = keep
}

// deleteSet removes a rule set's entries and its port sets (best effort:
// a set left behind is referenced by nothing, and Sweep retries it).
func (w *PolicyWriter) deleteSet(set uint32) {
	if keys, ok := w.addrKeys[set]; ok {
		_ = deleteKeys(w.m.get(namePolAddrs), keys)
		delete(w.addrKeys, set)
	}
	for _, p := range w.portsOf[set] {
		_ = deleteKeys(w.m.get(namePolPorts), w.portKeys[p])
		delete(w.portKeys, p)
	}
	delete(w.portsOf, set)
}

// writeSet writes one direction's rules under a fresh set id, port sets
// first (an address entry never points at a missing port set). On error
// the id returned (nonzero once anything was written) is for undoing.
func (w *PolicyWriter) writeSet(r policy.Rules) (uint32, error) {
	set, err := w.newID()
	if err != nil {
		return 0, err
	}
	w.addrKeys[set] = nil // reserve the id
	portSets := map[string]uint32{}
	am, pm := w.m.get(namePolAddrs), w.m.get(namePolPorts)
	for _, a := range r.Allows {
		var v PolicyAddrVal
		if a.AllPorts {
			v.Flags = polAllPorts
		} else if len(a.Ports) > 0 {
			sig := fmt.Sprint(a.Ports)
			id, ok := portSets[sig]
			if !ok {
				if id, err = w.newID(); err != nil {
					return set, err
				}
				w.portKeys[id] = nil
				w.portsOf[set] = append(w.portsOf[set], id)
				portSets[sig] = id
				one := uint32(1)
				for _, pr := range a.Ports {
					for _, pfx := range portPrefixes(pr.First, pr.Last) {
						pk := PolicyPortKey{Prefixlen: polPortKeyBits + uint32(pfx.bits), Set: id, Proto: pr.Proto, Port: htons(pfx.port)}
						if err := pm.Put(&pk, &one); err != nil {
							return set, writeErr(pm, namePolPorts, fmt.Sprintf("port %d/%d", pfx.port, pfx.bits), err)
						}
						w.portKeys[id] = append(w.portKeys[id], pk)
					}
				}
			}
			v.Ports = id
		}
		ak := addrKey(set, a.Prefix)
		if err := am.Put(&ak, &v); err != nil {
			return set, writeErr(am, namePolAddrs, "peer "+a.Prefix.String(), err)
		}
		w.addrKeys[set] = append(w.addrKeys[set], ak)
	}
	return set, nil
}

func addrKey(set uint32, p netip.Prefix) PolicyAddrKey {
	k := PolicyAddrKey{Prefixlen: polAddrKeyBits + uint32(p.Bits()), Set: set}
	if p.Addr().Is4() {
		k.Family = afInet
		a := p.Addr().As4()
		copy(k.Addr[:], a[:])
	} else {
		k.Family = afInet6
		k.Addr = p.Addr().As16()
	}
	return k
}

type portPrefix struct {
	port uint16
	bits int
}

// portPrefixes covers first..last with the fewest prefixes (at most 30).
func portPrefixes(first, last uint16) []portPrefix {
	var out []portPrefix
	lo, hi := uint32(first), uint32(last)
	for lo <= hi {
		size := uint32(1)
		for size < 1<<16 && lo%(size*2) == 0 && lo+size*2-1 <= hi {
			size *= 2
		}
		bits := 16
		for s := size; s > 1; s >>= 1 {
			bits--
		}
		out = append(out, portPrefix{port: uint16(lo), bits: bits})
		lo += size
	}
	return out
}

// validateRules refuses what the compiler must never hand over: an
// unmasked or invalid prefix, the same prefix twice (the trie keeps one),
// a port range of another protocol or upside down, allows of an open
// direction.
func validateRules(r policy.Rules) error {
	if !r.Isolated && len(r.Allows) > 0 {
		return errors.New("allows given for a direction that is not isolated")
	}
	seen := map[netip.Prefix]bool{}
	for _, a := range r.Allows {
		if !a.Prefix.IsValid() || a.Prefix != a.Prefix.Masked() || a.Prefix.Addr().Is4In6() {
			return fmt.Errorf("prefix %s is not a masked IPv4 or IPv6 prefix", a.Prefix)
		}
		if seen[a.Prefix] {
			return fmt.Errorf("prefix %s appears twice", a.Prefix)
		}
		seen[a.Prefix] = true
		for _, p := range a.Ports {
			if p.Proto != policy.ProtoTCP && p.Proto != policy.ProtoUDP && p.Proto != policy.ProtoSCTP {
				return fmt.Errorf("prefix %s: protocol %d is not TCP, UDP or SCTP", a.Prefix, p.Proto)
			}
			if p.First > p.Last {
				return fmt.Errorf("prefix %s: port range %d-%d is upside down", a.Prefix, p.First, p.Last)
			}
		}
	}
	return nil
}

func modes(ep policy.Endpoint) [2]uint8 {
	var m [2]uint8
	if ep.Ingress.Isolated {
		m[dirIndex(policy.Ingress)] = PolicyIsolated
	}
	if ep.Egress.Isolated {
		m[dirIndex(policy.Egress)] = PolicyIsolated
	}
	return m
}

// dirIndex is the index of a policy direction in pol_state (enum cni_dir).
func dirIndex(d policy.Direction) int {
	if d == policy.Egress {
		return int(DirEgress)
	}
	return int(DirIngress)
}

func sameRules(a, b policy.Endpoint) bool {
	eq := func(x, y policy.Rules) bool {
		return x.Isolated == y.Isolated && slices.EqualFunc(x.Allows, y.Allows, func(p, q policy.Allow) bool {
			return p.Prefix == q.Prefix && p.AllPorts == q.AllPorts && slices.Equal(p.Ports, q.Ports)
		})
	}
	return eq(a.Ingress, b.Ingress) && eq(a.Egress, b.Egress)
}

// readPortSets fills each port set of sets (by id) with the ranges its
// trie entries cover (one range per prefix; Read merges them).
func (pl Policy) readPortSets(sets map[uint32][]policy.PortRange) error {
	if len(sets) == 0 {
		return nil
	}
	var (
		pk PolicyPortKey
		pv uint32
	)
	it := pl.m.get(namePolPorts).Iterate()
	for it.Next(&pk, &pv) {
		if _, ok := sets[pk.Set]; !ok {
			continue
		}
		first := ntohs(pk.Port)
		n := uint32(1) << (16 - (pk.Prefixlen - polPortKeyBits))
		sets[pk.Set] = append(sets[pk.Set], policy.PortRange{Proto: pk.Proto, First: first, Last: uint16(uint32(first) + n - 1)})
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("scan %s: %w", namePolPorts, err)
	}
	return nil
}

// Read reads back what the maps hold for one interface (scans of the
// tries: for dumps, not for a packet's path).
func (pl Policy) Read(ifindex int) (ProgrammedPolicy, bool, error) {
	out := ProgrammedPolicy{Ifindex: ifindex}
	st, ok, err := pl.StateOf(ifindex)
	if err != nil || !ok {
		return out, ok, err
	}
	out.Mode[policy.Ingress] = ModeName(st.Mode[dirIndex(policy.Ingress)])
	out.Mode[policy.Egress] = ModeName(st.Mode[dirIndex(policy.Egress)])
	out.Ingress.Isolated = st.Mode[dirIndex(policy.Ingress)] != PolicyOpen
	out.Egress.Isolated = st.Mode[dirIndex(policy.Egress)] != PolicyOpen
	sets := map[uint32]*policy.Rules{}
	if s := st.Rules[dirIndex(policy.Ingress)]; s != 0 {
		sets[s] = &out.Ingress
	}
	if s := st.Rules[dirIndex(policy.Egress)]; s != 0 {
		sets[s] = &out.Egress
	}
	if len(sets) == 0 {
		return out, true, nil
	}
	type entry struct {
		rules *policy.Rules
		allow policy.Allow
		ports uint32
	}
	var entries []entry
	var (
		ak PolicyAddrKey
		av PolicyAddrVal
	)
	it := pl.m.get(namePolAddrs).Iterate()
	for it.Next(&ak, &av) {
		r, ok := sets[ak.Set]
		if !ok {
			continue
		}
		addr, _ := netip.AddrFromSlice(ak.Addr[:16])
		if ak.Family == afInet {
			addr = netip.AddrFrom4([4]byte(ak.Addr[:4]))
		}
		e := entry{rules: r, allow: policy.Allow{Prefix: netip.PrefixFrom(addr, int(ak.Prefixlen-polAddrKeyBits)),
			AllPorts: av.Flags&polAllPorts != 0}, ports: av.Ports}
		entries = append(entries, e)
	}
	if err := it.Err(); err != nil {
		return out, true, fmt.Errorf("scan %s: %w", namePolAddrs, err)
	}
	ports := map[uint32][]policy.PortRange{}
	for _, e := range entries {
		if !e.allow.AllPorts && e.ports != 0 {
			ports[e.ports] = nil
		}
	}
	if err := pl.readPortSets(ports); err != nil {
		return out, true, err
	}
	for _, e := range entries {
		if !e.allow.AllPorts {
			e.allow.Ports = mergeRanges(ports[e.ports])
		}
		e.rules.Allows = append(e.rules.Allows, e.allow)
	}
	for _, r := range []*policy.Rules{&out.Ingress, &out.Egress} {
		slices.SortFunc(r.Allows, func(a, b policy.Allow) int {
			if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
				return c
			}
			return cmp.Compare(a.Prefix.Bits(), b.Prefix.Bits())
		})
	}
	return out, true, nil
}

// mergeRanges sorts ranges by protocol and first port and joins adjacent ones.
func mergeRanges(rs []policy.PortRange) []policy.PortRange {
	slices.SortFunc(rs, func(a, b policy.PortRange) int {
		if c := cmp.Compare(a.Proto, b.Proto); c != 0 {
			return c
		}
		return cmp.Compare(a.First, b.First)
	})
	var out []policy.PortRange
	for _, r := range rs {
		if n := len(out); n > 0 && out[n-1].Proto == r.Proto && uint32(out[n-1].Last)+1 >= uint32(r.First) {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// States lists the state of every interface that has one.
func (pl Policy) States() (map[int]PolicyState, error) {
	out := map[int]PolicyState{}
	var (
		k  uint32
		st PolicyState
	)
	it := pl.m.get(namePolState).Iterate()
	for it.Next(&k, &st) {
		out[int(k)] = st
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("scan %s: %w", namePolState, err)
	}
	return out, nil
}
