package netpol

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-cni/ebpf-cni/pkg/nodes"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy/compile"
)

// apiListWatch lists and watches pods, namespaces or networkpolicies of
// every namespace, protobuf on the wire (a REST client per group, not a
// clientset: the agent stays small).
func apiListWatch(cfg *rest.Config, resource string) (cache.ListerWatcher, error) {
	gv := corev1.SchemeGroupVersion
	if resource == "networkpolicies" {
		gv = networkingv1.SchemeGroupVersion
	}
	rc, err := nodes.RESTClient(cfg, gv, true, "ebpf-agent")
	if err != nil {
		return nil, err
	}
	return cache.NewListWatchFromClient(rc, resource, metav1.NamespaceAll, fields.Everything()), nil
}

// slimPod keeps what the compiler reads (compile.PodFromAPI): every pod of
// the cluster is a possible peer, so the store holds them all.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // cache.DeletedFinalStateUnknown and the like
	}
	out := &corev1.Pod{}
	out.Namespace, out.Name, out.ResourceVersion, out.Labels = p.Namespace, p.Name, p.ResourceVersion, p.Labels
	out.Spec.HostNetwork, out.Spec.NodeName = p.Spec.HostNetwork, p.Spec.NodeName
	out.Status.Phase, out.Status.PodIP, out.Status.PodIPs = p.Status.Phase, p.Status.PodIP, p.Status.PodIPs
	slimContainers := func(cs []corev1.Container) []corev1.Container {
		var out []corev1.Container
		for _, c := range cs {
			if len(c.Ports) > 0 {
				out = append(out, corev1.Container{Name: c.Name, Ports: c.Ports})
			}
		}
		return out
	}
	out.Spec.Containers = slimContainers(p.Spec.Containers)
	out.Spec.InitContainers = slimContainers(p.Spec.InitContainers)
	return out, nil
}

func slimNamespace(obj any) (any, error) {
	n, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	out := &corev1.Namespace{}
	out.Name, out.ResourceVersion, out.Labels = n.Name, n.ResourceVersion, n.Labels
	return out, nil
}

func slimPolicy(obj any) (any, error) {
	np, ok := obj.(*networkingv1.NetworkPolicy)
	if !ok {
		return obj, nil
	}
	out := &networkingv1.NetworkPolicy{Spec: np.Spec}
	out.Namespace, out.Name, out.ResourceVersion = np.Namespace, np.Name, np.ResourceVersion
	return out, nil
}

// feed is what the informers tell the controller: the snapshot is updated
// in the handler (so a compile always sees every event delivered so far),
// then changed is called with the time the event arrived.
type feed struct {
	snap    *compile.Snapshot
	addrs   *podAddrs // pods go through it
	changed func(at time.Time)
	logf    func(string, ...any)
}

// tombstone unwraps a delete whose final state the informer missed.
func tombstone(obj any) any {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return obj
}

func (f *feed) pod(obj any, deleted bool) {
	p, ok := tombstone(obj).(*corev1.Pod)
	if !ok {
		return
	}
	if deleted {
		f.addrs.remove(p.Namespace, p.Name)
	} else {
		f.addrs.upsert(p)
	}
	f.changed(time.Now())
}

func (f *feed) namespace(obj any, deleted bool) {
	n, ok := tombstone(obj).(*corev1.Namespace)
	if !ok {
		return
	}
	if deleted {
		f.snap.DeleteNamespace(n.Name)
	} else {
		f.snap.UpsertNamespace(n.Name, n.Labels)
	}
	f.changed(time.Now())
}

func (f *feed) policy(obj any, deleted bool) {
	np, ok := tombstone(obj).(*networkingv1.NetworkPolicy)
	if !ok {
		return
	}
	if deleted {
		f.snap.DeletePolicy(np.Namespace, np.Name)
	} else if err := f.snap.UpsertPolicy(np); err != nil {
		// Stored anyway, the bad fields compiled closed.
		f.logf("policy: %s/%s: %v", np.Namespace, np.Name, err)
	}
	f.changed(time.Now())
}

// startInformers lists and watches pods, namespaces and NetworkPolicies into
// the snapshot; synced reports when all three have completed a first list.
func startInformers(ctx context.Context, listWatch func(string) (cache.ListerWatcher, error), f *feed) (synced []cache.InformerSynced, err error) {
	type source struct {
		resource string
		obj      runtime.Object
		slim     cache.TransformFunc
		handle   func(any, bool)
	}
	for _, s := range []source{
		{"namespaces", &corev1.Namespace{}, slimNamespace, f.namespace},
		{"pods", &corev1.Pod{}, slimPod, f.pod},
		{"networkpolicies", &networkingv1.NetworkPolicy{}, slimPolicy, f.policy},
	} {
		lw, err := listWatch(s.resource)
		if err != nil {
			return nil, err
		}
		inf := cache.NewSharedIndexInformer(lw, s.obj, 0, cache.Indexers{})
		if err := inf.SetTransform(s.slim); err != nil {
			return nil, err
		}
		resource := s.resource
		if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
			f.logf("policy: list/watch %s: %v (keeping what is programmed; retrying)", resource, err)
		}); err != nil {
			return nil, err
		}
		handle := s.handle
		reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { handle(o, false) },
			UpdateFunc: func(_, o any) { handle(o, false) },
			DeleteFunc: func(o any) { handle(o, true) },
		})
		if err != nil {
			return nil, err
		}
		go inf.Run(ctx.Done())
		// The handler's, not the informer's: synced once the handler has
		// seen every object of the first list. The informer's HasSynced
		// turns true while handlers may still be receiving that list, and
		// a pass then could find a pod but not yet the policy selecting it
		// (and open it).
		synced = append(synced, reg.HasSynced)
	}
	return synced, nil
}
