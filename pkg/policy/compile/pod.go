package compile

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// Pod is what the compiler needs of a pod: small, so the agent keeps no API
// objects alive, and plain, so the agent can fill IPs from its own records
// before the API server reports them.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	// IPs are the pod's addresses; a pod without any (pending, finished) is
	// no peer, but policies still select it.
	IPs []netip.Addr
	// Ports are the containers' ports, for named ports.
	Ports []ContainerPort
	// HostNetwork pods share the node's addresses: never a peer by selector
	// (upstream: their traffic is the node's), never isolated.
	HostNetwork bool
}

// ContainerPort is a container's port as named ports resolve it.
type ContainerPort struct {
	Name  string
	Proto uint8
	Port  uint16
}

// PodKey names a pod (and, for policies, a NetworkPolicy) in the snapshot.
type PodKey struct{ Namespace, Name string }

func (k PodKey) String() string { return k.Namespace + "/" + k.Name }

// PodFromAPI takes what the compiler needs of p. Finished pods (Succeeded,
// Failed) lose their addresses: the IPs may already belong to a new pod.
func PodFromAPI(p *corev1.Pod) Pod {
	out := Pod{
		Namespace:   p.Namespace,
		Name:        p.Name,
		Labels:      p.Labels,
		HostNetwork: p.Spec.HostNetwork,
	}
	if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				out.IPs = append(out.IPs, a.Unmap())
			}
		}
		if len(out.IPs) == 0 && p.Status.PodIP != "" {
			if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
				out.IPs = append(out.IPs, a.Unmap())
			}
		}
	}
	// Restartable init containers (sidecars) serve too.
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			for _, cp := range c.Ports {
				if cp.Name == "" {
					continue
				}
				proto, ok := protoNumber(cp.Protocol)
				if !ok || cp.ContainerPort < 1 || cp.ContainerPort > 65535 {
					continue
				}
				out.Ports = append(out.Ports, ContainerPort{Name: cp.Name, Proto: proto, Port: uint16(cp.ContainerPort)})
			}
		}
	}
	return out
}

// protoNumber maps an API protocol to its IP protocol number; empty is TCP,
// as the API defaults it.
func protoNumber(p corev1.Protocol) (uint8, bool) {
	switch p {
	case "", corev1.ProtocolTCP:
		return policy.ProtoTCP, true
	case corev1.ProtocolUDP:
		return policy.ProtoUDP, true
	case corev1.ProtocolSCTP:
		return policy.ProtoSCTP, true
	}
	return 0, false
}
