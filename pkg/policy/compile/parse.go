package compile

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// parsedPolicy is a NetworkPolicy with its selectors and addresses parsed
// once, when it is stored.
type parsedPolicy struct {
	key              PodKey
	podSel           labels.Selector
	ingress, egress  bool // the policy types: the directions it isolates
	inRules, egRules []parsedRule
	// rulesKey is the namespace and the rules as parsed from: policies
	// with equal keys resolve to equal peers (see Snapshot.resolve).
	rulesKey string
}

type parsedRule struct {
	anyPeer bool // from/to empty: every address
	peers   []parsedPeer
	anyPort bool // ports empty: every protocol and port
	numeric portSet
	named   []namedPort
}

// parsedPeer is one NetworkPolicyPeer: an ipBlock, or pods chosen by
// selectors. A selector left nil is not set; a peer with nothing set (or
// something unparsable) matches nothing.
type parsedPeer struct {
	block  *ipBlock
	podSel labels.Selector // nil: every pod of the chosen namespaces
	nsSel  labels.Selector // nil: the policy's own namespace
}

type ipBlock struct {
	cidr   netip.Prefix
	except []netip.Prefix
}

type namedPort struct {
	name  string
	proto uint8
}

// parsePolicy reads np. Parts the API server would have rejected compile
// closed: an unparsable peer matches nothing, an unparsable port allows
// nothing, and an unparsable podSelector selects every pod of the namespace
// (isolating them, allowing nothing through this policy). The error lists
// them; the policy is usable either way.
func parsePolicy(np *networkingv1.NetworkPolicy) (*parsedPolicy, error) {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	p := &parsedPolicy{key: PodKey{np.Namespace, np.Name}}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	badSel := err != nil
	if badSel {
		bad("spec.podSelector: %v", err)
		sel = labels.Everything()
	}
	p.podSel = sel
	if len(np.Spec.PolicyTypes) == 0 {
		// The API's default: Ingress always, Egress when it has rules.
		p.ingress = true
		p.egress = len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			p.ingress = true
		case networkingv1.PolicyTypeEgress:
			p.egress = true
		default:
			bad("spec.policyTypes: unknown %q", t)
		}
	}
	if p.ingress {
		for i, r := range np.Spec.Ingress {
			p.inRules = append(p.inRules, parseRule(r.From, r.Ports, func(format string, a ...any) {
				bad("spec.ingress[%d]: %s", i, fmt.Sprintf(format, a...))
			}))
		}
	}
	if p.egress {
		for i, r := range np.Spec.Egress {
			p.egRules = append(p.egRules, parseRule(r.To, r.Ports, func(format string, a ...any) {
				bad("spec.egress[%d]: %s", i, fmt.Sprintf(format, a...))
			}))
		}
	}
	in, eg := np.Spec.Ingress, np.Spec.Egress
	if !p.ingress {
		in = nil
	}
	if !p.egress {
		eg = nil
	}
	if badSel {
		// Whom it selects is unknown: isolate the whole namespace, allow
		// nothing through this policy.
		p.inRules, p.egRules = nil, nil
		in, eg = nil, nil
	}
	p.rulesKey = rulesKey(np.Namespace, in, eg)
	if len(errs) > 0 {
		return p, fmt.Errorf("networkpolicy %s: %w", p.key, errors.Join(errs...))
	}
	return p, nil
}

// rulesKey is namespace and the rules in a form equal for equal rules
// (JSON: struct fields in order, map keys sorted).
func rulesKey(namespace string, in []networkingv1.NetworkPolicyIngressRule, eg []networkingv1.NetworkPolicyEgressRule) string {
	b, err := json.Marshal(struct {
		In []networkingv1.NetworkPolicyIngressRule
		Eg []networkingv1.NetworkPolicyEgressRule
	}{in, eg})
	if err != nil {
		return "" // never for these types; "" shares nothing
	}
	return namespace + "\x00" + string(b)
}

func parseRule(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, bad func(string, ...any)) parsedRule {
	var r parsedRule
	r.anyPeer = len(peers) == 0
	for i, pe := range peers {
		if pp, ok := parsePeer(pe, func(format string, a ...any) {
			bad("peer %d: %s", i, fmt.Sprintf(format, a...))
		}); ok {
			r.peers = append(r.peers, pp)
		}
	}
	r.anyPort = len(ports) == 0
	var ranges []policy.PortRange
	for i, po := range ports {
		proto := policy.ProtoTCP
		if po.Protocol != nil {
			n, ok := protoNumber(*po.Protocol)
			if !ok {
				bad("ports[%d]: unknown protocol %q", i, *po.Protocol)
				continue
			}
			proto = n
		}
		switch {
		case po.Port == nil:
			ranges = append(ranges, policy.PortRange{Proto: proto, First: 0, Last: 65535})
		case po.Port.Type == intstr.String:
			if po.Port.StrVal == "" || po.EndPort != nil {
				bad("ports[%d]: named port %q with endPort or empty", i, po.Port.StrVal)
				continue
			}
			r.named = append(r.named, namedPort{name: po.Port.StrVal, proto: proto})
		default:
			first, last := po.Port.IntVal, po.Port.IntVal
			if po.EndPort != nil {
				last = *po.EndPort
			}
			if first < 1 || last > 65535 || last < first {
				bad("ports[%d]: port %d endPort %d out of range", i, first, last)
				continue
			}
			ranges = append(ranges, policy.PortRange{Proto: proto, First: uint16(first), Last: uint16(last)})
		}
	}
	if r.anyPort {
		r.numeric = allPorts
	} else {
		r.numeric = portSet{ranges: normalize(ranges)}
	}
	return r
}

func parsePeer(pe networkingv1.NetworkPolicyPeer, bad func(string, ...any)) (parsedPeer, bool) {
	var pp parsedPeer
	if pe.IPBlock != nil {
		if pe.PodSelector != nil || pe.NamespaceSelector != nil {
			bad("ipBlock with a selector")
			return pp, false
		}
		cidr, err := netip.ParsePrefix(pe.IPBlock.CIDR)
		if err != nil {
			bad("ipBlock.cidr: %v", err)
			return pp, false
		}
		b := &ipBlock{cidr: unmapPrefix(cidr)}
		for _, e := range pe.IPBlock.Except {
			ex, err := netip.ParsePrefix(e)
			if err != nil {
				// Without its hole the block would allow too much.
				bad("ipBlock.except %q: %v", e, err)
				return pp, false
			}
			b.except = append(b.except, unmapPrefix(ex))
		}
		pp.block = b
		return pp, true
	}
	if pe.PodSelector == nil && pe.NamespaceSelector == nil {
		bad("no podSelector, namespaceSelector or ipBlock")
		return pp, false
	}
	if pe.PodSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(pe.PodSelector)
		if err != nil {
			bad("podSelector: %v", err)
			return pp, false
		}
		pp.podSel = s
	}
	if pe.NamespaceSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(pe.NamespaceSelector)
		if err != nil {
			bad("namespaceSelector: %v", err)
			return pp, false
		}
		pp.nsSel = s
	}
	return pp, true
}

// unmapPrefix turns ::ffff:a.b.c.d/n into a.b.c.d/(n-96) so it matches the
// IPv4 addresses packets carry, and masks it.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
	}
	return p.Masked()
}
