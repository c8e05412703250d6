package connectivity

import (
	"context"
	"fmt"

	"github.com/ebpf-cni/ebpf-cni/pkg/nodes"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
)

// client is the few REST calls the check makes, on two API groups. The
// agent has no typed clientset (it would double the binary for these).
type client struct {
	core, netv1 rest.Interface
}

func newClient(cfg *rest.Config) (*client, error) {
	core, err := nodes.RESTClient(cfg, corev1.SchemeGroupVersion, false, "ebpf-agent-connectivity")
	if err != nil {
		return nil, err
	}
	netv1, err := nodes.RESTClient(cfg, networkingv1.SchemeGroupVersion, false, "ebpf-agent-connectivity")
	if err != nil {
		return nil, err
	}
	return &client{core: core, netv1: netv1}, nil
}

func (c *client) rc(resource string) rest.Interface {
	if resource == "networkpolicies" {
		return c.netv1
	}
	return c.core
}

func (c *client) create(ctx context.Context, ns, resource string, in, out runtime.Object) error {
	r := c.rc(resource).Post().Resource(resource).Body(in)
	if ns != "" {
		r = r.Namespace(ns)
	}
	if err := r.Do(ctx).Into(out); err != nil {
		return fmt.Errorf("create %s: %w", resource, err)
	}
	return nil
}

func (c *client) get(ctx context.Context, ns, resource, name string, out runtime.Object) error {
	r := c.rc(resource).Get().Resource(resource).Name(name)
	if ns != "" {
		r = r.Namespace(ns)
	}
	return r.Do(ctx).Into(out)
}

func (c *client) list(ctx context.Context, ns, resource string, out runtime.Object) error {
	r := c.rc(resource).Get().Resource(resource)
	if ns != "" {
		r = r.Namespace(ns)
	}
	return r.Do(ctx).Into(out)
}

func (c *client) delete(ctx context.Context, ns, resource, name string) error {
	r := c.rc(resource).Delete().Resource(resource).Name(name)
	if ns != "" {
		r = r.Namespace(ns)
	}
	return r.Do(ctx).Error()
}
