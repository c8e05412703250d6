package compile

import (
	"slices"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// compilePerPod is the compiler before the pods shared their work: every
// atom of every policy selecting the pod, flattened together for this pod
// alone. It is the oracle of TestSharedMatchesPerPod and the "before" of
// BenchmarkCompileNodeChange. Callers hold s.mu.
func (s *Snapshot) compilePerPod(pod *Pod) policy.Endpoint {
	var ep policy.Endpoint
	if pod.HostNetwork {
		return ep
	}
	var in, eg []atom
	for name, pe := range s.policies[pod.Namespace] {
		if !pe.podSel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		ep.Policies = append(ep.Policies, pod.Namespace+"/"+name)
		res := s.resolve(pe)
		if pe.ingress {
			ep.Ingress.Isolated = true
			in = append(in, res.ingressAtoms(pod)...)
		}
		if pe.egress {
			ep.Egress.Isolated = true
			for _, rr := range res.eg {
				eg = append(eg, rr.atoms...)
			}
		}
	}
	slices.Sort(ep.Policies)
	ep.Ingress.Allows = flatten(in)
	ep.Egress.Allows = flatten(eg)
	return ep
}

// endpointPerPod is Endpoint computed by compilePerPod, uncached.
func (s *Snapshot) endpointPerPod(namespace, name string) (policy.Endpoint, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pod := s.pods[namespace][name]
	if pod == nil {
		return policy.Endpoint{}, false
	}
	return s.compilePerPod(pod), true
}
