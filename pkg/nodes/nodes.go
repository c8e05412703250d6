// Package nodes follows the cluster's Node objects through a client-go
// informer and hands the agent what a node needs from them: its own pod
// CIDRs and every node's internal addresses and pod CIDRs. Only the agent
// imports it, so the plugin binary carries no Kubernetes client.
//
// It uses a REST client for core/v1 alone (not the generated clientset,
// which would register every API group in the agent binary) and keeps only
// the fields it reads of each Node in the informer's store.
package nodes

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ebpf-cni/ebpf-cni/pkg/kubewatch"
)

// Node is what the agent reads of a Node object.
type Node struct {
	Name        string
	InternalIPs []netip.Addr   // .status.addresses of type InternalIP (one per family on dual-stack nodes)
	PodCIDRs    []netip.Prefix // .spec.podCIDRs (.spec.podCIDR on old objects)
}

// View is the cluster as the informer last saw it.
type View struct {
	Self  *Node  // this node; nil while it has no Node object
	Nodes []Node // every node, this one included, sorted by name
}

// Config is the client configuration: the kubeconfig file when one is
// given, else the pod's in-cluster service account.
func Config(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return c, nil
	}
	c, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster config (give --kubeconfig outside a pod): %w", err)
	}
	return c, nil
}

// listWatch lists and watches all Nodes, protobuf on the wire.
func listWatch(cfg *rest.Config) (cache.ListerWatcher, error) {
	rc, err := RESTClient(cfg, corev1.SchemeGroupVersion, true, "ebpf-agent")
	if err != nil {
		return nil, err
	}
	return cache.NewListWatchFromClient(rc, "nodes", metav1.NamespaceAll, fields.Everything()), nil
}

// slim keeps the fields Node reads: on a large cluster the store holds
// every Node, and most of a Node object (images, conditions, managed
// fields) is of no use here.
func slim(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // cache.DeletedFinalStateUnknown and the like
	}
	out := &corev1.Node{}
	out.Name, out.ResourceVersion = n.Name, n.ResourceVersion
	out.Spec.PodCIDR, out.Spec.PodCIDRs = n.Spec.PodCIDR, n.Spec.PodCIDRs
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			out.Status.Addresses = append(out.Status.Addresses, a)
		}
	}
	return out, nil
}

// fromObject reads a Node; values that do not parse are reported and left
// out (the API server validates both fields, so this is defensive).
func fromObject(n *corev1.Node, logf func(string, ...any)) Node {
	out := Node{Name: n.Name}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			logf("node %s: spec.podCIDRs: %q is not a CIDR; ignored", n.Name, c)
			continue
		}
		if p.Bits() == 0 {
			// Every destination would be this node's pods: no traffic
			// to the outside would be masqueraded (agent.checkPodCIDRs).
			logf("node %s: spec.podCIDRs: %q is a default route, not a node's pod CIDR; ignored", n.Name, c)
			continue
		}
		out.PodCIDRs = append(out.PodCIDRs, p.Masked())
	}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			logf("node %s: status.addresses: InternalIP %q is not an IP address; ignored", n.Name, a.Address)
			continue
		}
		out.InternalIPs = append(out.InternalIPs, ip.Unmap())
	}
	return out
}

// Follow lists and watches the Nodes until ctx ends. It calls update with
// the whole view once the first list is complete and after every change
// (changes within settle of each other are coalesced into one call). It
// never calls update before a complete list, and keeps the last view while
// the API server is unreachable (the informer retries with backoff and
// relists when it is back), so a caller that acts only on views never
// undoes working state because the API server went away.
func Follow(ctx context.Context, cfg *rest.Config, self string, settle time.Duration, update func(View), logf func(string, ...any)) error {
	lw, err := listWatch(cfg)
	if err != nil {
		return err
	}
	lw = kubewatch.Bounded(lw, kubewatch.DefaultIdle, func(what string, d time.Duration) {
		logf("nodes: watch: no %s in %s; watching again", what, d)
	})
	inf := cache.NewSharedIndexInformer(lw, &corev1.Node{}, 0, cache.Indexers{})
	if err := inf.SetTransform(slim); err != nil {
		return err
	}
	if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		logf("nodes: list/watch: %v (keeping the last view; retrying)", err)
	}); err != nil {
		return err
	}
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    poke,
		UpdateFunc: func(_, n any) { poke(n) },
		DeleteFunc: poke,
	}); err != nil {
		return err
	}
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	for {
		update(snapshot(inf.GetStore(), self, logf))
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(settle):
		}
	}
}

// List lists the Nodes once: the view Follow's first update gives, for a
// caller that needs it before it starts following (the agent, before it
// swaps the programs).
func List(ctx context.Context, cfg *rest.Config, self string, logf func(string, ...any)) (View, error) {
	rc, err := RESTClient(cfg, corev1.SchemeGroupVersion, true, "ebpf-agent")
	if err != nil {
		return View{}, err
	}
	var l corev1.NodeList
	if err := rc.Get().Resource("nodes").Do(ctx).Into(&l); err != nil {
		return View{}, fmt.Errorf("list nodes: %w", err)
	}
	var objs []any
	for i := range l.Items {
		objs = append(objs, &l.Items[i])
	}
	return viewOf(objs, self, logf), nil
}

func snapshot(s cache.Store, self string, logf func(string, ...any)) View {
	return viewOf(s.List(), self, logf)
}

func viewOf(objs []any, self string, logf func(string, ...any)) View {
	v := View{}
	for _, o := range objs {
		if n, ok := o.(*corev1.Node); ok {
			v.Nodes = append(v.Nodes, fromObject(n, logf))
		}
	}
	sort.Slice(v.Nodes, func(i, j int) bool { return v.Nodes[i].Name < v.Nodes[j].Name })
	for i := range v.Nodes {
		if v.Nodes[i].Name == self {
			n := v.Nodes[i]
			v.Self = &n
		}
	}
	return v
}
