// Package compile turns Kubernetes NetworkPolicy (networking.k8s.io/v1) into
// the compiled form of package policy: for each pod, the isolated directions
// and the longest-prefix-match entries that say which peer addresses may use
// which protocols and ports. It keeps a Snapshot of the pods, namespaces and
// policies the agent's informers deliver, updated one object at a time, and
// recompiles only the pods a change can affect. It never talks to the API
// server (no client-go), so it stays testable and the agent owns the
// informers.
package compile

import (
	"maps"
	"net/netip"
	"slices"
	"sync"

	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// nsNameLabel is the label the API server puts on every namespace; a
// namespace the snapshot has not seen yet is assumed to carry only it.
const nsNameLabel = "kubernetes.io/metadata.name"

// Snapshot is the cluster as the agent sees it, with the compiled endpoint
// of each pod computed on demand and cached until a change may affect it.
// Safe for concurrent use.
type Snapshot struct {
	mu         sync.Mutex
	namespaces map[string]labels.Set
	pods       map[string]map[string]*Pod         // namespace, name
	policies   map[string]map[string]*policyEntry // namespace, name
	endpoints  map[PodKey]policy.Endpoint         // the cache
	dirty      map[PodKey]struct{}                // changed since TakeDirty
	// groups: the answers compiled since the last change, by groupKey
	// (pods with equal keys have equal answers); emptied by every change.
	groups map[string]policy.Endpoint
	// sameRules: the policies by rulesKey. Equal rules in one namespace
	// resolve alike and every change invalidates them alike (feeds,
	// selectorFlips and nsSelectorsFlip read only the rules), so one's
	// resolution serves all (resolve).
	sameRules map[string]*ruleGroup
	// selectedBy is the policies selecting each pod: policyEntry.selected
	// the other way round (setSelected keeps both).
	selectedBy map[PodKey]map[*policyEntry]struct{}
}

// ruleGroup is the policies of a namespace with equal rules (sameRules).
type ruleGroup struct{ members map[*policyEntry]struct{} }

type policyEntry struct {
	*parsedPolicy
	spec  networkingv1.NetworkPolicySpec // as given, to tell a resync from a change
	res   *resolved                      // nil: the peers changed since it was computed
	group *ruleGroup                     // the policies with its rules; nil: shares nothing
	// selected: the names of the pods of its namespace podSel matches,
	// kept as pods come, go and change labels, so marking them costs
	// them, not a scan of the namespace.
	selected map[string]struct{}
}

// resolved is a policy's rules with their peers turned into addresses, for
// whichever pod it selects; only ingress named ports wait for the pod.
type resolved struct {
	in, eg []resolvedRule
	// The flattened contributions (share.go), computed when first needed:
	// ingress per resolution of its named ports on the selected pod.
	inFlat map[string][]policy.Allow
	egFlat []policy.Allow
	egDone bool
}

type resolvedRule struct {
	atoms []atom // the peers' addresses with the numeric ports, and (egress) named ports per peer pod address
	// Ingress named ports resolve on the selected pod's own container
	// ports: peers (ports unset) and the names wait for it.
	peers []atom
	named []namedPort
}

// New returns an empty snapshot.
func New() *Snapshot {
	return &Snapshot{
		namespaces: map[string]labels.Set{},
		pods:       map[string]map[string]*Pod{},
		policies:   map[string]map[string]*policyEntry{},
		endpoints:  map[PodKey]policy.Endpoint{},
		dirty:      map[PodKey]struct{}{},
		groups:     map[string]policy.Endpoint{},
		sameRules:  map[string]*ruleGroup{},
		selectedBy: map[PodKey]map[*policyEntry]struct{}{},
	}
}

// UpsertPod adds or replaces a pod. The snapshot keeps its own copy.
func (s *Snapshot) UpsertPod(p Pod) {
	p.Labels = maps.Clone(p.Labels)
	ips := make([]netip.Addr, 0, len(p.IPs))
	for _, a := range p.IPs {
		if a.IsValid() {
			ips = append(ips, a.Unmap())
		}
	}
	p.IPs = ips
	p.Ports = slices.Clone(p.Ports)
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.pods[p.Namespace][p.Name]
	byName := s.pods[p.Namespace]
	if byName == nil {
		byName = map[string]*Pod{}
		s.pods[p.Namespace] = byName
	}
	byName[p.Name] = &p
	if old != nil && samePod(old, &p) {
		return // a status update or a resync: nothing the compiler reads
	}
	clear(s.groups)
	if old == nil || !maps.Equal(old.Labels, p.Labels) {
		lbls := labels.Set(p.Labels)
		for _, pe := range s.policies[p.Namespace] {
			s.setSelected(pe, p.Name, pe.podSel.Matches(lbls))
		}
	}
	s.podChanged(old, &p)
}

func samePod(a, b *Pod) bool {
	return a.HostNetwork == b.HostNetwork && maps.Equal(a.Labels, b.Labels) &&
		slices.Equal(a.IPs, b.IPs) && slices.Equal(a.Ports, b.Ports)
}

// DeletePod forgets a pod; Endpoint reports it unknown from then on.
func (s *Snapshot) DeletePod(namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.pods[namespace][name]
	if old == nil {
		return
	}
	delete(s.pods[namespace], name)
	if len(s.pods[namespace]) == 0 {
		delete(s.pods, namespace)
	}
	clear(s.groups)
	for _, pe := range s.policies[namespace] {
		s.setSelected(pe, name, false)
	}
	s.podChanged(old, nil)
}

// podChanged invalidates what old (before) and cur (after) may feed: the pod's
// own endpoint, and every policy that has either of them as a peer.
func (s *Snapshot) podChanged(old, cur *Pod) {
	k := PodKey{}
	if old != nil {
		k = PodKey{old.Namespace, old.Name}
	} else {
		k = PodKey{cur.Namespace, cur.Name}
	}
	s.markDirty(k)
	// Same addresses and ports (a relabel, a status update): a policy's
	// peers change only where one of its selectors flips on the pod.
	relabel := old != nil && cur != nil && old.HostNetwork == cur.HostNetwork &&
		slices.Equal(old.IPs, cur.IPs) && slices.Equal(old.Ports, cur.Ports)
	// Policies with equal rules get the same answer: asked once.
	byRules := map[*ruleGroup]bool{}
	for _, byName := range s.policies {
		for _, pe := range byName {
			changed, ok := byRules[pe.group]
			if !ok || pe.group == nil {
				if relabel {
					changed = s.selectorFlips(pe.parsedPolicy, old, cur)
				} else {
					changed = (old != nil && s.feeds(pe.parsedPolicy, old)) || (cur != nil && s.feeds(pe.parsedPolicy, cur))
				}
				byRules[pe.group] = changed
			}
			if changed {
				s.invalidate(pe)
			}
		}
	}
}

// selectorFlips reports whether a selector peer of p matches exactly one of
// old and cur (the same pod, with the same addresses and ports).
func (s *Snapshot) selectorFlips(p *parsedPolicy, old, cur *Pod) bool {
	if len(cur.IPs) == 0 || cur.HostNetwork {
		return false // no peer either way
	}
	for _, rules := range [][]parsedRule{p.inRules, p.egRules} {
		for _, r := range rules {
			for _, pe := range r.peers {
				if pe.block == nil && s.selects(p, pe, old) != s.selects(p, pe, cur) {
					return true
				}
			}
		}
	}
	return false
}

// feeds reports whether pod contributes to p's resolved peers.
func (s *Snapshot) feeds(p *parsedPolicy, pod *Pod) bool {
	if pod.HostNetwork || len(pod.IPs) == 0 {
		return false
	}
	check := func(rules []parsedRule, egress bool) bool {
		for _, r := range rules {
			namedPeers := egress && len(r.named) > 0
			if namedPeers && r.anyPeer {
				return true
			}
			for _, pe := range r.peers {
				if pe.block != nil {
					if namedPeers && slices.ContainsFunc(pod.IPs, pe.block.contains) {
						return true
					}
					continue
				}
				if s.selects(p, pe, pod) {
					return true
				}
			}
		}
		return false
	}
	return check(p.inRules, false) || check(p.egRules, true)
}

func (b *ipBlock) contains(a netip.Addr) bool {
	return atom{prefix: b.cidr, except: b.except}.contains(a)
}

// selects reports whether the selector peer pe of policy p matches pod.
func (s *Snapshot) selects(p *parsedPolicy, pe parsedPeer, pod *Pod) bool {
	if pe.block != nil || pod.HostNetwork {
		return false
	}
	if pe.nsSel == nil {
		if pod.Namespace != p.key.Namespace {
			return false
		}
	} else if !pe.nsSel.Matches(s.nsLabels(pod.Namespace)) {
		return false
	}
	return pe.podSel == nil || pe.podSel.Matches(labels.Set(pod.Labels))
}

func (s *Snapshot) nsLabels(ns string) labels.Set {
	if l, ok := s.namespaces[ns]; ok {
		return l
	}
	return labels.Set{nsNameLabel: ns}
}

// UpsertNamespace adds or replaces a namespace's labels.
func (s *Snapshot) UpsertNamespace(name string, lbls map[string]string) {
	l := labels.Set(maps.Clone(lbls))
	if l == nil {
		l = labels.Set{}
	}
	if _, ok := l[nsNameLabel]; !ok {
		l[nsNameLabel] = name // the API server guarantees it
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.nsLabels(name)
	s.namespaces[name] = l
	clear(s.groups)
	s.nsChanged(old, l)
}

// DeleteNamespace forgets a namespace's labels (its pods go with their own
// deletions).
func (s *Snapshot) DeleteNamespace(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.namespaces[name]
	if !ok {
		return
	}
	delete(s.namespaces, name)
	clear(s.groups)
	s.nsChanged(old, s.nsLabels(name))
}

// nsChanged invalidates the policies whose namespaceSelector peers match the
// namespace before and not after, or the reverse.
func (s *Snapshot) nsChanged(old, cur labels.Set) {
	for _, byName := range s.policies {
		for _, pe := range byName {
			if nsSelectorsFlip(pe.inRules, old, cur) || nsSelectorsFlip(pe.egRules, old, cur) {
				s.invalidate(pe)
			}
		}
	}
}

func nsSelectorsFlip(rules []parsedRule, old, cur labels.Set) bool {
	for _, r := range rules {
		for _, pe := range r.peers {
			if pe.nsSel != nil && pe.nsSel.Matches(old) != pe.nsSel.Matches(cur) {
				return true
			}
		}
	}
	return false
}

// UpsertPolicy adds or replaces a NetworkPolicy. A policy with fields the API
// server would have rejected is stored anyway, those fields compiled closed
// (see parsePolicy), and the error says which.
func (s *Snapshot) UpsertPolicy(np *networkingv1.NetworkPolicy) error {
	p, err := parsePolicy(np)
	s.mu.Lock()
	defer s.mu.Unlock()
	byName := s.policies[np.Namespace]
	if byName == nil {
		byName = map[string]*policyEntry{}
		s.policies[np.Namespace] = byName
	}
	old := byName[np.Name]
	if old != nil && apiequality.Semantic.DeepEqual(old.spec, np.Spec) {
		return err // a resync or a metadata change: same rules
	}
	clear(s.groups)
	pe := &policyEntry{parsedPolicy: p, spec: *np.Spec.DeepCopy(), selected: map[string]struct{}{}}
	if old != nil {
		s.markSelected(old)
		s.unselectAll(old)
		s.forgetRules(old)
		if p.rulesKey != "" && old.rulesKey == p.rulesKey {
			pe.res = old.res // its selector changed, not its peers
		}
	}
	byName[np.Name] = pe
	for name, pod := range s.pods[np.Namespace] {
		if p.podSel.Matches(labels.Set(pod.Labels)) {
			s.setSelected(pe, name, true)
		}
	}
	if p.rulesKey != "" {
		g := s.sameRules[p.rulesKey]
		if g == nil {
			g = &ruleGroup{members: map[*policyEntry]struct{}{}}
			s.sameRules[p.rulesKey] = g
		}
		g.members[pe] = struct{}{}
		pe.group = g
	}
	s.markSelected(pe)
	return err
}

// DeletePolicy forgets a NetworkPolicy.
func (s *Snapshot) DeletePolicy(namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.policies[namespace][name]
	if old == nil {
		return
	}
	delete(s.policies[namespace], name)
	if len(s.policies[namespace]) == 0 {
		delete(s.policies, namespace)
	}
	clear(s.groups)
	s.forgetRules(old)
	s.markSelected(old)
	s.unselectAll(old)
}

// setSelected records whether pe selects the pod name of its namespace,
// in both indexes.
func (s *Snapshot) setSelected(pe *policyEntry, name string, on bool) {
	k := PodKey{pe.key.Namespace, name}
	if on {
		pe.selected[name] = struct{}{}
		by := s.selectedBy[k]
		if by == nil {
			by = map[*policyEntry]struct{}{}
			s.selectedBy[k] = by
		}
		by[pe] = struct{}{}
		return
	}
	delete(pe.selected, name)
	if by := s.selectedBy[k]; by != nil {
		delete(by, pe)
		if len(by) == 0 {
			delete(s.selectedBy, k)
		}
	}
}

func (s *Snapshot) unselectAll(pe *policyEntry) {
	for name := range pe.selected {
		s.setSelected(pe, name, false)
	}
}

func (s *Snapshot) forgetRules(pe *policyEntry) {
	if g := pe.group; g != nil {
		delete(g.members, pe)
		if len(g.members) == 0 {
			delete(s.sameRules, pe.rulesKey)
		}
	}
}

func (s *Snapshot) invalidate(pe *policyEntry) {
	pe.res = nil
	s.markSelected(pe)
}

func (s *Snapshot) markSelected(pe *policyEntry) {
	for name := range pe.selected {
		s.markDirty(PodKey{pe.key.Namespace, name})
	}
}

func (s *Snapshot) markDirty(k PodKey) {
	delete(s.endpoints, k)
	s.dirty[k] = struct{}{}
}

// TakeDirty returns the pods whose Endpoint may have changed since the last
// call (deleted pods included: Endpoint reports them unknown), sorted, and
// starts a new set. The agent re-applies these of its own pods.
func (s *Snapshot) TakeDirty() []PodKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PodKey, 0, len(s.dirty))
	for k := range s.dirty {
		out = append(out, k)
	}
	clear(s.dirty)
	slices.SortFunc(out, comparePodKey)
	return out
}

func comparePodKey(a, b PodKey) int {
	if a.Namespace != b.Namespace {
		if a.Namespace < b.Namespace {
			return -1
		}
		return 1
	}
	if a.Name < b.Name {
		return -1
	} else if a.Name > b.Name {
		return 1
	}
	return 0
}

// Endpoint is the compiled policy of a pod; false when the snapshot does not
// know the pod (the agent then keeps the interface closed). A host-network
// pod is never isolated. The result is shared with the cache: read it, do
// not modify it (pods compiled alike share it too).
func (s *Snapshot) Endpoint(namespace, name string) (policy.Endpoint, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pod := s.pods[namespace][name]
	if pod == nil {
		return policy.Endpoint{}, false
	}
	k := PodKey{namespace, name}
	if ep, ok := s.endpoints[k]; ok {
		return ep, true
	}
	ep := s.compile(pod)
	s.endpoints[k] = ep
	return ep, true
}

// namedOn resolves named ports on a pod's container ports (name and
// protocol both must match).
func namedOn(pod *Pod, named []namedPort) portSet {
	var r []policy.PortRange
	for _, n := range named {
		for _, cp := range pod.Ports {
			if cp.Name == n.name && cp.Proto == n.proto {
				r = append(r, policy.PortRange{Proto: cp.Proto, First: cp.Port, Last: cp.Port})
			}
		}
	}
	return portSet{ranges: normalize(r)}
}

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

var everywhere = []atom{
	{prefix: netip.MustParsePrefix("0.0.0.0/0")},
	{prefix: netip.MustParsePrefix("::/0")},
}

// resolve returns pe's rules with peers as addresses, computing them if a
// change made them stale.
func (s *Snapshot) resolve(pe *policyEntry) *resolved {
	if pe.res != nil {
		return pe.res
	}
	var others map[*policyEntry]struct{}
	if pe.group != nil {
		others = pe.group.members
	}
	for o := range others {
		if o.res != nil {
			pe.res = o.res
			return o.res
		}
	}
	res := &resolved{}
	for _, r := range pe.inRules {
		res.in = append(res.in, s.resolveRule(pe.parsedPolicy, r, false))
	}
	for _, r := range pe.egRules {
		res.eg = append(res.eg, s.resolveRule(pe.parsedPolicy, r, true))
	}
	pe.res = res
	return res
}

func (s *Snapshot) resolveRule(p *parsedPolicy, r parsedRule, egress bool) resolvedRule {
	var peers []atom
	// Egress named ports resolve on each destination pod: one entry per
	// address of each peer pod that has the port.
	var namedPods []podAddr
	wantPods := egress && len(r.named) > 0
	if r.anyPeer {
		peers = append(peers, everywhere...)
		if wantPods {
			for _, byName := range s.pods {
				for _, pod := range byName {
					namedPods = appendPodAddrs(namedPods, pod, nil)
				}
			}
		}
	}
	for _, pe := range r.peers {
		if pe.block != nil {
			peers = append(peers, atom{prefix: pe.block.cidr, except: pe.block.except})
			if wantPods {
				for _, byName := range s.pods {
					for _, pod := range byName {
						namedPods = appendPodAddrs(namedPods, pod, pe.block)
					}
				}
			}
			continue
		}
		visit := func(pod *Pod) {
			if !s.selects(p, pe, pod) {
				return
			}
			for _, a := range pod.IPs {
				peers = append(peers, atom{prefix: hostPrefix(a)})
			}
			if wantPods {
				namedPods = appendPodAddrs(namedPods, pod, nil)
			}
		}
		if pe.nsSel == nil {
			for _, pod := range s.pods[p.key.Namespace] {
				visit(pod)
			}
			continue
		}
		for ns, byName := range s.pods {
			if !pe.nsSel.Matches(s.nsLabels(ns)) {
				continue
			}
			for _, pod := range byName {
				visit(pod)
			}
		}
	}
	var rr resolvedRule
	if !r.numeric.empty() {
		rr.atoms = make([]atom, 0, len(peers))
		for _, a := range peers {
			a.ports = r.numeric
			rr.atoms = append(rr.atoms, a)
		}
	}
	if len(r.named) == 0 {
		return rr
	}
	if !egress {
		rr.peers, rr.named = peers, r.named
		return rr
	}
	for _, pa := range namedPods {
		if ps := namedOn(pa.pod, r.named); !ps.empty() {
			rr.atoms = append(rr.atoms, atom{prefix: hostPrefix(pa.addr), ports: ps})
		}
	}
	return rr
}

type podAddr struct {
	pod  *Pod
	addr netip.Addr
}

// appendPodAddrs adds pod's addresses (those in block, if set); host-network
// pods are the node, never a peer pod.
func appendPodAddrs(out []podAddr, pod *Pod, block *ipBlock) []podAddr {
	if pod.HostNetwork {
		return out
	}
	for _, a := range pod.IPs {
		if block == nil || block.contains(a) {
			out = append(out, podAddr{pod, a})
		}
	}
	return out
}
