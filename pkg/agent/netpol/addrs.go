package netpol

import (
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy/compile"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// podAddrs feeds pods to the snapshot with the addresses that count, which
// are not always those of the API's status. The node is authoritative for
// its own pods: CNI ADD's record gives a pod its addresses and DEL takes
// them back at once, while the pod's object may say Running with them for
// a while after the teardown (deletionTimestamp set, the kubelet
// finishing). host-local hands a freed address to the next ADD meanwhile:
// read from the API, the new pod would inherit the old one's identity as a
// peer (TestAttack19IPReuse). So:
//   - an address a record of this node gives to a pod is never another
//     pod's, whatever its object says: a local record wins over any API
//     status (the torn-down pod's address is taken from it the moment an
//     ADD reuses it, before the new pod's interface opens);
//   - a pod with a record of this node also has the addresses of its
//     records, before the API reports them or after a sandbox restart
//     (unless its object names another node: the record is of a previous
//     pod of that name, force-deleted here and not yet torn down).
//
// A pod of this node without a record keeps its API addresses no record
// claims: a pod another CNI attached (a migration between CNIs, ebpf-cni
// as a Multus secondary network) is still a peer.
//
// Host-network pods keep theirs (the node's: no record holds them).
type podAddrs struct {
	snap     *compile.Snapshot
	nodeName string

	mu     sync.Mutex
	api    map[compile.PodKey]apiPod
	byAddr map[netip.Addr]map[compile.PodKey]struct{} // API pods by the addresses their status gives
	local  map[compile.PodKey][]netip.Addr            // the addresses this node's records give each pod
	owner  map[netip.Addr]compile.PodKey              // whom a record of this node gives each address
}

// apiPod is a pod as the API reports it.
type apiPod struct {
	pod  compile.Pod
	node string // spec.nodeName
}

func newPodAddrs(snap *compile.Snapshot, nodeName string) *podAddrs {
	return &podAddrs{snap: snap, nodeName: nodeName, api: map[compile.PodKey]apiPod{},
		byAddr: map[netip.Addr]map[compile.PodKey]struct{}{}, local: map[compile.PodKey][]netip.Addr{},
		owner: map[netip.Addr]compile.PodKey{}}
}

// upsert is a pod informer's add or update.
func (a *podAddrs) upsert(p *corev1.Pod) {
	cp := compile.PodFromAPI(p)
	k := compile.PodKey{Namespace: cp.Namespace, Name: cp.Name}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.index(k, false)
	a.api[k] = apiPod{pod: cp, node: p.Spec.NodeName}
	a.index(k, true)
	a.snap.UpsertPod(a.effective(k))
}

// remove is a pod informer's delete.
func (a *podAddrs) remove(namespace, name string) {
	k := compile.PodKey{Namespace: namespace, Name: name}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.index(k, false)
	delete(a.api, k)
	a.snap.DeletePod(namespace, name)
}

// index adds (on) or removes k's API addresses in byAddr.
func (a *podAddrs) index(k compile.PodKey, on bool) {
	ap, ok := a.api[k]
	if !ok {
		return
	}
	for _, ip := range ap.pod.IPs {
		ks := a.byAddr[ip]
		switch {
		case on && ks == nil:
			a.byAddr[ip] = map[compile.PodKey]struct{}{k: {}}
		case on:
			ks[k] = struct{}{}
		default:
			delete(ks, k)
			if len(ks) == 0 {
				delete(a.byAddr, ip)
			}
		}
	}
}

// effective is the pod k (known to the API) with the addresses that count.
func (a *podAddrs) effective(k compile.PodKey) compile.Pod {
	ap := a.api[k]
	p := ap.pod
	if p.HostNetwork {
		return p
	}
	elsewhere := a.nodeName != "" && ap.node != "" && ap.node != a.nodeName
	var keep []netip.Addr
	if ips, ok := a.local[k]; ok && !elsewhere {
		keep = slices.Clone(ips)
	}
	for _, ip := range p.IPs {
		if o, taken := a.owner[ip]; (!taken || o == k) && !slices.Contains(keep, ip) {
			keep = append(keep, ip)
		}
	}
	slices.SortFunc(keep, netip.Addr.Compare)
	p.IPs = keep
	return p
}

// setRecords takes the node's attachment records as they are now and
// re-feeds the pods whose addresses that changes.
func (a *podAddrs) setRecords(recs []*state.Record) {
	local, owner := recordAddrs(recs)
	a.mu.Lock()
	defer a.mu.Unlock()
	touched := map[compile.PodKey]struct{}{}
	for _, pair := range [][2]map[compile.PodKey][]netip.Addr{{a.local, local}, {local, a.local}} {
		for k, ips := range pair[0] {
			if other, ok := pair[1][k]; !ok || !slices.Equal(ips, other) {
				touched[k] = struct{}{}
			}
		}
	}
	for _, pair := range [][2]map[netip.Addr]compile.PodKey{{a.owner, owner}, {owner, a.owner}} {
		for ip, o := range pair[0] {
			if other, ok := pair[1][ip]; !ok || other != o {
				for k := range a.byAddr[ip] {
					touched[k] = struct{}{}
				}
			}
		}
	}
	a.local, a.owner = local, owner
	for k := range touched {
		if _, ok := a.api[k]; ok {
			a.snap.UpsertPod(a.effective(k))
		}
	}
}

// recordAddrs reads the addresses out of the records: each pod's (sorted),
// and whom each address is given to. Two records giving one address (an
// IPAM that reused it while a stale record stayed) give it to the newest
// ADD's pod. A record of no pod (no K8S_POD_NAME) still takes its
// addresses from the API's pods.
func recordAddrs(recs []*state.Record) (map[compile.PodKey][]netip.Addr, map[netip.Addr]compile.PodKey) {
	newest := slices.Clone(recs)
	slices.SortStableFunc(newest, func(x, y *state.Record) int { return y.Created.Compare(x.Created) })
	local := map[compile.PodKey][]netip.Addr{}
	owner := map[netip.Addr]compile.PodKey{}
	for _, r := range newest {
		ips := recordIPs(r)
		if len(ips) == 0 {
			continue // provisional: ADD has no address yet
		}
		k := compile.PodKey{Namespace: r.PodNamespace, Name: r.PodName}
		for _, ip := range ips {
			if o, taken := owner[ip]; taken && o != k {
				continue
			}
			owner[ip] = k
			if r.PodName != "" && !slices.Contains(local[k], ip) {
				local[k] = append(local[k], ip)
			}
		}
		if r.PodName != "" && local[k] == nil {
			local[k] = []netip.Addr{} // its addresses went to newer ADDs
		}
	}
	for _, ips := range local {
		slices.SortFunc(ips, netip.Addr.Compare)
	}
	return local, owner
}

// recordIPs are a record's addresses (ADD writes them bare; a prefix is
// taken for its address).
func recordIPs(r *state.Record) []netip.Addr {
	var out []netip.Addr
	for _, s := range r.IPs {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			pfx, perr := netip.ParsePrefix(s)
			if perr != nil {
				continue
			}
			ip = pfx.Addr()
		}
		out = append(out, ip.Unmap())
	}
	return out
}
