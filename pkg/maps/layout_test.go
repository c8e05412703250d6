package maps

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// layouts holds the fingerprint of the map layout each LayoutVersion stands
// for. A change to bpf/lib/types.h or bpf/lib/maps.h that alters a map
// (type, sizes, flags) or a key or value struct (fields, offsets) changes
// the fingerprint: then LayoutVersion must be bumped, so a new build never
// opens pins of the old layout, and the new fingerprint recorded here.
var layouts = map[int]string{
	1: "9948a12e1789aaaf",
	2: "b84671b938a29b9c", // NAT (flow timers and state in cni_ct/cni_snat, cni_masq_config, cni_masq_share, IPv6 masquerade, ICMP error counters), bandwidth (bw_state.queue_ns, mark_ns; netns_info.rcv_wnd), node resources (sizes from maxPods, cni_stats not preallocated, cni_cidr_refs)
	3: "095634a0ecb41662", // datapath events (cni_events ring buffer, cni_ev_config, cni_ev_cpu, cni_ev_pods, cni_ev_flows), per-pod stack-flow tables (cni_stack_flow_parts), NetworkPolicy (cni_pol_*, the flows in per-interface tables cni_pol_ct_parts, fragments in cni_pol_frag_parts); no existing map changed; maps of maps' tables fingerprinted too
	4: "189d5f1bfa258806", // the node tunnel (cni_tun_nodes, cni_tun_cidrs) and its two drop reasons (cni_stats sized for them); no existing struct changed
	5: "5732764004e67069", // drop_tunnel_mac (issue 24: a tunnel datagram from a MAC that is not the next hop toward its claimed node) and three drop reasons (the masquerade's port exhaustion and pod limit, a hostPort reply with no route: issue 25), cni_stats sized for them; ev_config.pad is trace_until_s (the per-pod trace's end); no size changed (07c02f5 pinned this layout: what came after it within layout 5 is optional maps only, and tun_peer.pad[0] named flags (TUN_PEER_ENCAP, issue 24): same sizes and offsets, and the zero an older pin holds drops nothing)
}

// optionalLayouts holds the fingerprint of the maps each LayoutVersion
// gained after builds of it shipped (optionalMaps: pinned by Create where
// missing, never read by older programs, so the version stays). Changing
// one of them, or any other map, is still a new layout.
var optionalLayouts = map[int]string{
	3: "dad4985bdee29790", // cni_masq_pods, cni_masq_quota (issue 28: the pods' quota of cni_snat), cni_masq_keys (which network decided cni_masq_config)
	4: "d8bb50807b8651f6", // the same maps as in 3 (pinned where a pin set of layout 3 lacks them), and cni_after_links (the links judging deferred egress policy)
	5: "6c049975a7b8126f", // the same as in 4, cni_node_ips_gone (since when masquerade mappings are checked against the node's addresses, issue 30), cni_sf_pool and cni_sf_slots (the node's pool of stack-flow tables, issue 30), cni_tun_self (the addresses the tunnel accepts datagrams to, issue 24), cni_ev_hot (each CPU's hot flow slots, issue 25), cni_hp_frags (the ports of hostPort datagrams' translated first fragments, issue 24), cni_hp_frag_notes and cni_hp_frag_stats (those notes 8 times as many, and the fragments' counters: issue 24's hardening; new maps, cni_hp_frags and cni_hp_stats keep their shape), cni_tun_hops (the outer-MAC check's recent FIB answers, issue 24), cni_self_cidrs (this node's own pod CIDRs, which from_uplink drops as sources off the wire: attack25)
}

func TestLayoutVersion(t *testing.T) {
	// The sizes are part of the layout: the rule that derives them from
	// the sizing, seen at the defaults and at another sizing.
	var b, opt strings.Builder
	for _, sz := range []Sizing{DefaultSizing, {MaxPods: 250, HostPortsPerPod: 4}} {
		ss, err := sized(sz)
		if err != nil {
			t.Fatal(err)
		}
		names := make([]string, 0, len(ss))
		for n := range ss {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(&b, "sizing %s\n", sz)
		fmt.Fprintf(&opt, "sizing %s\n", sz)
		for _, n := range names {
			s := ss[n]
			b := &b
			if optionalMaps[n] {
				b = &opt
			}
			fmt.Fprintf(b, "%s %s key=%d value=%d max=%d flags=%d key:%s value:%s\n", n, s.Type, s.KeySize, s.ValueSize,
				s.MaxEntries, s.Flags, layoutOf(s.Key), layoutOf(s.Value))
			// A map of maps' tables are part of its layout: the pinned
			// outer map holds their shape, and refuses other tables.
			if in := s.InnerMap; in != nil {
				fmt.Fprintf(b, "  inner %s key=%d value=%d max=%d flags=%d key:%s value:%s\n", in.Type, in.KeySize, in.ValueSize,
					in.MaxEntries, in.Flags, layoutOf(in.Key), layoutOf(in.Value))
			}
		}
	}
	osum := sha256.Sum256([]byte(opt.String()))
	if got, want := hex.EncodeToString(osum[:8]), optionalLayouts[LayoutVersion]; got != want {
		t.Errorf("the maps added within layout v%d changed (fingerprint %s, recorded %q): record %q for it if they are new, else bump LayoutVersion\n%s",
			LayoutVersion, got, want, got, opt.String())
	}
	sum := sha256.Sum256([]byte(b.String()))
	got := hex.EncodeToString(sum[:8])
	want, ok := layouts[LayoutVersion]
	switch {
	case !ok || want == "":
		t.Fatalf("no fingerprint recorded for LayoutVersion %d: add %d: %q to layouts\n%s", LayoutVersion, LayoutVersion, got, b.String())
	case got != want:
		t.Fatalf("the map layout changed (fingerprint %s, LayoutVersion %d has %s): bump LayoutVersion and record %q for it\n%s",
			got, LayoutVersion, want, got, b.String())
	}
}

// layoutOf prints a BTF type as what the layout depends on: sizes, field
// names and offsets.
func layoutOf(t btf.Type) string {
	switch v := t.(type) {
	case nil:
		return "-"
	case *btf.Struct:
		return "struct" + members(v.Size, v.Members)
	case *btf.Union:
		return "union" + members(v.Size, v.Members)
	case *btf.Int:
		return fmt.Sprintf("%s%d", map[bool]string{true: "s", false: "u"}[v.Encoding == btf.Signed], v.Size*8)
	case *btf.Array:
		return fmt.Sprintf("[%d]%s", v.Nelems, layoutOf(v.Type))
	case *btf.Typedef:
		return layoutOf(v.Type)
	case *btf.Volatile:
		return layoutOf(v.Type)
	case *btf.Const:
		return layoutOf(v.Type)
	case *btf.Enum:
		return fmt.Sprintf("enum%d", v.Size*8)
	}
	return fmt.Sprintf("%T", t)
}

func members(size uint32, ms []btf.Member) string {
	parts := make([]string, 0, len(ms))
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("%s@%d:%s", m.Name, m.Offset.Bytes(), layoutOf(m.Type)))
	}
	return fmt.Sprintf("%d{%s}", size, strings.Join(parts, " "))
}

// TestPinnedShapes: OpenPinned checks exactly the maps the embedded object
// has, each against its spec's type, sizes and flags (and entries, where no
// sizing decides them).
func TestPinnedShapes(t *testing.T) {
	ss, err := specs()
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for n, s := range ss {
		want = append(want, n)
		shape, ok := pinnedShapes[n]
		if !ok {
			continue
		}
		p := *shape // a copy: the table stays as OpenPinned reads it
		if _, sized := DefaultSizing.entries()[n]; sized {
			// The table's 0 marks a map the sizing sizes (compatible takes
			// the pin's size for it); a number there would say otherwise.
			if p.MaxEntries != 0 {
				t.Errorf("pinnedShapes[%s] has MaxEntries %d; a map the sizing sizes must have 0", n, p.MaxEntries)
			}
			p.MaxEntries = s.MaxEntries
		}
		if p.Type != s.Type || p.KeySize != s.KeySize || p.ValueSize != s.ValueSize || p.MaxEntries != s.MaxEntries || p.Flags != s.Flags {
			t.Errorf("pinnedShapes[%s] is %s key %d value %d max %d flags %d; the object's is %s key %d value %d max %d flags %d",
				n, p.Type, p.KeySize, p.ValueSize, p.MaxEntries, p.Flags, s.Type, s.KeySize, s.ValueSize, s.MaxEntries, s.Flags)
		}
	}
	for n := range pinnedShapes {
		got = append(got, n)
	}
	sort.Strings(want)
	sort.Strings(got)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("pinnedShapes has %v, the object's maps are %v", got, want)
	}
}

// TestInnerSpecs: the tables the verbs create (StackFlows().AddPart,
// Policy().AddFlowTables) are the inner maps bpf/lib/maps.h declares.
func TestInnerSpecs(t *testing.T) {
	ss, err := specs()
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range innerSpecs {
		in := ss[name].InnerMap
		if in == nil {
			t.Fatalf("%s has no inner map in the object", name)
		}
		if in.Type != p.Type || in.KeySize != p.KeySize || in.ValueSize != p.ValueSize || in.MaxEntries != p.MaxEntries || in.Flags != p.Flags {
			t.Errorf("%s: the spec of its tables is %s key %d value %d max %d flags %d; the object's is %s key %d value %d max %d flags %d",
				name, p.Type, p.KeySize, p.ValueSize, p.MaxEntries, p.Flags, in.Type, in.KeySize, in.ValueSize, in.MaxEntries, in.Flags)
		}
	}
	for name, s := range ss {
		if _, ok := innerSpecs[name]; s.InnerMap != nil && !ok {
			t.Errorf("%s is a map of maps that innerSpecs lacks", name)
		}
	}
}
