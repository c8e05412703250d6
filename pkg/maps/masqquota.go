package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Go twins of the quota structs in bpf/lib/types.h, generated from BTF.
type (
	MasqPodVal = mapsObjMasqPodVal
	MasqQuota  = mapsObjMasqQuota
)

// Names of the quota maps, as bpf/lib/maps.h declares them. Both were added
// within layout 3 (see optionalMaps).
var (
	nameMasqPods  = mapName(&specNames.CniMasqPods)
	nameMasqQuota = mapName(&specNames.CniMasqQuota)
)

// optionalMaps were added to layout 3 after builds of it shipped: Create
// pins them where such a build left none (the programs of this build are
// loaded over maps from Create only), and Open and OpenPinned take a pin
// set without them (an older build of the layout set it up, and this
// build's DEL still tears its pods down). No older program reads them.
// cni_after_links (afterlinks.go) and cni_node_ips_gone (nodeipsgone.go)
// were added to layout 4 so, cni_sf_pool, cni_sf_slots (sfpool.go),
// cni_tun_self (tunnel.go), cni_ev_hot (events.go), cni_hp_frags,
// cni_hp_frag_notes and cni_hp_frag_stats (hostport.go) and cni_tun_hops
// (tunnel.go) and cni_self_cidrs (selfcidrs.go) to layout 5.
var optionalMaps = map[string]bool{nameMasqPods: true, nameMasqQuota: true, nameMasqKeys: true, nameAfterLinks: true,
	nameNodeIPsGone: true, nameTunSelf: true, nameSFPool: true, nameSFSlots: true, nameEvHot: true, nameHPFrags: true,
	nameHPFragNotes: true, nameHPFragStats: true, nameTunHops: true, nameSelfCIDRs: true}

// lruSpareFlows is how many flows cni_snat keeps free so that its LRU
// never evicts: the kernel's LRU hash moves free entries to each CPU in
// batches of 128 and evicts once the shared free list holds fewer than
// that, so up to 128 entries per CPU and 128 more may sit unused while it
// evicts (kernel/bpf/bpf_lru_list.c, LOCAL_FREE_TARGET). Two entries a
// flow; and a flow per CPU may pass the bound at once (the counts are
// checked, then added).
func lruSpareFlows(cpus int) int { return 64*(cpus+2) + cpus }

// reservePerAttachment is the flows every attachment may open whatever
// the others hold: an eighth of the flows each pod is sized for.
const reservePerAttachment = flowsPerPod / 8

// QuotaFor is the quota of a cni_snat of snatEntries entries on a node of
// maxPods and cpus: every attachment (two per pod) has its reserve, the
// rest but the LRU's spare is the pool, one pod holds at most its reserve
// and half the pool. Then pool + attachments x reserve flows, the most the
// pods can hold in all, leave the spare free.
func QuotaFor(snatEntries, maxPods, cpus int) MasqQuota {
	flows := snatEntries / 2
	att := maxPods * attachmentsPerPod
	avail := flows - lruSpareFlows(cpus)
	if avail < flows/2 {
		// A tiny table on many CPUs: the spare would eat most of it. Keep
		// half; the LRU may then evict near full (TestQuotaFor).
		avail = flows / 2
	}
	reserve := min(reservePerAttachment, avail/(2*att))
	pool := avail - att*reserve
	return MasqQuota{Reserve: uint32(reserve), Pool: uint32(pool), PodMax: uint32(reserve + pool/2)}
}

// initMasqQuota writes cni_masq_quota once, when it was never written
// (the maps were just pinned, or pinned by a build without the quota).
func (m *Maps) initMasqQuota(s Sizing) error {
	mp := m.get(nameMasqQuota)
	zero := uint32(0)
	var cur MasqQuota
	if err := mp.Lookup(&zero, &cur); err != nil {
		return fmt.Errorf("read %s: %w", nameMasqQuota, err)
	}
	if cur.PodMax != 0 {
		return nil
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("count the CPUs for %s: %w", nameMasqQuota, err)
	}
	q := QuotaFor(int(m.get(nameSNAT).MaxEntries()), s.MaxPods, cpus)
	if err := mp.Put(&zero, &q); err != nil {
		return fmt.Errorf("write %s: %w", nameMasqQuota, err)
	}
	return nil
}

// Quota reads cni_masq_quota (zero: no quota, pins of an older build).
func (ms Masq) Quota() (MasqQuota, error) {
	var q MasqQuota
	mp := ms.m.get(nameMasqQuota)
	if mp == nil {
		return q, nil
	}
	zero := uint32(0)
	if err := mp.Lookup(&zero, &q); err != nil {
		return q, fmt.Errorf("read %s: %w", nameMasqQuota, err)
	}
	return q, nil
}

// MasqPodFlows is what cni_masq_pods holds for one pod (Ifindex 0: the
// node's total).
type MasqPodFlows struct {
	Ifindex int
	Flows   int // flows held in cni_snat
	Drops   int // new flows refused for the quota
}

// ListPods returns cni_masq_pods.
func (ms Masq) ListPods() ([]MasqPodFlows, error) {
	mp := ms.m.get(nameMasqPods)
	if mp == nil {
		return nil, nil
	}
	var out []MasqPodFlows
	err := scan(mp, func(k *uint32, v *MasqPodVal) {
		out = append(out, MasqPodFlows{Ifindex: int(*k), Flows: int(v.Flows), Drops: int(v.Drops)})
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", nameMasqPods, err)
	}
	return out, nil
}

// forgetMasqPod drops the pod's count and takes its flows off the node's
// total (whose flows its caller deletes). A timer deleting one of them
// meanwhile takes it off too: the total can end a few low, which loosens
// the bound by as many flows, never below 0.
func (m *Maps) forgetMasqPod(ifindex int) error {
	mp := m.get(nameMasqPods)
	if mp == nil || ifindex == 0 {
		return nil
	}
	k := uint32(ifindex)
	var v MasqPodVal
	if err := mp.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("read %s of ifindex %d: %w", nameMasqPods, ifindex, err)
	}
	if err := mp.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete ifindex %d from %s: %w", ifindex, nameMasqPods, err)
	}
	zero := uint32(0)
	var all MasqPodVal
	if err := mp.Lookup(&zero, &all); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("read %s total: %w", nameMasqPods, err)
	}
	all.Flows -= min(all.Flows, v.Flows)
	if err := mp.Update(&zero, &all, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("write %s total: %w", nameMasqPods, err)
	}
	return nil
}
